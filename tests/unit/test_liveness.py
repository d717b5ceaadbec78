"""Sweeps, tick claims, work gating and readiness on SQLite and PostgreSQL (L1–L4, E5, R1, P4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from app import scheduler
from app.config import ConfigError, load_settings
from app.extensions import db
from app.models import AuditEvent, Gpu, NodeLease, TelemetryRollup, TelemetrySample
from app.nodes import liveness, readiness, retention
from app.timeutil import utcnow
from tests.support import ADMIN, OPERATOR_KEY, factories
from tests.support.nodes import online_node

HEARTBEAT = "/api/v1/agent/heartbeat"


def settings(app):
    return app.config["MODELFORGE"]


def age_lease(app, node_id, seconds):
    with app.app_context():
        db.session.execute(
            sa.update(NodeLease)
            .where(NodeLease.node_id == node_id)
            .values(last_heartbeat_at=utcnow() - timedelta(seconds=seconds))
        )
        db.session.commit()


def events(app, action=None):
    with app.app_context():
        query = sa.select(AuditEvent.node_id, AuditEvent.action).order_by(AuditEvent.id)
        if action:
            query = query.where(AuditEvent.action == action)
        return db.session.execute(query).all()


def test_sweep_moves_silent_nodes_and_audits_each_transition_once(app, client):
    fresh, quiet, gone = (
        online_node(client, inventory=False),
        online_node(client, inventory=False),
        online_node(client, inventory=False),
    )
    never = factories.enrolled_node(client)
    age_lease(app, quiet["node_id"], 60)
    age_lease(app, gone["node_id"], 500)
    with app.app_context():
        assert liveness.sweep(settings(app)) == {"stale": 1, "offline": 1}
        assert liveness.sweep(settings(app)) == {"stale": 0, "offline": 0}  # a duplicate run changes nothing
        statuses = dict(db.session.execute(sa.select(NodeLease.node_id, NodeLease.status)).all())
    assert statuses == {
        fresh["node_id"]: "online",
        quiet["node_id"]: "stale",
        gone["node_id"]: "offline",
        never["node_id"]: "pending",
    }
    swept = [row for row in events(app) if row.action in {"node.stale", "node.offline"}]
    assert sorted(swept) == sorted([(quiet["node_id"], "node.stale"), (gone["node_id"], "node.offline")])

    age_lease(app, quiet["node_id"], 500)
    with app.app_context():
        assert liveness.sweep(settings(app)) == {"stale": 0, "offline": 1}
    assert [row.action for row in events(app) if row.node_id == quiet["node_id"]][-2:] == ["node.stale", "node.offline"]

    # L2: the next heartbeat brings it back, with a return event.
    client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=factories.bearer(quiet["credential"]))
    assert events(app)[-1] == (quiet["node_id"], "node.returned")
    view = client.get(f"/api/v1/hardware/nodes/{quiet['node_id']}", headers=ADMIN).get_json()
    assert view["status"] == "online"


def test_work_goes_only_to_online_enabled_compatible_nodes(app, client):
    ready, quiet, disabled, old = (
        online_node(client, inventory=False),
        online_node(client, inventory=False),
        online_node(client, inventory=False),
        online_node(client, inventory=False),
    )
    age_lease(app, quiet["node_id"], 60)
    client.post(f"/api/v1/admin/nodes/{disabled['node_id']}/disable", headers=ADMIN)
    client.post(
        HEARTBEAT, json=factories.heartbeat_body(protocol_version=0), headers=factories.bearer(old["credential"])
    )
    with app.app_context():
        gate = {
            name: liveness.may_receive_work(node["node_id"], settings(app))
            for name, node in {"ready": ready, "quiet": quiet, "disabled": disabled, "old": old}.items()
        }
        assert liveness.may_receive_work("nope", settings(app)) == (False, "unknown node")
    assert gate["ready"][0] is True
    assert gate["quiet"] == (False, "node is stale")
    assert gate["disabled"] == (False, "node is disabled")
    assert gate["old"] == (False, "agent protocol is TOO_OLD")


def test_expired_tokens_are_swept_and_cannot_be_claimed(app, client):
    minted = factories.mint(client)
    factories.expire_enrollments(app)
    with app.app_context():
        runs = scheduler.run_all_now(settings(app))
    assert runs["enrollment-expiry"] == {"expired": 1}
    refused = client.post("/api/v1/agent/enroll", json=factories.enroll_body(minted["token"]))
    assert refused.status_code == 410
    assert events(app, "enrollment.expired")


def test_a_tick_is_claimed_once(app):
    with app.app_context():
        assert scheduler.claim_tick("liveness", 100, "a") is True
        assert scheduler.claim_tick("liveness", 100, "b") is False
        assert scheduler.claim_tick("liveness", 99, "b") is False
        assert scheduler.claim_tick("liveness", 101, "b") is True
        assert scheduler.claim_tick("telemetry-retention", 100, "b") is True
        assert scheduler.sweep_runs() == {"liveness": 2, "telemetry-retention": 1}


def insert_samples(app, node_id, start, hours, every_seconds=15, gpus=2):
    """Samples with explicit timestamps: utilisation = minute of the hour, power = 100 W."""
    with app.app_context():
        now = utcnow()
        for index in range(gpus):
            db.session.add(Gpu(node_id=node_id, uuid=f"GPU-{index}", first_seen_at=now, last_seen_at=now))
        db.session.flush()
        gpu_ids = list(db.session.scalars(sa.select(Gpu.id).where(Gpu.node_id == node_id)))
        rows = []
        moment = start
        while moment < start + timedelta(hours=hours):
            for gpu_id in gpu_ids:
                rows.append(
                    {
                        "gpu_id": gpu_id,
                        "sampled_at": moment,
                        "utilization_gpu_percent": float(moment.minute),
                        "memory_used_bytes": 1000,
                        "temperature_c": None,
                        "power_w": 100.0,
                    }
                )
            moment += timedelta(seconds=every_seconds)
        db.session.execute(sa.insert(TelemetrySample), rows)
        db.session.commit()
        return gpu_ids


def test_retention_keeps_the_raw_window_and_rolls_up_the_rest(app, client):
    node = factories.enrolled_node(client)
    now = utcnow()
    start = (now - timedelta(days=9)).replace(minute=0, second=0, microsecond=0)
    gpu_ids = insert_samples(app, node["node_id"], start, hours=9 * 24, every_seconds=60)
    with app.app_context():
        result = retention.sweep(settings(app), now=now)
        assert retention.sweep(settings(app), now=now) == {
            "rollups_written": 0,
            "samples_deleted": 0,
            "rollups_pruned": 0,
        }
        oldest_raw = db.session.scalar(sa.select(sa.func.min(TelemetrySample.sampled_at)))
        raw_count = db.session.scalar(sa.select(sa.func.count()).select_from(TelemetrySample))
        oldest_rollup = db.session.scalar(sa.select(sa.func.min(TelemetryRollup.bucket_start)))
        one = (
            db.session.execute(
                sa.select(TelemetryRollup)
                .where(TelemetryRollup.gpu_id == gpu_ids[0])
                .order_by(TelemetryRollup.bucket_start)
            )
            .scalars()
            .first()
        )
    raw_window = timedelta(seconds=settings(app).telemetry_raw_retention_seconds)
    assert now - raw_window - timedelta(minutes=5) <= oldest_raw
    assert raw_count <= 2 * (raw_window.total_seconds() / 60 + 5)
    assert result["samples_deleted"] > 0 and result["rollups_pruned"] > 0
    assert oldest_rollup >= now - timedelta(days=7) - timedelta(minutes=5)
    # One 5-minute bucket of one-minute samples: five samples, sums and maxima exact, nulls not counted.
    assert one.samples == 5 and one.utilization_count == 5
    assert one.utilization_sum == sum(float((one.bucket_start + timedelta(minutes=i)).minute) for i in range(5))
    assert one.power_max == 100.0 and one.temperature_count == 0 and one.temperature_sum is None


def test_rollup_retention_must_cover_the_raw_window(tmp_path):
    env = {
        "MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY,
        "MODELFORGE_SECRET_KEY": "s",
        "MODELFORGE_TELEMETRY_RAW_RETENTION_SECONDS": "86400",
        "MODELFORGE_TELEMETRY_ROLLUP_RETENTION_SECONDS": "3600",
    }
    with pytest.raises(ConfigError, match="MODELFORGE_TELEMETRY_ROLLUP_RETENTION_SECONDS"):
        load_settings(env, tmp_path)


def readiness_of(client, node_id):
    response = client.get(f"/api/v1/admin/nodes/{node_id}/readiness", headers=ADMIN)
    assert response.status_code == 200
    body = response.get_json()
    return body["ready"], {check["name"]: check["status"] for check in body["checks"]}, body


def test_connected_is_not_ready(client):
    node = factories.enrolled_node(client)
    ready, checks, body = readiness_of(client, node["node_id"])
    assert ready is False
    assert checks == {"connection": "pending", "inventory": "pending", "protocol": "pass", "agent_health": "pending"}
    connection = next(check for check in body["checks"] if check["name"] == "connection")
    assert "ConnectError" in connection["next_step"] and "MODELFORGE_AGENT_CONTROL_PLANE_URL" in connection["next_step"]
    # A heartbeat without inventory or telemetry: connected, still not ready.
    auth = factories.bearer(node["credential"])
    client.post(HEARTBEAT, json=factories.heartbeat_body([]), headers=auth)
    ready, checks, _ = readiness_of(client, node["node_id"])
    assert ready is False and checks["connection"] == "pass" and checks["inventory"] == "pending"


def test_every_check_passes_for_a_healthy_gpu_node_then_each_can_fail(app, client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    client.post("/api/v1/agent/inventory", json=factories.inventory_body(), headers=auth)
    client.post(HEARTBEAT, json=factories.heartbeat_body(), headers=auth)
    ready, checks, _ = readiness_of(client, node["node_id"])
    assert ready is True and set(checks.values()) == {"pass"} and "telemetry" in checks

    client.post(
        HEARTBEAT, json=factories.heartbeat_body(health={"status": "degraded", "detail": "GPU lost"}), headers=auth
    )
    assert readiness_of(client, node["node_id"])[1]["agent_health"] == "fail"

    old = factories.sample(sampled_at=(utcnow() - timedelta(minutes=10)).isoformat())
    client.post(HEARTBEAT, json=factories.heartbeat_body([old]), headers=auth)
    with app.app_context():
        db.session.execute(
            sa.delete(TelemetrySample).where(TelemetrySample.sampled_at > utcnow() - timedelta(minutes=5))
        )
        db.session.commit()
    assert readiness_of(client, node["node_id"])[1]["telemetry"] == "fail"

    client.post(HEARTBEAT, json=factories.heartbeat_body(protocol_version=9), headers=auth)
    assert readiness_of(client, node["node_id"])[1]["protocol"] == "fail"
    age_lease(app, node["node_id"], 60)
    assert readiness_of(client, node["node_id"])[1]["connection"] == "fail"
    client.post(f"/api/v1/admin/nodes/{node['node_id']}/disable", headers=ADMIN)
    assert readiness_of(client, node["node_id"])[1]["connection"] == "fail"


def test_gpu_node_without_telemetry_is_pending(client):
    node = factories.enrolled_node(client)
    auth = factories.bearer(node["credential"])
    client.post("/api/v1/agent/inventory", json=factories.inventory_body(), headers=auth)
    client.post(HEARTBEAT, json=factories.heartbeat_body([]), headers=auth)
    ready, checks, _ = readiness_of(client, node["node_id"])
    assert ready is False and checks["telemetry"] == "pending"


def test_readiness_by_enrolment_follows_the_exact_node(app, client):
    minted = factories.mint(client)
    path = f"/api/v1/admin/node-enrollments/{minted['id']}/readiness"
    waiting = client.get(path, headers=ADMIN).get_json()
    assert waiting["ready"] is False and waiting["node_id"] is None
    assert waiting["checks"][0]["status"] == "pending"
    enrolled = client.post("/api/v1/agent/enroll", json=factories.enroll_body(minted["token"])).get_json()
    followed = client.get(path, headers=ADMIN).get_json()
    assert followed["node_id"] == enrolled["node_id"] and followed["enrollment_id"] == minted["id"]
    revoked = factories.mint(client)
    client.post(f"/api/v1/admin/node-enrollments/{revoked['id']}/revoke", headers=ADMIN)
    gone = client.get(f"/api/v1/admin/node-enrollments/{revoked['id']}/readiness", headers=ADMIN).get_json()
    assert gone["checks"][0]["status"] == "fail" and "revoked" in gone["checks"][0]["detail"]
    assert client.get("/api/v1/admin/nodes/nope/readiness", headers=ADMIN).status_code == 404
    with app.app_context():
        assert readiness.for_node("nope", settings(app)) is None
