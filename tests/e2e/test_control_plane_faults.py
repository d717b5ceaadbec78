"""Faults of the control plane itself, through real processes (issue 22): a kill -9 of the whole
control plane and a black-holed PostgreSQL are no node's outage, a black hole costs a request
seconds and a 503, and a full disk shows on /healthz."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from datetime import datetime

import pytest
import requests
import sqlalchemy as sa

from app.nodes import liveness
from tests.support import ADMIN, FAST_LIVENESS, factories, truncate_all, wait_until
from tests.support.agent import FAKE_RTX_4080, fake_nvml_scenario, nvidia_agent
from tests.support.alerts import Receiver
from tests.support.gunicorn import GunicornServer
from tests.support.tcp_proxy import BlackHoleProxy

AGENTS = 2
# Beats and sweeps every second, a silent node offline after 4 s: an outage of 10 s is well past
# it, and past the agents' third backoff step (1 + 2 + 4 s), so they come back on their own timers.
OUTAGE_SECONDS = 10
# The agents are back within their longest backoff (19.2 s) of the control plane answering; the
# rest is for a loaded box (their requests, gunicorn's workers starting).
BACK_WITHIN_SECONDS = liveness.AGENT_LONGEST_BACKOFF_SECONDS + 10
# A request on a black-holed database: the pool's 2 s ping, then a 3 s connect; the rest for load.
QUICK_503_SECONDS = 12
JUDGED = ("node.stale", "node.offline", "node.returned")
# A user and mount namespace of its own, where a process may mount a tmpfs without root.
NAMESPACES = ["unshare", "--user", "--map-root-user", "--mount"]


def audit(server, **params) -> list[dict]:
    response = requests.get(
        server.url + "/api/v1/admin/audit-events", params={"limit": 1000, **params}, headers=ADMIN, timeout=30
    )
    return response.json()["audit_events"]


def last_heartbeats(server) -> dict[str, str | None]:
    nodes = requests.get(server.url + "/api/v1/hardware/nodes", headers=ADMIN, timeout=30).json()["nodes"]
    return {node["id"]: node["last_heartbeat_at"] for node in nodes}


def sweep_runs(database_url: str, name: str) -> int:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            runs = connection.execute(sa.text("SELECT runs FROM sweep_ticks WHERE name = :n"), {"n": name})
            return runs.scalar() or 0
    finally:
        engine.dispose()


def start_fleet(tmp_path, server, receiver):
    """AGENTS real agents on the fake NVML, each online, their enrolment alerts delivered."""
    agents = []
    for index in range(AGENTS):
        agent, _ = nvidia_agent(tmp_path, server, fake_nvml_scenario(FAKE_RTX_4080), name=f"agent-{index}")
        agents.append(agent.start())
    for agent in agents:
        agent.wait_for(r"inventory published", timeout=60)
    wait_until(
        lambda: len({event["node_id"] for event in audit(server, action="node.online")}) == AGENTS,
        lambda: f"every node online: {audit(server)}",
        timeout=60,
        interval=0.5,
    )
    wait_until(lambda: len(receiver.titles()) >= AGENTS, lambda: f"the enrolment alerts: {receiver.titles()}", 60)
    return agents


def moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def all_back(server, since: datetime) -> bool:
    beats = last_heartbeats(server)
    return len(beats) == AGENTS and all(beat is not None and moment(beat) > since for beat in beats.values())


def assert_no_outage_recorded(server, database_url, receiver, alerts_before, agents):
    """Nothing judged after the fault: a few more sweeps run, then no transition and no alert."""
    before = {name: sweep_runs(database_url, name) for name in ("liveness", "alerts")}
    wait_until(
        lambda: all(sweep_runs(database_url, name) >= runs + 3 for name, runs in before.items()),
        "three more liveness and alert sweeps",
        timeout=30,
        interval=0.5,
    )
    judged = [(event["action"], event["node_id"]) for event in audit(server) if event["action"] in JUDGED]
    assert judged == [], f"the control plane's downtime was recorded as node outages: {judged}"
    assert receiver.titles()[alerts_before:] == []
    assert all(agent.process.poll() is None for agent in agents)


def kill_control_plane(server: GunicornServer) -> None:
    """kill -9 of the master, its workers and its scheduler: nothing says goodbye."""
    master = server.process.pid
    children = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    for pid in [master, *map(int, children)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.process.wait()
    for pid in map(int, children):
        wait_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}"), f"process {pid} gone", timeout=10)


def test_a_control_plane_killed_past_the_offline_threshold_records_no_outage(database_url, tmp_path):
    """L1, O2: kill -9 for 10 s (offline is 4 s): 0 nodes offline, 0 alerts, all back within a backoff."""
    receiver = Receiver().start()
    server = GunicornServer(database_url, tmp_path, workers=2, MODELFORGE_ALERT_URLS=receiver.url(), **FAST_LIVENESS)
    agents = []
    try:
        server.start(timeout=60)
        agents = start_fleet(tmp_path, server, receiver)
        alerts_before = len(receiver.titles())

        kill_control_plane(server)
        time.sleep(OUTAGE_SECONDS)  # the fault itself: nobody answers the agents
        server.start(timeout=60)
        restarted = time.monotonic()
        since = max(moment(beat) for beat in last_heartbeats(server).values())
        wait_until(lambda: all_back(server, since), "every agent heard again", timeout=60, interval=0.2)
        back_after = time.monotonic() - restarted
        assert back_after <= BACK_WITHIN_SECONDS, f"the agents took {back_after:.1f} s to come back"

        assert_no_outage_recorded(server, database_url, receiver, alerts_before, agents)
        assert "could not hear" in server.log()
    finally:
        for agent in agents:
            agent.stop(timeout=10)
        server.stop()
        receiver.stop()
        print(server.log()[-20000:])


@pytest.fixture
def proxied_postgres(postgres_database):
    """The session's PostgreSQL, emptied, reached only through a proxy that can black-hole it."""
    truncate_all(postgres_database)
    url = sa.make_url(postgres_database)
    proxy = BlackHoleProxy(url.port or 5432)
    yield proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxy.close()


def timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def test_a_black_holed_postgresql_answers_503_in_seconds_and_records_no_outage(proxied_postgres, tmp_path):
    """P5, L1: the database accepts and never answers for longer than the offline threshold."""
    proxy, database_url = proxied_postgres
    receiver = Receiver().start()
    server = GunicornServer(database_url, tmp_path, workers=2, MODELFORGE_ALERT_URLS=receiver.url(), **FAST_LIVENESS)
    agents = []
    try:
        server.start(timeout=60)
        agents = start_fleet(tmp_path, server, receiver)
        alerts_before = len(receiver.titles())
        credential = agents[0].credential()

        proxy.black_hole()
        holed = time.monotonic()
        health, health_took = timed(lambda: requests.get(server.url + "/healthz", timeout=40))
        beat, beat_took = timed(
            lambda: requests.post(
                server.url + "/api/v1/agent/heartbeat",
                json=factories.heartbeat_body([]),
                headers=factories.bearer(credential),
                timeout=40,
            )
        )
        assert (health.status_code, health.json()["error"]["code"]) == (503, "DATABASE_UNAVAILABLE")
        assert (beat.status_code, beat.json()["error"]["code"]) == (503, "DATABASE_UNAVAILABLE")
        assert health_took < QUICK_503_SECONDS and beat_took < QUICK_503_SECONDS, (health_took, beat_took)
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - holed)))  # the fault itself

        proxy.restore()
        restored = time.monotonic()
        wait_until(
            lambda: requests.get(server.url + "/healthz", timeout=40).status_code == 200,
            "/healthz 200 again",
            timeout=30,
            interval=0.5,
        )
        since = max(moment(beat) for beat in last_heartbeats(server).values())
        wait_until(lambda: all_back(server, since), "every agent heard again", timeout=60, interval=0.2)
        back_after = time.monotonic() - restored
        assert back_after <= BACK_WITHIN_SECONDS + QUICK_503_SECONDS, f"the agents took {back_after:.1f} s"

        assert_no_outage_recorded(server, database_url, receiver, alerts_before, agents)
        assert "WORKER TIMEOUT" not in server.log()
    finally:
        for agent in agents:
            agent.stop(timeout=10)
        server.stop()
        receiver.stop()
        print(server.log()[-20000:])


def can_mount_a_tmpfs() -> bool:
    probe = subprocess.run(
        [*NAMESPACES, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


def fill(directory: str) -> str:
    """Write a file into `directory` until its filesystem is full; return the file's path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    return path


def test_healthz_says_so_while_the_sqlite_disk_is_full(sqlite_template, tmp_path):
    """/healthz was 200 on a full disk (it only ran SELECT 1); now a 503 that says why, and 200 after."""
    if not shutil.which("unshare") or not can_mount_a_tmpfs():
        pytest.skip("no user namespace to mount a small tmpfs in")
    disk = tmp_path / "disk"
    disk.mkdir()
    # gunicorn runs in its own user and mount namespace with an 8 MiB tmpfs on `disk`; we reach
    # that tmpfs through /proc/<pid>/root.
    mount = 'mount -t tmpfs -o size=8m tmpfs "$1" && cp "$2" "$1/modelforge.sqlite3" && shift 2 && exec "$@"'
    wrapper = [*NAMESPACES, "sh", "-c", mount, "sh", str(disk), str(sqlite_template)]
    server = GunicornServer(f"sqlite:///{disk / 'modelforge.sqlite3'}", tmp_path, workers=2, wrapper=wrapper)
    try:
        server.start(timeout=60)
        inside = f"/proc/{server.process.pid}/root{disk}"
        assert os.path.exists(f"{inside}/modelforge.sqlite3")
        filler = fill(inside)

        def unhealthy():
            response = requests.get(server.url + "/healthz", timeout=30)
            return [response] if response.status_code == 503 else None  # a 503 Response is falsy

        (full,) = wait_until(unhealthy, "/healthz to notice the full disk", timeout=30, interval=0.5)
        assert full.json()["error"]["code"] == "DATABASE_NOT_WRITABLE"
        assert "full" in full.json()["error"]["message"] and str(disk) not in full.text

        os.remove(filler)
        wait_until(
            lambda: requests.get(server.url + "/healthz", timeout=30).json() == {"status": "ok"},
            "/healthz ok once space is free",
            timeout=30,
            interval=0.5,
        )
    finally:
        server.stop()
        print(server.log()[-20000:])
