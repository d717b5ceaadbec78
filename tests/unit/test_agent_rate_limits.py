"""The agent and the control plane's per-node rates and clock checks (A2, J2; issue 22 items 6, 13, 16).

The agent runs in process against a loopback control plane that records what it is sent and
answers from a script (tests/support/agent.py); the Hub is the stand-in (tests/support/hub.py).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

import modelforge_node_agent as agent
from app.nodes import rate_limits
from tests.support.agent import FakeControlPlane, make_agent, make_config, runner_for

REPO = "org/model"


@pytest.fixture
def control_plane():
    fake = FakeControlPlane()
    yield fake
    fake.close()


@pytest.fixture
def agent_log(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="modelforge_node_agent")
    monkeypatch.setattr(agent.log, "propagate", True)
    return caplog


def acquire_job(tmp_path: Path, interval: float) -> dict:
    """A claim reply's `job`: an acquire of REPO onto the test's artifact directory."""
    return {
        "id": "job-1",
        "type": agent.ACQUIRE_JOB_TYPE,
        "attempt": 1,
        "max_attempts": 3,
        "params": {
            "repo_id": REPO,
            "revision": "main",
            "repo_type": "model",
            "allow_patterns": None,
            "ignore_patterns": None,
            "storage_root_id": "root-1",
            "container_path": str(tmp_path / "artifacts" / "registry"),
            "min_free_bytes": 0,
        },
        "lease_expires_at": "2030-01-01T00:00:00Z",
        "lease_seconds": 60,
        "progress_interval_seconds": interval,
    }


def running(running_agent: agent.Agent) -> threading.Thread:
    thread = threading.Thread(target=running_agent.run, daemon=True)
    thread.start()
    return thread


def stopped(running_agent: agent.Agent, thread: threading.Thread) -> None:
    running_agent.stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()


RATE_LIMITED = {"error": {"code": "NODE_RATE_LIMITED", "message": "Too soon.", "next_step": "Wait."}}


# --------------------------------------------------------------------------- item 6: progress and claim


def test_a_rate_limited_final_progress_report_waits_and_is_sent_again_and_the_job_succeeds(
    tmp_path, control_plane, hub, agent_log
):
    """The final report before `complete` may come moments after the last one: a 429 there is
    waited out, not a failure, and `complete` follows the accepted report."""
    hub.add_repo(REPO, {"config.json": b"{}", "model.gguf": b"x" * 4096})
    answered = []

    def progress(body):
        answered.append(429 if not answered else 200)  # the first report (the final one here) is too soon
        return answered[-1], (RATE_LIMITED if answered[-1] == 429 else {"cancel_requested": False})

    control_plane.scripts["progress"] = progress
    runner = runner_for(make_config(tmp_path, control_plane.url, hub.url), acquire_job(tmp_path, interval=4.0))
    runner.start().thread.join(timeout=20)
    assert not runner.alive() and runner.failure is None
    assert control_plane.names() == ["progress", "progress", "complete"], control_plane.names()
    assert answered == [429, 200]
    assert "HTTP 429 NODE_RATE_LIMITED on POST /api/v1/agent/jobs/job-1/progress" in agent_log.text
    assert "failed" not in agent_log.text


def test_a_rate_limited_claim_is_tried_again_after_the_next_heartbeat(tmp_path, control_plane):
    claims = []

    def claim(body):
        claims.append(body)
        return (429, RATE_LIMITED) if len(claims) == 1 else (204, None)

    control_plane.scripts["claim"] = claim
    running_agent = make_agent(make_config(tmp_path, control_plane.url))
    running_agent.capabilities = [agent.ACQUIRE_JOB_TYPE]
    thread = running(running_agent)
    try:
        control_plane.wait_for("claim", count=2, timeout=10)  # no job waits (jobs_waiting 0): the 429 alone
    finally:
        stopped(running_agent, thread)
    names = control_plane.names()
    first, second = (i for i, name in enumerate(names) if name == "claim")
    assert "heartbeat" in names[first:second]


# --------------------------------------------------------------------------- item 13: the server's words in the log


def test_the_agent_logs_what_the_control_plane_says_about_a_refusal_and_about_its_clock(
    tmp_path, control_plane, agent_log
):
    said = {
        "code": "VALIDATION_FAILED",
        "message": "telemetry[0].sampled_at: is outside the accepted range",
        "next_step": "Check the node's clock.",
    }
    beats = []
    clock = {
        "dropped_samples": 1,
        "dropped_observations": 0,
        "offset_seconds": 900.0,
        "message": "dropped 1 reading(s) dated up to 15 min ahead of the control plane's clock.",
        "next_step": "Check the node's clock (NTP, chrony or systemd-timesyncd); the liveness still counts.",
    }

    def heartbeat(body):
        beats.append(body)
        if len(beats) == 1:
            return 400, {"error": said}
        return 200, {**control_plane.publication_reply(body), "clock_warning": clock}

    control_plane.scripts["heartbeat"] = heartbeat
    running_agent = make_agent(make_config(tmp_path, control_plane.url))
    thread = running(running_agent)
    try:
        control_plane.wait_for("heartbeat", count=4, timeout=15)
    finally:
        stopped(running_agent, thread)
    assert (
        "HTTP 400 VALIDATION_FAILED on POST /api/v1/agent/heartbeat: the control plane says: "
        "telemetry[0].sampled_at: is outside the accepted range Check the node's clock." in agent_log.text
    )
    line = "the control plane says about this node's clock: dropped 1 reading(s) dated up to 15 min ahead"
    assert agent_log.text.count(line) == 1  # once while it lasts, not every beat
    assert "check the node's clock (ntp" in agent_log.text.lower()


# --------------------------------------------------------------------------- item 16: one reference point


def test_a_slow_first_start_never_sends_the_second_beat_within_the_servers_spacing(tmp_path, control_plane):
    """The server limits from the last accepted beat; the agent schedules from the last beat's send.
    An inventory that takes most of the (1 s) interval used to leave 0.2 s before the next beat."""
    slow = threading.Event()

    def inventory(body):
        slow.wait(0.8)  # a slow first start: the publish turn spends 0.8 s before its heartbeat
        return 200, control_plane.publication_reply(body)

    control_plane.scripts["inventory"] = inventory
    running_agent = make_agent(make_config(tmp_path, control_plane.url))
    thread = running(running_agent)
    try:
        control_plane.wait_for("heartbeat", count=3, timeout=15)
    finally:
        stopped(running_agent, thread)
    with control_plane.lock:
        arrived = [at for path, _, _, at in control_plane.received if path.endswith("/heartbeat")]
    interval = 1.0  # FakeControlPlane's heartbeat_interval_seconds
    gaps = [later - earlier for earlier, later in zip(arrived, arrived[1:], strict=False)]
    assert min(gaps) > rate_limits.SPACING * interval, gaps
