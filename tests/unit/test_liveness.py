"""Sweeps, tick claims, work gating and readiness on SQLite and PostgreSQL (L1–L4, E5, R1, P4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from app import scheduler
from app.config import ConfigError, load_settings
from app.extensions import db
from app.jobs import queue
from app.models import AuditEvent, Gpu, NodeLease, SweepTick, TelemetryRollup, TelemetrySample
from app.nodes import liveness, readiness, retention
from app.timeutil import utcnow
from tests.support import ADMIN, OPERATOR_KEY, factories
from tests.support.nodes import online_node, silence

age_lease = silence  # the lease's heartbeat `seconds` old (tests/support/nodes.py)
HEARTBEAT = "/api/v1/agent/heartbeat"


def settings(app):
    return app.config["MODELFORGE"]


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


# The control plane's own downtime is no node's outage (L1, J2, issue 22).


def last_claim(app, name, seconds_ago):
    """The sweep's row as a scheduler left it `seconds_ago`: its last claim, nothing held."""
    with app.app_context():
        scheduler.claim_tick(name, 1, "earlier")
        db.session.execute(
            sa.update(SweepTick)
            .where(SweepTick.name == name)
            .values(claimed_at=utcnow() - timedelta(seconds=seconds_ago), heard_since=None)
        )
        db.session.commit()


def run_sweep(app, name, hearing=None):
    """One tick of `name` as the scheduler runs it (the next tick: the row's last one is set back)."""
    with app.app_context():
        db.session.execute(sa.update(SweepTick).where(SweepTick.name == name).values(last_tick=0))
        db.session.commit()
    settings_ = settings(app)
    interval, work = scheduler.sweeps(settings_)[name]
    assert scheduler.run_if_due(app, name, interval, work, "test", hearing or scheduler.Hearing())


def statuses(app):
    with app.app_context():
        return dict(db.session.execute(sa.select(NodeLease.node_id, NodeLease.status)).all())


def test_the_hold_is_the_agents_longest_backoff_and_request_plus_an_interval(app):
    import inspect

    import modelforge_node_agent as agent

    backoff = agent.Backoff()
    for _ in range(20):
        longest = backoff.next_delay()
    assert longest == agent.BACKOFF_MAX_SECONDS
    assert max(agent.Backoff.jittered(longest) for _ in range(2000)) <= liveness.AGENT_LONGEST_BACKOFF_SECONDS
    assert liveness.AGENT_LONGEST_BACKOFF_SECONDS == agent.BACKOFF_MAX_SECONDS * 1.2
    assert "timeout=(5, 15)" in inspect.getsource(agent)  # the agent's one control-plane request timeout
    assert liveness.AGENT_LONGEST_REQUEST_SECONDS == 5 + 15
    configured = settings(app)
    assert liveness.hearing_hold_seconds(configured) == pytest.approx(
        16 * 1.2
        + 20
        + max(configured.heartbeat_interval_seconds, configured.job_progress_interval_seconds)
        + configured.sweep_interval_seconds
    )


def test_a_scheduler_that_starts_after_a_gap_judges_no_node_silent_through_it(app, client):
    """The whole control plane was down for 500 s: every node looks silent, none is judged."""
    heard, later = online_node(client, inventory=False), online_node(client, inventory=False)
    for node in (heard, later):
        age_lease(app, node["node_id"], 500)
    last_claim(app, "liveness", 500)
    run_sweep(app, "liveness")  # a fresh scheduler: its first tick finds the 500 s gap
    assert set(statuses(app).values()) == {"online"}
    assert not [row for row in events(app) if row.action in {"node.stale", "node.offline"}]

    # A node heard since the control plane came back is judged as ever, during the hold too.
    with app.app_context():
        since = db.session.scalar(sa.select(SweepTick.heard_since).where(SweepTick.name == "liveness"))
        hold = liveness.hearing_hold_seconds(settings(app))
        heard_lease = sa.update(NodeLease).where(NodeLease.node_id == heard["node_id"])
        db.session.execute(heard_lease.values(last_heartbeat_at=since))
        db.session.commit()
        later_moment = since + timedelta(seconds=settings(app).node_stale_after_seconds + 1)
        assert later_moment < since + timedelta(seconds=hold)
        assert liveness.sweep(settings(app), now=later_moment) == {"stale": 1, "offline": 0}
        # After the hold every live agent has reported; one that has not is silent, and judged.
        assert liveness.sweep(settings(app), now=since + timedelta(seconds=hold + 1)) == {"stale": 0, "offline": 1}
    assert statuses(app) == {heard["node_id"]: "stale", later["node_id"]: "offline"}


