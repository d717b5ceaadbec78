"""The OpenAPI document and the code agree (spec "Wire format"): routes, and schemathesis."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from jsonschema import Draft202012Validator
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api import bodies
from app.api.openapi import NOT_DESCRIBED, document
from app.extensions import db
from app.timeutil import isoformat, parse_rfc3339, utcnow
from tests.support import OPERATOR_KEY, factories
from tests.support.acceptance import inspect_text, png
from tests.support.bodies import (
    WRONG_API_KEYS,
    WRONG_BENCHMARK_RESULTS,
    WRONG_ENROLLS,
    WRONG_HEARTBEATS,
    WRONG_INVENTORIES,
    WRONG_JOB_BODIES,
)
from tests.support.runtime import benchmark_result

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
    assert documented == registered - set(NOT_DESCRIBED)
    assert set(NOT_DESCRIBED) <= registered  # each route it leaves out exists


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
# A body the document accepts may still meet a state it cannot describe — an unknown credential
# or token (401/404), a disabled node (403), a spent or expired token (409/410), another protocol
# version (426, A1) — but never a 400, 413 or 415: those would mean the document is looser than
# the validator.
ACCEPTANCES = ["2xx", "401", "403", "404", "409", "410", "426"]


def within_the_rules_in_words(case) -> None:
    """Keep a well-formed body inside the rules the document can state only in words.

    A telemetry sample's time must lie between 2020 and a few minutes past the server's clock, and
    an inventory lists each GPU UUID once; no static schema says either, so a body generated as
    valid has its in-range RFC 3339 times moved to now and its repeated GPUs dropped. Malformed
    values and negative cases are sent exactly as generated.
    """
    body = case.body
    if case.meta is None or not case.meta.generation.mode.is_positive or not isinstance(body, dict):
        return
    # A screenshot is checked by its bytes, a pasted inspect by its JSON: the document says so in words.
    if case.operation.path.endswith("/acceptance/screenshots") and "file" in body:
        body["file"] = png()
    if case.operation.path.endswith("/acceptance/container-status") and "inspect" in body:
        body["inspect"] = inspect_text()
    for sample in body.get("telemetry") or []:
        if isinstance(sample, dict) and isinstance(sample.get("sampled_at"), str):
            if parse_rfc3339(sample["sampled_at"]) is not None:
                sample["sampled_at"] = isoformat(utcnow())
    inventory = body.get("inventory")
    if isinstance(inventory, dict) and isinstance(inventory.get("gpus"), list):
        seen: set[str] = set()
        kept = []
        for gpu in inventory["gpus"]:
            uuid = gpu.get("uuid") if isinstance(gpu, dict) else None
            if uuid not in seen:
                kept.append(gpu)
            if isinstance(uuid, str):
                seen.add(uuid)
        inventory["gpus"] = kept


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
            "checks": {
                "negative_data_rejection": {"expected-statuses": REJECTIONS},
                "positive_data_acceptance": {"expected-statuses": ACCEPTANCES},
            },
        }
    )
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", fuzz_app, config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


# A property test: about 100 s of the unit tier on two cores. `make test` runs it; the inner loop
# (`make test-fast`) leaves `slow` tests out.
@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_api_conforms_to_its_document(case):
    """No 5xx; responses match the document; it refuses what the code refuses and accepts what it accepts."""
    within_the_rules_in_words(case)
    case.call_and_validate(
        # Over WSGI nothing undoes Content-Encoding (an HTTP client would): read the JSON as sent.
        headers={"Accept-Encoding": "identity"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            negative_data_rejection,
            positive_data_acceptance,
        ],
    )


def test_every_link_opens_a_documented_operation_with_its_path_parameters():
    """Issue 22: the links that let a stateful client reach storage roots and jobs name real operations."""
    paths = document()["paths"]
    linked = set()
    for path, item in paths.items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            for status, reply in operation["responses"].items():
                for name, link in reply.get("links", {}).items():
                    target_path, _, target_method = link["operationRef"].removeprefix("#/paths/").rpartition("/")
                    target_path = target_path.replace("~1", "/").replace("~0", "~")
                    assert target_method in paths.get(target_path, {}), (path, status, name)
                    wanted = {parameter["name"] for parameter in paths[target_path].get("parameters", [])}
                    assert set(link.get("parameters", {})) == wanted, (path, status, name)
                    linked.add(target_path)
    assert {"/api/v1/admin/jobs/{job_id}", "/api/v1/admin/storage-roots/{root_id}", "/api/v1/admin/jobs"} <= linked


# The stateful walk: the links chain mint → claim → storage root → job → cancel/retry/delete, every
# check schemathesis has (stateful ones included) on every step. About 60 s on two cores.
@pytest.mark.slow
def test_the_api_walked_through_its_links_answers_no_5xx_and_as_documented(api_schema, fuzz_app):
    class Walk(api_schema.as_state_machine()):
        def before_call(self, case) -> None:
            within_the_rules_in_words(case)

        def teardown(self) -> None:
            # Each walk starts from an empty database, so hypothesis sees the same API for the same draws.
            with fuzz_app.app_context():
                for table in reversed(db.metadata.sorted_tables):
                    db.session.execute(table.delete())
                db.session.commit()

    run_state_machine_as_test(
        Walk,
        settings=settings(
            max_examples=80,
            stateful_step_count=10,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        ),
    )


def _refuses(schema_name: str, body: dict) -> bool:
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": document()["components"]}
    validator = Draft202012Validator(root, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return not validator.is_valid(body)


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.items() for text in _strings(list(item))]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def stated_in_words(body: dict) -> str | None:
    """Which rule the code enforces and the document states only in words, if `body` breaks one.

    No static schema can say that a sample's time may be at most minutes ahead of the server's
    clock, or that GPU UUIDs are unique within an inventory; and no portable pattern can name a
    lone surrogate (Rust's regex and RE2 cannot), which is not Unicode text at all.
    """
    if any(0xD800 <= ord(char) <= 0xDFFF for text in _strings(body) for char in text):
        return "lone surrogate"
    for sample in body.get("telemetry") or []:
        sampled_at = sample.get("sampled_at") if isinstance(sample, dict) else None
        if isinstance(sampled_at, str) and re.search(bodies.RFC3339_PATTERN, sampled_at):
            moment = parse_rfc3339(sampled_at)  # None: past the year 9999 once made UTC
            if moment is None or moment > utcnow():
                return "clock"
    gpus = (body.get("inventory") or {}).get("gpus")
    if isinstance(gpus, list) and all(isinstance(gpu, dict) for gpu in gpus):
        if len({gpu.get("uuid") for gpu in gpus}) != len(gpus):
            return "once"
    return None


def assert_the_document_refuses_what_the_code_refuses(schema_name: str, body: dict) -> None:
    rule = stated_in_words(body)
    if rule is None:
        assert _refuses(schema_name, body)
    else:
        assert not _refuses(schema_name, body)
        assert rule in json.dumps(document()), f"the document does not state the {rule} rule"


@pytest.mark.parametrize(("change", "field"), WRONG_HEARTBEATS)
def test_the_document_refuses_every_heartbeat_the_code_refuses(change, field):
    assert_the_document_refuses_what_the_code_refuses("HeartbeatRequest", {**factories.heartbeat_body(), **change})


@pytest.mark.parametrize(("change", "field"), WRONG_INVENTORIES)
def test_the_document_refuses_every_inventory_the_code_refuses(change, field):
    assert_the_document_refuses_what_the_code_refuses("InventoryRequest", {**factories.inventory_body(), **change})


@pytest.mark.parametrize(("change", "field"), WRONG_ENROLLS)
def test_the_document_refuses_every_enrol_claim_the_code_refuses(change, field):
    body = {**factories.enroll_body("mfe_" + "a" * 43), **change}
    assert_the_document_refuses_what_the_code_refuses("EnrollRequest", body)


@pytest.mark.parametrize(("body", "field"), WRONG_API_KEYS)
def test_the_document_refuses_every_api_key_the_code_refuses(body, field):
    assert_the_document_refuses_what_the_code_refuses("ApiKeyCreate", body)


@pytest.mark.parametrize(("job_type", "params", "field"), WRONG_JOB_BODIES)
def test_the_document_refuses_every_job_the_code_refuses(job_type, params, field):
    body = {"node_id": str(uuid.uuid4()), "params": {"artifact_id": str(uuid.uuid4()), **params}}
    if job_type is not None:
        body["type"] = job_type
    assert_the_document_refuses_what_the_code_refuses("JobCreate", body)


@pytest.mark.parametrize(("change", "field"), [case for case in WRONG_BENCHMARK_RESULTS if isinstance(case[0], dict)])
def test_the_document_refuses_every_benchmark_result_the_code_refuses(change, field):
    result = benchmark_result(str(uuid.uuid4()), **change)
    if any(value == float("inf") for value in change.values()):
        return  # JSON has no infinity to write into a document check; the code test sends 1e400
    assert _refuses("BenchmarkResult", result)


def test_the_document_names_each_job_types_params():
    job_create = document()["components"]["schemas"]["JobCreate"]
    assert job_create["discriminator"]["propertyName"] == "type"
    assert set(job_create["discriminator"]["mapping"]) == {
        "artifact.acquire.v1",
        "runtime.benchmark.v1",
        "runtime.generate.v1",
        "artifact.delete.v1",
    }
    result = document()["components"]["schemas"]["CompleteRequest"]["properties"]["result"]
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in result["anyOf"]} == {
        "AcquireResult",
        "BenchmarkResult",
        "GenerateResult",
        "DeleteResult",
    }


# A1: a value of every JSON type, and whole numbers no agent speaks, with the answer each gets.
UNSUPPORTED_PROTOCOL_VERSIONS = [
    ("1", "UNKNOWN"),
    (1.5, "UNKNOWN"),
    (None, "UNKNOWN"),
    (True, "UNKNOWN"),
    ([1], "UNKNOWN"),
    ({"version": 1}, "UNKNOWN"),
    (2**63, "UNKNOWN"),
    (0, "TOO_OLD"),
    (2, "TOO_NEW"),
]


def _agent_json_operations() -> list[tuple[str, dict]]:
    """Every agent operation that takes a JSON body, its path made concrete."""
    return [
        (re.sub(r"\{[a-z_]+_id\}", str(uuid.uuid4()), path), item["post"])
        for path, item in document()["paths"].items()
        if path.startswith("/api/v1/agent/") and "application/json" in item["post"]["requestBody"]["content"]
    ]


def _component(schema: dict) -> dict:
    """The component schema a reference names, or the schema itself."""
    return document()["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]] if "$ref" in schema else schema


@pytest.mark.parametrize(("protocol_version", "answer"), UNSUPPORTED_PROTOCOL_VERSIONS)
def test_any_protocol_version_is_answered_426_with_compatibility_as_documented(client, protocol_version, answer):
    """A1: no protocol_version is malformed (400): the document admits any, and its 426 carries the answer."""
    credential = factories.enrolled_node(client)["credential"]
    components = document()["components"]
    for path, operation in _agent_json_operations():
        body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
        field = {"$ref": body_schema["$ref"] + "/properties/protocol_version", "components": components}
        assert Draft202012Validator(field).is_valid(protocol_version), (path, "the document refuses it")
        refusal = _component(operation["responses"]["426"]["content"]["application/json"]["schema"])
        assert "compatibility" in refusal.get("required", []), (path, "the documented 426 may lack compatibility")

        sent = {**factories.versions(protocol_version), "capabilities": []}
        response = client.post(path, json=sent, headers={"Authorization": f"Bearer {credential}"})
        assert response.status_code == 426, path
        assert response.get_json()["compatibility"]["protocol_version"] == protocol_version
        assert response.get_json()["compatibility"]["answer"] == answer
