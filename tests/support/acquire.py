"""Acquire through the real control plane and agent: a cpu-mode agent on the stand-in Hub, storage
roots and jobs over HTTP, and bounded waits on their state. Agents started here are stopped after
each test (tests/conftest.py), even when the test failed mid-body.

AttemptInThread runs one attempt of the agent's acquire code in this process instead (the unit
tier), with the JobControl an operator's cancel sets."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import requests

import modelforge_agent_acquire as acquire_job
import modelforge_node_agent as agent_core
from app.config import load_settings
from tests.support import ACQUIRE, ADMIN
from tests.support.agent import AgentProcess, mint_token
from tests.support.gunicorn import GunicornServer
from tests.support.hub import StandinHub

_started: list[AgentProcess] = []


def stop_started_agents() -> None:
    """Kill every agent start_agent() started that is still running."""
    while _started:
        agent = _started.pop()
        if agent.process and agent.process.poll() is None:
            agent.process.kill()
            agent.process.wait()


HF_TOKEN = "hf_" + "T0kenForTheStandInHubOnly" * 2


def start_agent(
    tmp_path: Path, server: GunicornServer, hub: StandinHub, prefix: list[str] = (), **env: str
) -> AgentProcess:
    """A cpu-mode agent that advertises artifact.acquire.v1 and talks to the stand-in Hub (run
    through `prefix`, as AgentProcess says)."""
    agent = AgentProcess(
        tmp_path,
        server.url,
        prefix=prefix,
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=mint_token(server.url)["token"],
        HF_ENDPOINT=hub.url,
        MODELFORGE_HF_TOKEN=HF_TOKEN,
        MODELFORGE_AGENT_STALL_SECONDS="5",
        **env,
    )
    agent.start()
    _started.append(agent)
    agent.wait_for(r"enrolled|starting with its stored credential")
    return agent


def online_agent_with_root(tmp_path: Path, server: GunicornServer, hub: StandinHub, **env: str):
    """A started agent whose node is online, with one root at <artifacts>/registry registered for
    it: (agent, node_id, root_dir, root)."""
    agent = start_agent(tmp_path, server, hub, **env)
    node_id = agent.node_id()
    wait_node_online(server, node_id)
    root_dir = agent.home / "artifacts" / "registry"
    root_dir.mkdir()
    return agent, node_id, root_dir, add_root(server, node_id, root_dir)


def api(server: GunicornServer, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, server.url + path, headers=ADMIN, timeout=10, **kwargs)


def add_root(server, node_id: str, container_path: Path, min_free_bytes: int = 0) -> dict:
    body = {"name": "models", "host_path": "/mnt/cache/models", "container_path": str(container_path)}
    response = api(
        server, "POST", f"/api/v1/admin/nodes/{node_id}/storage-roots", json={**body, "min_free_bytes": min_free_bytes}
    )
    assert response.status_code == 201, response.text
    return response.json()


def acquire(server, node_id: str, root_id: str, repo_id: str = "org/tiny", **params) -> dict:
    body = {"type": ACQUIRE, "node_id": node_id, "params": {"repo_id": repo_id, "storage_root_id": root_id, **params}}
    response = api(server, "POST", "/api/v1/admin/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def wait_job(server, job_id: str, states: set[str], timeout: float = 60, **match) -> dict:
    deadline = time.monotonic() + timeout
    job = {}
    while time.monotonic() < deadline:
        job = api(server, "GET", f"/api/v1/admin/jobs/{job_id}").json()
        if job["state"] in states and all(job.get(key) == value for key, value in match.items()):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job never reached {states} {match}: {job}")


def wait_node_online(server, node_id: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api(server, "GET", f"/api/v1/hardware/nodes/{node_id}").json().get("status") == "online":
            return
        time.sleep(0.2)
    raise AssertionError("node never came online")


def progress_interval(server: GunicornServer) -> float:
    """How often the server's agents report progress (J2: a cancel reaches a job within it)."""
    instance = Path(server.env.get("MODELFORGE_INSTANCE_PATH") or ".")
    return float(load_settings(server.env, instance).job_progress_interval_seconds)


def wait_job_fast(server, job_id: str, states: set[str], timeout: float) -> tuple[dict, float]:
    """The job once it is in one of `states`, and when (time.monotonic()) that was first seen:
    polled every 50 ms, so a measured delay is off by at most that."""
    deadline = time.monotonic() + timeout
    job = {}
    while time.monotonic() < deadline:
        job = api(server, "GET", f"/api/v1/admin/jobs/{job_id}").json()
        if job["state"] in states:
            return job, time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"job never reached {states} within {timeout}s: {job}")


class AttemptInThread:
    """One artifact.acquire.v1 attempt (acquire_artifact, as the agent's job thread calls it) in a
    daemon thread, into `<tmp_path>/artifacts/registry`. Both waits are bounded: an attempt that
    does not end fails the test (and is told to stop) instead of hanging it."""

    def __init__(
        self,
        hub_url: str,
        tmp_path: Path,
        params: dict[str, object],
        *,
        token: str | None = None,
        stall: float = 5.0,
        deadline: float | None = None,
        job_id: str = "job-1",
    ) -> None:
        self.artifacts = tmp_path / "artifacts"
        self.root = self.artifacts / "registry"
        self.root.mkdir(parents=True, exist_ok=True)
        self.job_id = job_id
        settings: dict[str, object] = {"endpoint": hub_url, "token": token, "stall_seconds": stall}
        if deadline is not None:
            settings["deadline_seconds"] = deadline
        self.hub = agent_core.HubSettings(**settings)
        self.params = {"container_path": str(self.root), "min_free_bytes": 0, **params}
        self.quarantine = tmp_path / "quarantine"
        self.control = agent_core.JobControl()
        self.result: object = None  # the result dict, or the exception the attempt raised
        self.ended_at: float | None = None
        self.thread = threading.Thread(target=self._run, name=f"attempt-{job_id}", daemon=True)

    def partial(self) -> Path:
        return self.root / ".partial" / self.job_id

    def start(self) -> AttemptInThread:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self.result = acquire_job.acquire_artifact(
                self.params,
                self.hub,
                artifact_dir=self.artifacts,
                quarantine_dir=self.quarantine,
                job_id=self.job_id,
                attempt=1,
                control=self.control,
            )
        except BaseException as error:  # noqa: BLE001 - the test reads what the attempt raised
            self.result = error
        finally:
            self.ended_at = time.monotonic()

    def outcome(self, timeout: float) -> object:
        """The attempt's result or exception once it ends by itself, within `timeout` seconds."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.control.abandon("the test gave up on it")
            raise AssertionError(f"the attempt was still running after {timeout}s")
        return self.result

    def cancel(self, timeout: float = 30) -> float:
        """Cancel as the progress reporter does; how many seconds until the attempt ended."""
        asked = time.monotonic()
        self.control.cancel()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"the attempt was still running {timeout}s after the cancel")
        return self.ended_at - asked