def test_during_the_hold_no_reader_shows_a_node_silent_through_the_gap_as_offline(app, client):
    """What the API, /metrics and readiness say agrees with what the sweep records: stale, not offline."""
    node = online_node(client, inventory=False)
    node_id = node["node_id"]
    age_lease(app, node_id, 500)
    last_claim(app, "liveness", 500)
    run_sweep(app, "liveness")

    def shown():
        listed = client.get("/api/v1/hardware/nodes", headers=ADMIN).get_json()["nodes"]
        one = client.get(f"/api/v1/hardware/nodes/{node_id}", headers=ADMIN).get_json()
        scraped = client.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}).get_data(as_text=True)
        (line,) = [row for row in scraped.splitlines() if row.startswith("modelforge_node_status{") and node_id in row]
        with app.app_context():
            (connection,) = [
                check for check in readiness.for_node(node_id, settings(app))["checks"] if check["name"] == "connection"
            ]
        return (
            {"list": listed[0]["status"], "node": one["status"], "metrics": line.split('status="')[1].split('"')[0]},
            one,
            connection,
        )

    during, one, connection = shown()
    assert during == {"list": "stale", "node": "stale", "metrics": "stale"}
    assert one["heartbeat_age_seconds"] >= 500  # the age stays the true one
    assert "offline" not in connection["detail"]
    assert statuses(app) == {node_id: "online"}

    with app.app_context():  # the hold over: the silence is judged, by readers and the sweep alike
        db.session.execute(
            sa.update(SweepTick).where(SweepTick.name == "liveness").values(heard_since=utcnow() - timedelta(hours=1))
        )
        db.session.commit()
    after, _, _ = shown()
    assert after == {"list": "offline", "node": "offline", "metrics": "offline"}


def test_a_sweep_that_failed_holds_judgment_when_the_database_answers_again(app, client):
    node = online_node(client, inventory=False)
    last_claim(app, "liveness", 2)  # no gap: the scheduler ran until the database failed it
    age_lease(app, node["node_id"], 500)
    hearing = scheduler.Hearing()
    hearing.ran.add("liveness")
    hearing.failed.add("liveness")  # its last attempt failed (the database was down)
    run_sweep(app, "liveness", hearing)
    assert statuses(app) == {node["node_id"]: "online"}
    assert "liveness" not in hearing.failed

    # The next tick, with the database answering all along, holds on (the hold is in the row) ...
    run_sweep(app, "liveness", hearing)
    assert statuses(app) == {node["node_id"]: "online"}
    # ... and a scheduler that ran without a gap or a failure holds nothing new.
    last_claim(app, "liveness", 1)
    run_sweep(app, "liveness", hearing)
    assert statuses(app) == {node["node_id"]: "offline"}


def test_a_new_database_and_a_running_scheduler_hold_nothing(app, client):
    node = online_node(client, inventory=False)
    age_lease(app, node["node_id"], 500)
    run_sweep(app, "liveness")  # the sweep's first claim ever: nothing to hold
    assert statuses(app) == {node["node_id"]: "offline"}


def test_a_lease_that_lapsed_while_the_control_plane_was_down_is_not_requeued(app, client):
    from app.models import Job
    from tests.support import ACQUIRE
    from tests.support.jobs import add_job, add_root, claim

    node = online_node(client, capabilities=[ACQUIRE])
    job = add_job(client, node["id"], add_root(client, node["id"]).get_json()["id"])
    claim(client, node)
    with app.app_context():
        db.session.execute(sa.update(Job).values(lease_expires_at=utcnow() - timedelta(seconds=30)))
        db.session.commit()
    last_claim(app, "job-leases", 300)
    run_sweep(app, "job-leases")
    view = client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()
    assert (view["state"], view["attempt"]) == ("running", 1)  # its agent may still be running it
    with app.app_context():
        hold = liveness.hearing_hold_seconds(settings(app))
        assert queue.sweep_expired_leases(now=utcnow() + timedelta(seconds=hold + 1)) == {
            "requeued": 1, "failed": 0, "cancelled": 0,
        }  # fmt: skip
