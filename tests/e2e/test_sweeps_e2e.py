"""Liveness through the real server and agent; sweeps exactly once per tick (L1–L3, P4)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import requests
import sqlalchemy as sa

from tests.support import ADMIN, FAST_LIVENESS, PROJECT_ROOT, app_env, factories, wait_until
from tests.support.agent import AgentProcess, mint_token
from tests.support.gunicorn import GunicornServer, gunicorn_on_sqlite_copy


def audit(server, **params):
    response = requests.get(server.url + "/api/v1/admin/audit-events", params=params, headers=ADMIN, timeout=10)
    return response.json()["audit_events"]


# FAST_LIVENESS with ten seconds between stale (2 s) and offline (12 s): a sweep that a loaded box
# runs up to ten seconds late still sees each silent node stale before offline. (A sweep later than
# that moves it straight to offline, as it should; then no node.stale row exists to count. Five
# seconds were not enough once: the whole suite on two cores, a node offline 8 s after online.)
SWEEP_LIVENESS = {**FAST_LIVENESS, "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "12"}
# Liveness runs on one-second sweeps here; on a loaded two-core box (the suite in parallel) a
# transition can take several sweeps to show, so the waits are generous: 30 s for what takes 2-4 s.
TRANSITION_TIMEOUT = 30.0


def wait_for_action(server, node_id, action, timeout=TRANSITION_TIMEOUT):
    wait_until(
        lambda: any(event["action"] == action for event in audit(server, node_id=node_id)),
        lambda: f"{action} for {node_id}: {audit(server, node_id=node_id)}",
        timeout=timeout,
        interval=0.2,
    )


def node(server, node_id):
    return requests.get(f"{server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()


@pytest.fixture
def fast_server(sqlite_template, tmp_path):
    with gunicorn_on_sqlite_copy(sqlite_template, tmp_path / "fast.sqlite3", workers=4, **SWEEP_LIVENESS) as running:
        yield running


def test_stopped_agent_goes_stale_then_offline_and_returns_with_the_same_identity(fast_server, tmp_path):
    token = mint_token(fast_server.url)["token"]
    agent = AgentProcess(tmp_path, fast_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=token).start()
    agent.wait_for(r"inventory published")
    node_id = agent.node_id()
    wait_for_action(fast_server, node_id, "node.online")
    agent.process.kill()  # no goodbye: the control plane must notice by itself
    agent.process.wait()

    wait_for_action(fast_server, node_id, "node.stale")
    wait_for_action(fast_server, node_id, "node.offline")
    first = node(fast_server, node_id)
    second = wait_until(
        lambda: (
            (later := node(fast_server, node_id))["heartbeat_age_seconds"] > first["heartbeat_age_seconds"] and later
        ),
        "the offline node's heartbeat age to grow",
        timeout=10,
    )
    assert first["status"] == second["status"] == "offline"
    assert second["heartbeat_age_seconds"] > first["heartbeat_age_seconds"]  # a stopped agent keeps ageing
    assert first["last_heartbeat_at"] == second["last_heartbeat_at"]

    restarted = AgentProcess(tmp_path, fast_server.url).start()
    wait_for_action(fast_server, node_id, "node.returned")
    assert restarted.node_id() == node_id and node(fast_server, node_id)["status"] == "online"
    actions = [event["action"] for event in reversed(audit(fast_server, node_id=node_id))]
    assert actions == ["node.enrolled", "node.online", "node.stale", "node.offline", "node.returned"]
    restarted.stop()


def enrol_and_beat(server, count):
    """Nodes that sent one heartbeat each and then went silent."""
    ids = []
    for _ in range(count):
        minted = requests.post(
            server.url + "/api/v1/admin/node-enrollments", json=factories.enrollment_body(), headers=ADMIN, timeout=10
        ).json()
        body = factories.enroll_body(minted["token"], origin=server.url)
        credential = requests.post(server.url + "/api/v1/agent/enroll", json=body, timeout=10).json()["credential"]
        beat = requests.post(
            server.url + "/api/v1/agent/heartbeat",
            json=factories.heartbeat_body([]),
            headers=factories.bearer(credential),
            timeout=10,
        )
        assert beat.status_code == 200
        ids.append(body["node_id"])
    return ids


def liveness_runs(database_url):
    engine = sa.create_engine(database_url)
    with engine.connect() as connection:
        runs = connection.execute(sa.text("SELECT runs FROM sweep_ticks WHERE name = 'liveness'")).scalar() or 0
    engine.dispose()
    return runs


def assert_transitions_once(server, node_ids):
    wait_until(
        lambda: {event["node_id"] for event in audit(server, action="node.offline", limit=1000)} >= set(node_ids),
        "every silent node offline",
        timeout=TRANSITION_TIMEOUT,
        interval=0.2,
    )
    counts = Counter((event["node_id"], event["action"]) for event in audit(server, limit=1000))
    for node_id in node_ids:
        assert counts[(node_id, "node.stale")] == 1, counts
        assert counts[(node_id, "node.offline")] == 1, counts


def ran_once_per_tick(runs: int, ticks: int) -> bool:
    """Each tick swept at most once (plus one at the window's edge), never once per worker or
    replica. The lower bound is about timing, so it is generous: a scheduler starved of CPU by a
    parallel suite may miss a tick, but at least half of them ran."""
    return ticks // 2 <= runs <= ticks + 1


def measure_window(database_url, seconds):
    """Sweep runs and elapsed liveness ticks over a window of wall-clock time, opened once the
    scheduler has swept at all: on a loaded box its process can take ten seconds to start, and a
    window that closes before then counts startup time, not sweeps per tick."""
    wait_until(lambda: liveness_runs(database_url) > 0, "the scheduler's first liveness sweep", timeout=60)
    runs_before, tick_before = liveness_runs(database_url), math.floor(time.time())
    time.sleep(seconds)
    runs_after, tick_after = liveness_runs(database_url), math.floor(time.time())
    return runs_after - runs_before, tick_after - tick_before


def test_four_workers_sweep_each_tick_once(fast_server, sqlite_template, tmp_path):
    node_ids = enrol_and_beat(fast_server, 5)
    runs, ticks = measure_window(fast_server.env["MODELFORGE_DATABASE_URL"], 8)
    assert ran_once_per_tick(runs, ticks), (runs, ticks)
    assert_transitions_once(fast_server, node_ids)
    fast_server.stop()
    assert len(re.findall(r"scheduler \S+ started", fast_server.log())) == 1  # one scheduler, not one per worker
    assert "RuntimeWarning" not in fast_server.log()


def test_two_control_planes_on_one_postgresql_sweep_each_tick_once(postgres_database, tmp_path):
    from tests.support import truncate_all

    truncate_all(postgres_database)
    first = GunicornServer(postgres_database, tmp_path / "a", workers=2, **SWEEP_LIVENESS)
    second = GunicornServer(postgres_database, tmp_path / "b", workers=2, **SWEEP_LIVENESS)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first.start()
    second.start()
    try:
        node_ids = enrol_and_beat(first, 3) + enrol_and_beat(second, 3)
        runs, ticks = measure_window(postgres_database, 10)
        assert ran_once_per_tick(runs, ticks), (runs, ticks)  # not twice the ticks: one runner per tick
        assert_transitions_once(first, node_ids)
    finally:
        first.stop()
        second.stop()
    holders = set(re.findall(r"scheduler (\S+) started", first.log() + second.log()))
    assert len(holders) == 2  # both replicas ran a scheduler; the database picked one per tick


def scheduler_pids(master_pid: int) -> list[int]:
    # Children of this master only (-P): a pid number can be reused by another test's process.
    found = subprocess.run(
        ["pgrep", "-P", str(master_pid), "-f", "app.scheduler --parent-pid"], capture_output=True, text=True
    ).stdout.split()
    return [int(pid) for pid in found]


def schedulers_running() -> str:
    running = subprocess.run(["pgrep", "-fa", "app.scheduler"], capture_output=True, text=True).stdout
    return f"the schedulers to be as expected; running:\n{running}"


def test_the_master_restarts_a_dead_scheduler_and_the_scheduler_dies_with_the_master(fast_server):
    master = fast_server.process.pid

    def started() -> int:
        return len(re.findall(r"scheduler \S+ started", fast_server.log()))

    wait_until(lambda: started() == 1 and len(scheduler_pids(master)) == 1, schedulers_running, timeout=15)
    (first,) = scheduler_pids(master)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: scheduler_pids(master) not in ([], [first]), schedulers_running, timeout=20)
    (second,) = scheduler_pids(master)
    assert second != first
    wait_until(lambda: started() == 2, schedulers_running, timeout=15)

    # A master killed outright (no on_exit hook) must not leave an orphan sweeping on its own.
    os.kill(master, signal.SIGKILL)
    fast_server.process.wait()
    wait_until(lambda: not os.path.exists(f"/proc/{second}"), schedulers_running, timeout=10)


def test_operator_can_run_the_sweeps_once_from_the_command_line(tmp_path, sqlite_template):
    database = tmp_path / "cli.sqlite3"
    shutil.copyfile(sqlite_template, database)
    env = {**os.environ, **app_env(f"sqlite:///{database}", tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", "modelforge", "sweep"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "liveness": {"stale": 0, "offline": 0},
        "enrollment-expiry": {"expired": 0},
        "telemetry-retention": {"rollups_written": 0, "samples_deleted": 0, "rollups_pruned": 0},
        "job-leases": {"requeued": 0, "failed": 0, "cancelled": 0},
        "alerts": {"queued": 0, "sent": 0, "retrying": 0, "failed": 0},  # no target: nothing to send
    }
