"""Publishing and reading nodes back; credentials, disable/enable, audit (A1, A2, I5, I6, N4, P3, P4)."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import sqlalchemy as sa

from app import create_app
from app.extensions import db
from app.models import Gpu, NodeLease, TelemetrySample
from app.timeutil import utcnow
from tests import support
from tests.support import ADMIN, factories

INVENTORY = "/api/v1/agent/inventory"
HEARTBEAT = "/api/v1/agent/heartbeat"


def node_view(client, node_id):
    response = client.get(f"/api/v1/hardware/nodes/{node_id}", headers=ADMIN)
    assert response.status_code == 200
    return response.get_json()


def publish(client, credential, inventory=None, heartbeat=None):
    auth = factories.bearer(credential)
    first = client.post(INVENTORY, json=inventory or factories.inventory_body(), headers=auth)
    second = client.post(HEARTBEAT, json=heartbeat or factories.heartbeat_body(), headers=auth)
    return first, second


def audit(client, **params):
    response = client.get("/api/v1/admin/audit-events", query_string=params, headers=ADMIN)
    assert response.status_code == 200
    return response.get_json()["audit_events"]


def test_enrolled_node_is_pending_until_its_first_heartbeat(client):
    node = factories.enrolled_node(client)
    view = node_view(client, node["node_id"])
    assert view["status"] == "pending"
    assert view["last_heartbeat_at"] is None and view["heartbeat_age_seconds"] is None
    assert view["inventory"] is None and view["gpus"] == [] and view["telemetry"] == []
    assert view["credential"]["active"] is True and view["credential"]["prefix"].startswith("mfn_")


def test_published_facts_come_back_in_the_wire_format(client):
    node = factories.enrolled_node(client)
    inventory, heartbeat = publish(client, node["credential"])
    assert inventory.status_code == 200 and heartbeat.status_code == 200
    for reply in (inventory.get_json(), heartbeat.get_json()):
        assert reply["status"] == "accepted"
        assert reply["compatibility"]["answer"] == "COMPATIBLE"
        assert reply["heartbeat_interval_seconds"] == 15

    view = node_view(client, node["node_id"])
    assert view["status"] == "online"
    assert 0 <= view["heartbeat_age_seconds"] < 5
    assert (view["agent_version"], view["protocol_version"]) == (factories.AGENT_VERSION, 1)
    assert view["compatibility"]["answer"] == "COMPATIBLE"
    assert view["health"] == {"status": "ok", "detail": "all checks passed"}
    assert view["inventory"]["cpu_model"] == "AMD Ryzen 9 7950X"
    assert view["inventory"]["memory_total_bytes"] == 64 * 2**30
    assert "gpus" not in view["inventory"]
    (gpu,) = view["gpus"]
    assert gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000001"
    assert (gpu["name"], gpu["memory_total_bytes"], gpu["driver_version"]) == (
        "NVIDIA GeForce RTX 4080",
        17_171_480_576,
        "550.54.14",
    )
    (sample,) = view["telemetry"]
    assert sample["utilization_gpu_percent"] == 37.0 and sample["power_w"] == 123.4
    assert view["eligibility"] == {
        "production_eligible": False,
        "lab_eligible": False,
        "benchmark_eligible": False,
    }
    listed = client.get("/api/v1/hardware/nodes", headers=ADMIN).get_json()["nodes"]
    assert [item["id"] for item in listed] == [node["node_id"]]
    dumped = json.dumps(listed)
    assert node["credential"] not in dumped and node["token"] not in dumped


def test_status_ages_from_the_stored_heartbeat_time(app, client):
    node = factories.enrolled_node(client)
    publish(client, node["credential"])
    for age, status in [(30, "online"), (60, "stale"), (500, "offline")]:
        with app.app_context():
            db.session.execute(
                sa.update(NodeLease)
                .where(NodeLease.node_id == node["node_id"])
                .values(last_heartbeat_at=utcnow() - timedelta(seconds=age))
            )
            db.session.commit()
        view = node_view(client, node["node_id"])
        assert view["status"] == status
        assert age <= view["heartbeat_age_seconds"] < age + 5


def test_unreadable_metrics_stay_null_and_latest_sample_wins(client):
    node = factories.enrolled_node(client)
    older = factories.sample(sampled_at="2026-01-01T00:00:00Z", utilization_gpu_percent=90.0)
    newer = factories.sample(sampled_at="2026-01-01T00:00:15+00:00", power_w=None, temperature_c=None)
    auth = factories.bearer(node["credential"])
    assert client.post(INVENTORY, json=factories.inventory_body(), headers=auth).status_code == 200
    assert client.post(HEARTBEAT, json=factories.heartbeat_body([older]), headers=auth).status_code == 200
    assert client.post(HEARTBEAT, json=factories.heartbeat_body([newer]), headers=auth).status_code == 200
    (latest,) = node_view(client, node["node_id"])["telemetry"]
    assert latest["sampled_at"] == "2026-01-01T00:00:15Z"
    assert (latest["power_w"], latest["temperature_c"], latest["utilization_gpu_percent"]) == (
        None,
        None,
        37.0,
    )


def test_first_heartbeat_audits_node_online_and_a_return_audits_node_returned(app, client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=auth)
    client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=auth)
    with app.app_context():
        db.session.execute(sa.update(NodeLease).values(status="offline"))
        db.session.commit()
    client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=auth)
    actions = [event["action"] for event in audit(client, node_id=node["node_id"])]
    assert actions == ["node.returned", "node.online", "node.enrolled"]


def test_gpu_changes_are_tracked_and_audited(client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    two = [factories.gpu("GPU-A"), factories.gpu("GPU-B")]
    assert client.post(INVENTORY, json=factories.inventory_body(two), headers=auth).status_code == 200
    assert client.post(INVENTORY, json=factories.inventory_body(two), headers=auth).status_code == 200
    assert client.post(INVENTORY, json=factories.inventory_body([two[0]]), headers=auth).status_code == 200
    gpus = {gpu["uuid"]: gpu["present"] for gpu in node_view(client, node["node_id"])["gpus"]}
    assert gpus == {"GPU-A": True, "GPU-B": False}
    # P4: a second change within the window is folded into the first event (publishing._audit_change).
    (change,) = [e["details"] for e in audit(client, node_id=node["node_id"], action="node.gpus_changed")]
    assert {key: change[key] for key in ("added", "removed", "changes", "last")} == {
        "added": ["GPU-A", "GPU-B"],
        "removed": [],
        "changes": 2,
        "last": {"added": [], "removed": ["GPU-B"]},
    }


def test_inventory_hostname_updates_the_node(client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    body = factories.inventory_body(hostname="renamed-host")
    assert client.post(INVENTORY, json=body, headers=auth).status_code == 200
    assert node_view(client, node["node_id"])["hostname"] == "renamed-host"
    assert audit(client, action="node.hostname_changed")[0]["details"] == {
        "old": "gpu-node-1",
        "new": "renamed-host",
    }


def test_rotation_returns_a_new_credential_once_and_the_old_one_stops_working(client):
    node = factories.enrolled_node(client)
    rotated = client.post(f"/api/v1/admin/nodes/{node['node_id']}/credential/rotate", headers=ADMIN)
    assert rotated.status_code == 201
    body = rotated.get_json()
    assert body["credential"].startswith("mfn_") and body["credential"] != node["credential"]
    assert body["active"] is True and rotated.headers["Cache-Control"] == "no-store"

    old = client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=factories.bearer(node["credential"]))
    assert old.status_code == 401 and old.get_json()["error"]["code"] == "CREDENTIAL_REVOKED"
    assert old.headers["WWW-Authenticate"] == "Bearer"
    new = client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=factories.bearer(body["credential"]))
    assert new.status_code == 200
    view = node_view(client, node["node_id"])
    assert view["credential"]["id"] == body["id"] and body["credential"] not in json.dumps(view)
    (event,) = audit(client, action="credential.rotated")
    assert body["credential"] not in json.dumps(event) and event["details"]["new_credential_id"] == body["id"]


def test_revocation_leaves_no_active_credential(client):
    node = factories.enrolled_node(client)
    path = f"/api/v1/admin/nodes/{node['node_id']}/credential/revoke"
    assert client.post(path, headers=ADMIN).status_code == 200
    again = client.post(path, headers=ADMIN)
    assert again.status_code == 409 and again.get_json()["error"]["code"] == "NO_ACTIVE_CREDENTIAL"
    assert node_view(client, node["node_id"])["credential"] is None
    refused = client.post(INVENTORY, json=factories.inventory_body(), headers=factories.bearer(node["credential"]))
    assert refused.status_code == 401 and refused.get_json()["error"]["code"] == "CREDENTIAL_REVOKED"


def test_disabled_node_is_refused_at_once_and_enable_undoes_it(client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    disabled = client.post(f"/api/v1/admin/nodes/{node['node_id']}/disable", headers=ADMIN)
    assert disabled.status_code == 200 and disabled.get_json()["disabled"] is True
    for path, body in [(HEARTBEAT, factories.heartbeat_body()), (INVENTORY, factories.inventory_body())]:
        refused = client.post(path, json=body, headers=auth)
        assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "NODE_DISABLED"
    assert node_view(client, node["node_id"])["last_heartbeat_at"] is None
    client.post(f"/api/v1/admin/nodes/{node['node_id']}/disable", headers=ADMIN)  # no change, no event
    enabled = client.post(f"/api/v1/admin/nodes/{node['node_id']}/enable", headers=ADMIN)
    assert enabled.status_code == 200 and enabled.get_json()["disabled"] is False
    assert client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=auth).status_code == 200
    actions = [e["action"] for e in audit(client, node_id=node["node_id"])]
    assert actions == ["node.online", "node.enabled", "node.disabled", "node.enrolled"]


def test_incompatible_enrolled_agent_is_refused_and_the_node_shows_why(client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    body = factories.heartbeat_body(protocol_version=7)
    refused = client.post(HEARTBEAT, json=body, headers=auth)
    assert refused.status_code == 426
    assert refused.get_json()["compatibility"]["answer"] == "TOO_NEW"
    view = node_view(client, node["node_id"])
    assert view["compatibility"]["answer"] == "TOO_NEW" and view["protocol_version"] == 7
    assert view["status"] == "pending"  # a refused heartbeat is not liveness


def test_unknown_node_and_unknown_credential(client):
    assert client.get("/api/v1/hardware/nodes/nope", headers=ADMIN).get_json()["error"]["code"] == "NODE_NOT_FOUND"
    for action in ("credential/rotate", "credential/revoke", "disable", "enable"):
        assert client.post(f"/api/v1/admin/nodes/nope/{action}", headers=ADMIN).status_code == 404
    missing = client.post(HEARTBEAT, json=factories.heartbeat_body())
    assert missing.status_code == 401 and missing.get_json()["error"]["code"] == "CREDENTIAL_REQUIRED"
    wrong = client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=factories.bearer("mfn_" + "z" * 43))
    assert wrong.status_code == 401 and wrong.get_json()["error"]["code"] == "CREDENTIAL_INVALID"


def test_audit_events_are_newest_first_and_page(client):
    for _ in range(3):
        factories.mint(client)
    events = audit(client)
    ids = [event["id"] for event in events]
    assert ids == sorted(ids, reverse=True) and len(ids) == 3
    assert {event["actor"] for event in events} == {"operator"}
    page = audit(client, limit=1, before_id=ids[0])
    assert [event["id"] for event in page] == [ids[1]]
    bad = client.get("/api/v1/admin/audit-events?limit=0", headers=ADMIN)
    assert bad.status_code == 400 and bad.get_json()["error"]["field"] == "limit"


def test_telemetry_rows_are_written_apart_from_the_lease(app, client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    inventory = factories.inventory_body([factories.gpu("GPU-A"), factories.gpu("GPU-B")])
    assert client.post(INVENTORY, json=inventory, headers=auth).status_code == 200
    samples = [factories.sample("GPU-A"), factories.sample("GPU-B")]
    client.post(HEARTBEAT, json=factories.heartbeat_body(samples), headers=auth)
    client.post(HEARTBEAT, json=factories.heartbeat_body([]), headers=auth)
    # A retried heartbeat (its reply was lost) does not store the same samples twice.
    client.post(HEARTBEAT, json=factories.heartbeat_body(samples), headers=auth)
    with app.app_context():
        stored = db.session.scalars(
            sa.select(Gpu.uuid).join(TelemetrySample, TelemetrySample.gpu_id == Gpu.id).order_by(Gpu.uuid)
        ).all()
        leases = db.session.scalars(sa.select(NodeLease)).all()
    assert stored == ["GPU-A", "GPU-B"]
    assert len(leases) == 1 and leases[0].last_heartbeat_at is not None


def test_a_worker_remembers_gpu_keys_per_database_never_across_two(sqlite_template, tmp_path):
    # The heartbeat keeps (node, GPU UUID) → row id pairs it has read (publishing._gpu_ids); the same
    # node ID and GPU UUID in another database must still land on that database's own GPU row.
    gpu_uuid, other_uuid = "GPU-0000-shared", "GPU-0000-only-in-b"
    node_id = "0b2f4f7e-8d6a-4bb8-9a41-5b1d6f0c2a11"
    latest = {}
    for name, gpus_first in (("a", [gpu_uuid]), ("b", [other_uuid, gpu_uuid])):
        path = tmp_path / f"{name}.sqlite3"
        shutil.copyfile(sqlite_template, path)
        app = create_app(support.app_env(f"sqlite:///{path}", tmp_path / name))
        client = app.test_client()
        node = factories.enrolled_node(client, node_id=node_id)
        auth = factories.bearer(node["credential"])
        # In b the shared GPU gets another row id than in a.
        body = factories.inventory_body(gpus=[factories.gpu(uuid_) for uuid_ in gpus_first])
        assert client.post("/api/v1/agent/inventory", json=body, headers=auth).status_code == 200
        for power in (100.0, 200.0):  # the second heartbeat takes the remembered key
            body = factories.heartbeat_body([factories.sample(gpu_uuid, power_w=power)])
            assert client.post("/api/v1/agent/heartbeat", json=body, headers=auth).status_code == 200
        described = client.get(f"/api/v1/hardware/nodes/{node_id}", headers=ADMIN).get_json()
        latest[name] = {sample["gpu_uuid"]: sample["power_w"] for sample in described["telemetry"]}
        with app.app_context():
            db.session.remove()
            db.engine.dispose()
    assert latest == {"a": {gpu_uuid: 200.0}, "b": {gpu_uuid: 200.0}}
