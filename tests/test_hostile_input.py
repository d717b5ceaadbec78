"""Hostile input gets a clear 4xx JSON error, never a 500, and loses nothing (P5, A5)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent, Enrollment, NodeInventory, NodeLease, TelemetrySample
from tests import factories
from tests.support import ADMIN

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


WRONG_HEARTBEATS = [
    ({"health": None}, "health"),
    ({"health": "ok"}, "health"),
    ({"health": {"status": "fine"}}, "health.status"),
    ({"health": {"status": "ok", "detail": 5}}, "health.detail"),
    ({"agent_version": 1}, "agent_version"),
    ({"agent_version": "v" * 65}, "agent_version"),
    ({"telemetry": {}}, "telemetry"),
    ({"telemetry": [1]}, "telemetry[0]"),
    ({"telemetry": [factories.sample() for _ in range(65)]}, "telemetry"),
    ({"telemetry": [factories.sample(sampled_at="yesterday")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(sampled_at="2026-01-01T00:00:00")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(utilization_gpu_percent=101)]}, "telemetry[0].utilization_gpu_percent"),
    ({"telemetry": [factories.sample(utilization_gpu_percent="50")]}, "telemetry[0].utilization_gpu_percent"),
    ({"telemetry": [factories.sample(power_w=True)]}, "telemetry[0].power_w"),
    ({"telemetry": [factories.sample(memory_used_bytes=-1)]}, "telemetry[0].memory_used_bytes"),
    ({"telemetry": [factories.sample(memory_used_bytes=1.5)]}, "telemetry[0].memory_used_bytes"),
    ({"telemetry": [factories.sample(gpu_uuid="")]}, "telemetry[0].gpu_uuid"),
    ({"telemetry": [factories.sample(gpu_uuid=["GPU-1"])]}, "telemetry[0].gpu_uuid"),
    ({"telemetry": [factories.sample(power_w=10**400)]}, "telemetry[0].power_w"),
    ({"telemetry": [factories.sample(sampled_at="0001-01-01T00:00:00+01:00")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(sampled_at="9999-12-31T23:59:59-01:00")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(sampled_at="2999-01-01T00:00:00Z")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(sampled_at="1999-12-31T23:59:59Z")]}, "telemetry[0].sampled_at"),
    ({"health": {"status": "ok", "detail": "\ud800"}}, "health.detail"),
    # Issue 15: bidi controls in agent text would reorder the server's timestamps on the node page.
    ({"health": {"status": "ok", "detail": "ok \u202e 12:00"}}, "health.detail"),
    ({"health": {"status": "ok", "detail": "arabic letter mark \u061c"}}, "health.detail"),
]


@pytest.mark.parametrize(("change", "field"), WRONG_HEARTBEATS)
def test_wrong_heartbeat_fields_are_named(app, client, enrolled, change, field):
    before = snapshot(app)
    body = {**factories.heartbeat_body(), **change}
    response = client.post("/api/v1/agent/heartbeat", json=body, headers=factories.bearer(enrolled["credential"]))
    error = assert_error(response, 400)
    assert (error["code"], error["field"]) == ("VALIDATION_FAILED", field)
    assert snapshot(app) == before


WRONG_INVENTORIES = [
    ({"inventory": None}, "inventory"),
    ({"inventory": []}, "inventory"),
    ({"inventory": {"gpus": "none"}}, "inventory.gpus"),
    ({"inventory": {"gpus": [{"name": "no uuid"}]}}, "inventory.gpus[0].uuid"),
    (
        {"inventory": {"gpus": [factories.gpu(memory_total_bytes="16GB")]}},
        "inventory.gpus[0].memory_total_bytes",
    ),
    ({"inventory": {"gpus": [factories.gpu(), factories.gpu()]}}, "inventory.gpus"),
    ({"inventory": {"hostname": 7, "gpus": []}}, "inventory.hostname"),
    # Issue 15: every fact is declared and bounded (N4, P5); these once reached the node page.
    ({"inventory": {"gpus": [], "os": "bad \ud800"}}, "inventory.os"),
    ({"inventory": {"gpus": [], "os": "Debian \u202e 12"}}, "inventory.os"),
    ({"inventory": {"gpus": [], "kernel": "k" * 201}}, "inventory.kernel"),
    ({"inventory": {"gpus": [], "cpu_model": ["AMD"]}}, "inventory.cpu_model"),
    ({"inventory": {"gpus": [], "cpu_count": "many"}}, "inventory.cpu_count"),
    ({"inventory": {"gpus": [], "cpu_count": -1}}, "inventory.cpu_count"),
    ({"inventory": {"gpus": [], "memory_total_bytes": 10**400}}, "inventory.memory_total_bytes"),
    ({"inventory": {"gpus": [], "memory_total_bytes": 2**63}}, "inventory.memory_total_bytes"),
    ({"inventory": {"gpus": [], "memory_limited_by_cgroup": "yes"}}, "inventory.memory_limited_by_cgroup"),
    ({"inventory": {"gpus": [], "storage": ["state"]}}, "inventory.storage"),
    (
        {"inventory": {"gpus": [], "storage": {"state": {"total_bytes": -1}}}},
        "inventory.storage.state.total_bytes",
    ),
    ({"inventory": {"gpus": [], "storage": {"state": {"path": "/a\nb"}}}}, "inventory.storage.state.path"),
    ({"inventory": {"gpus": [], "unknown_reasons": ["a"]}}, "inventory.unknown_reasons"),
    ({"inventory": {"gpus": [], "unknown_reasons": {"os": 5}}}, "inventory.unknown_reasons.os"),
    ({"inventory": {"gpus": [], "gpu_unknown_reasons": {"GPU-1": "lost"}}}, "inventory.gpu_unknown_reasons.GPU-1"),
    ({"inventory": {"gpus": [], "accelerator_mode": "\u2066nvidia"}}, "inventory.accelerator_mode"),
    ({"inventory": {"gpus": [], "agent": {"version": 1}}}, "inventory.agent.version"),
    ({"inventory": {"gpus": [factories.gpu(driver_version="d" * 65)]}}, "inventory.gpus[0].driver_version"),
    ({"inventory": {"gpus": [factories.gpu(name="RTX \u202e")]}}, "inventory.gpus[0].name"),
    # W1: the runtime worker the agent relays.
    ({"runtime_worker": {"protocol_version": 1}}, "runtime_worker.worker_version"),
    ({"runtime_worker": {"worker_version": "1", "protocol_version": True}}, "runtime_worker.protocol_version"),
    ({"runtime_worker": {"worker_version": "1", "protocol_version": [1]}}, "runtime_worker.protocol_version"),
    ({"runtime_worker": "up"}, "runtime_worker"),
    ({"runtime_worker_problem": "two\nlines"}, "runtime_worker_problem"),
]


@pytest.mark.parametrize(("change", "field"), WRONG_INVENTORIES)
def test_wrong_inventory_fields_are_named(app, client, enrolled, change, field):
    before = snapshot(app)
    body = {**factories.inventory_body(), **change}
    response = client.post("/api/v1/agent/inventory", json=body, headers=factories.bearer(enrolled["credential"]))
    error = assert_error(response, 400)
    assert (error["code"], error["field"]) == ("VALIDATION_FAILED", field)
    assert snapshot(app) == before


WRONG_ENROLLS = [
    ({"node_id": "not-a-uuid"}, "node_id"),
    ({"node_id": 12}, "node_id"),
    ({"hostname": ""}, "hostname"),
    ({"hostname": "h" * 256}, "hostname"),
    ({"control_plane_url": "modelforge.lan"}, "control_plane_url"),
    ({"enrollment_token": None}, "enrollment_token"),
    ({"enrollment_token": {"token": "x"}}, "enrollment_token"),
    ({"hostname": "gpu-\udc80"}, "hostname"),
]


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
