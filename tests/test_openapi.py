"""The OpenAPI document and the code agree (spec "Wire format"): routes, and schemathesis."""

from __future__ import annotations

import re

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.openapi import document
from tests import factories
from tests.support import OPERATOR_KEY

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


def test_document_is_openapi_3_1_and_served(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    served = response.get_json()
    assert served["openapi"].startswith("3.1")
    assert served == document()


def test_document_paths_match_the_registered_routes(app):
    registered = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("console."):
            continue  # the HTML console is not part of the JSON API
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        registered |= {(path, method.lower()) for method in rule.methods - {"HEAD", "OPTIONS"}}
    documented = {
        (path, method) for path, item in document()["paths"].items() for method in item if method in HTTP_METHODS
    }
    assert documented == registered


def test_every_operation_documents_its_errors_and_auth():
    for path, item in document()["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            if path.startswith("/api/v1/admin") or path.startswith("/api/v1/hardware"):
                assert operation["security"] == [{"adminToken": []}], path
            if path in {"/api/v1/agent/inventory", "/api/v1/agent/heartbeat"}:
                assert operation["security"] == [{"nodeCredential": []}], path
            if path != "/api/v1/openapi.json":
                assert "default" in operation["responses"], path


@pytest.fixture
def fuzz_app(sqlite_app):
    """A SQLite control plane with one enrolled node whose credential the fuzzer may use."""
    node = factories.enrolled_node(sqlite_app.test_client())
    sqlite_app.config["FUZZ_CREDENTIAL"] = node["credential"]
    return sqlite_app


# A 426 (protocol refused) and a 410 (token gone) are rejections too.
REJECTIONS = ["400", "401", "403", "404", "405", "409", "410", "413", "415", "426"]


@pytest.fixture
def api_schema(fuzz_app):
    # Schemathesis applies the credentials itself, so its negative cases may also omit or
    # spoil them (a header override from the test would mask those).
    config = SchemathesisConfig.from_dict(
        {
            "auth": {
                "openapi": {
                    "adminToken": {"api_key": OPERATOR_KEY},
                    "nodeCredential": {"bearer": fuzz_app.config["FUZZ_CREDENTIAL"]},
                }
            },
            "checks": {"negative_data_rejection": {"expected-statuses": REJECTIONS}},
        }
    )
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", fuzz_app, config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_api_conforms_to_its_document(case):
    """No 5xx, and every response matches the documented status codes, content type and schema."""
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            negative_data_rejection,
        ],
    )
