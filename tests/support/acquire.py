"""Acquire through the real control plane and agent: a cpu-mode agent on the stand-in Hub, storage
roots and jobs over HTTP, and bounded waits on their state. Agents started here are stopped after
each test (tests/conftest.py), even when the test failed mid-body."""

from __future__ import annotations

import time
from pathlib import Path

import requests

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


def start_agent(tmp_path: Path, server: GunicornServer, hub: StandinHub, **env: str) -> AgentProcess:
    """A cpu-mode agent that advertises artifact.acquire.v1 and talks to the stand-in Hub."""
    agent = AgentProcess(
        tmp_path,
        server.url,
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
