"""Hostile input gets a clear 4xx JSON error, never a 500, and loses nothing (P5, A5)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent, Enrollment, NodeInventory, NodeLease, TelemetrySample
from tests.support import ADMIN, factories
from tests.support.bodies import WRONG_ENROLLS, WRONG_HEARTBEATS, WRONG_INVENTORIES

HUGE = "x" * (300 * 1024)
NESTED = "[" * 100_000 + "]" * 100_000

RAW_BODIES = [
    pytest.param(b"", "application/json", 400, id="empty"),
    pytest.param(b'{"protocol_version": 1, "agent_', "application/json", 400, id="truncated"),
    pytest.param(b"[1, 2, 3]", "application/json", 400, id="array"),
    pytest.param(b'"just a string"', "application/json", 400, id="string"),
    pytest.param(b"null", "application/json", 400, id="null"),
    pytest.param(b"\xff\xfe\x00binary\x00", "application/json", 400, id="binary"),
    pytest.param(b'{"a": NaN}', "application/json", 400, id="nan"),
    pytest.param(b'{"a": 1' + b"0" * 5000 + b"}", "application/json", 400, id="huge-int"),
    pytest.param(NESTED.encode(), "application/json", 400, id="deeply-nested"),
    pytest.param(json.dumps({"pad": HUGE}).encode(), "application/json", 413, id="huge"),
    pytest.param(b"display_name=x", "application/x-www-form-urlencoded", 415, id="form"),
    pytest.param(b"{}", "text/plain", 415, id="text-plain"),
]


def assert_error(response, status):
    assert response.status_code == status, response.data[:300]
    assert response.mimetype == "application/json"
    error = response.get_json()["error"]
    assert error["code"].isupper() and error["message"] and error["next_step"]
    return error


def snapshot(app):
    """Everything a bad request could have damaged."""
    with app.app_context():
        return {
            model.__tablename__: db.session.execute(sa.select(sa.func.count()).select_from(model)).scalar_one()
            for model in (Enrollment, NodeInventory, TelemetrySample, AuditEvent)
        } | {
            "lease": [
                (lease.last_heartbeat_at, lease.health_status) for lease in db.session.scalars(sa.select(NodeLease))
            ]
        }


@pytest.fixture
def enrolled(client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    assert client.post("/api/v1/agent/inventory", json=factories.inventory_body(), headers=auth).status_code == 200
    assert client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=auth).status_code == 200
    return node


@pytest.mark.parametrize(("raw", "content_type", "status"), RAW_BODIES)
@pytest.mark.parametrize("path", ["/api/v1/agent/heartbeat", "/api/v1/agent/inventory", "/api/v1/agent/enroll"])
def test_malformed_agent_bodies(app, client, enrolled, path, raw, content_type, status):
    before = snapshot(app)
    response = client.post(
        path, data=raw, headers={"Content-Type": content_type, **factories.bearer(enrolled["credential"])}
    )
    assert_error(response, status)
    assert enrolled["credential"] not in response.get_data(as_text=True)
    assert snapshot(app) == before


@pytest.mark.parametrize(("raw", "content_type", "status"), RAW_BODIES)
def test_malformed_admin_bodies(app, client, raw, content_type, status):
    response = client.post("/api/v1/admin/node-enrollments", data=raw, headers={"Content-Type": content_type, **ADMIN})
    assert_error(response, status)
    assert snapshot(app)["enrollments"] == 0


@pytest.mark.parametrize(("change", "field"), WRONG_HEARTBEATS)
def test_wrong_heartbeat_fields_are_named(app, client, enrolled, change, field):
    before = snapshot(app)
    body = {**factories.heartbeat_body(), **change}
    response = client.post("/api/v1/agent/heartbeat", json=body, headers=factories.bearer(enrolled["credential"]))
    error = assert_error(response, 400)
    assert (error["code"], error["field"]) == ("VALIDATION_FAILED", field)
    assert snapshot(app) == before


@pytest.mark.parametrize(("change", "field"), WRONG_INVENTORIES)
def test_wrong_inventory_fields_are_named(app, client, enrolled, change, field):
    before = snapshot(app)
    body = {**factories.inventory_body(), **change}
    response = client.post("/api/v1/agent/inventory", json=body, headers=factories.bearer(enrolled["credential"]))
    error = assert_error(response, 400)
    assert (error["code"], error["field"]) == ("VALIDATION_FAILED", field)
    assert snapshot(app) == before


@pytest.mark.parametrize(("change", "field"), WRONG_ENROLLS)
def test_wrong_enroll_fields_are_named_and_do_not_spend_the_token(app, client, change, field):
    token = factories.mint(client)["token"]
    response = client.post("/api/v1/agent/enroll", json={**factories.enroll_body(token), **change})
    error = assert_error(response, 400)
    assert error["field"] == field
    assert token not in response.get_data(as_text=True)
    assert client.post("/api/v1/agent/enroll", json=factories.enroll_body(token)).status_code == 201


@pytest.mark.parametrize(
    "header",
    ["", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer mfn_" + "\u00e9" * 10, "Bearer " + "a" * 5000],
)
def test_bad_authorization_headers(app, client, enrolled, header):
    before = snapshot(app)
    response = client.post(
        "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers={"Authorization": header}
    )
    assert_error(response, 401)
    assert snapshot(app) == before


def test_unknown_paths_and_methods_are_json(client):
    assert_error(client.get("/api/v1/nope"), 404)
    response = client.get("/api/v1/agent/heartbeat")
    assert_error(response, 405)
    assert "POST" in response.headers["Allow"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/v1/hardware/nodes/%00", 404),
        ("GET", "/api/v1/admin/nodes/not-a-uuid/readiness", 404),
        ("GET", "/api/v1/admin/node-enrollments/%00/readiness", 404),
        ("POST", "/api/v1/admin/nodes/%00/disable", 404),
        ("POST", "/api/v1/admin/nodes/x%00/credential/rotate", 404),
        ("POST", "/api/v1/admin/node-enrollments/%00/revoke", 404),
        ("GET", "/api/v1/admin/jobs/%00", 404),
        ("POST", "/api/v1/admin/jobs/x%00/cancel", 404),
        ("POST", "/api/v1/agent/jobs/%00/progress", 404),
        ("DELETE", "/api/v1/admin/storage-roots/%00", 404),
        ("GET", "/api/v1/admin/nodes/%00/storage-roots", 404),
        ("GET", "/api/v1/admin/jobs?before=%00", 400),
        ("GET", "/api/v1/admin/audit-events?node_id=%00", 400),
        ("GET", "/api/v1/admin/audit-events?action=a%00b", 400),
    ],
)
def test_nul_and_non_uuid_ids_are_clear_4xx_on_every_database(client, method, path, status):
    # PostgreSQL refuses NUL in text outright; this once surfaced as a 500 (P5).
    response = client.open(path, method=method, headers=ADMIN)
    assert response.status_code == status
    assert response.get_json()["error"]["code"] in {
        "NODE_NOT_FOUND",
        "ENROLLMENT_NOT_FOUND",
        "JOB_NOT_FOUND",
        "STORAGE_ROOT_NOT_FOUND",
        "VALIDATION_FAILED",
    }


@pytest.mark.parametrize("value", ["", " 5", "+5", "\u0665", "1_000", "5.0"])
def test_audit_paging_numbers_are_plain_integers_as_the_document_says(client, value):
    # schemathesis found `limit=` answered 200 although the document says integer (A5).
    response = client.get("/api/v1/admin/audit-events", query_string={"limit": value}, headers=ADMIN)
    assert response.status_code == 400 and response.get_json()["error"]["field"] == "limit"


@pytest.mark.parametrize("value", ["9" * 4301, "-" + "9" * 4301])
def test_audit_paging_numbers_past_int_limits_are_a_clear_400(client, value):
    # P5 (issue 22): int() raises ValueError past 4,300 digits; rules.whole_number reads at most 20.
    response = client.get("/api/v1/admin/audit-events", query_string={"before_id": value}, headers=ADMIN)
    assert response.status_code == 400 and response.get_json()["error"]["field"] == "before_id"
