"""The runtime worker beside a real agent: started workers (killed after each test by
tests/conftest.py), a whole runtime node (worker, agent, one acquired artifact), waits for the
node to advertise runtime job types, and runtime jobs over HTTP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import BENCHMARK, GENERATE, wait_until
from tests.support.acquire import acquire, add_root, api, start_agent, wait_job, wait_node_online
from tests.support.worker import WorkerProcess

if TYPE_CHECKING:
    from tests.support.gunicorn import GunicornServer
    from tests.support.hub import StandinHub


SERVE = "runtime.serve.v1"
LOAD_TIMEOUT = 60.0
NAME = "tiny-chat"


def start_worker(socket_path: Path, artifact_dir: Path, log_dir: Path) -> WorkerProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    worker = WorkerProcess(socket_path, artifact_dir, log_dir / "worker.log").start()
    _workers.append(worker)
    return worker


def wait_capabilities(server, node_id: str, wanted: set[str], timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    node = {}
    while time.monotonic() < deadline:
        node = api(server, "GET", f"/api/v1/hardware/nodes/{node_id}").json()
        if wanted <= set(node.get("capabilities") or []):
            return node
        time.sleep(0.2)
    raise AssertionError(f"the node never advertised {wanted}: {node.get('capabilities')}")


def create(server, job_type: str, node_id: str, **params) -> dict:
    response = api(server, "POST", "/api/v1/admin/jobs", json={"type": job_type, "node_id": node_id, "params": params})
    assert response.status_code == 201, response.text
    return response.json()


_workers: list[WorkerProcess] = []


def stop_started_workers() -> None:
    """Kill every worker start_worker() started."""
    while _workers:
        _workers.pop().kill()


def runtime_node(tmp_path: Path, socket_dir: Path, server: GunicornServer, hub: StandinHub, repo_id: str):
    """A worker serving the agent's artifact directory, the agent beside it, and one acquired artifact."""
    artifacts = tmp_path / "agent" / "artifacts"
    artifacts.mkdir(parents=True)
    worker = start_worker(socket_dir / "worker.sock", artifacts, tmp_path)
    agent = start_agent(tmp_path, server, hub, MODELFORGE_AGENT_WORKER_SOCKET=str(worker.socket_path))
    node_id = agent.node_id()
    wait_node_online(server, node_id)
    root_dir = artifacts / "registry"
    root_dir.mkdir()
    root = add_root(server, node_id, root_dir)
    acquired = wait_job(server, acquire(server, node_id, root["id"], repo_id=repo_id)["id"], {"succeeded", "failed"})
    assert acquired["state"] == "succeeded", acquired
    wait_capabilities(server, node_id, {BENCHMARK, GENERATE})
    return agent, worker, node_id, acquired["result"]["artifact_id"]


def mint_key(server) -> str:
    minted = api(server, "POST", "/api/v1/admin/api-keys", json={"name": "e2e"})
    assert minted.status_code == 201, minted.text
    return minted.json()["key"]


def deploy_ready(server, artifact_id: str, name: str = NAME) -> dict:
    """A deployment with the longest context, so a generation without `max_tokens` runs for seconds."""
    body = {"name": name, "artifact_id": artifact_id, "model_file": "tiny.gguf", "context_length": 8192}
    created = api(server, "POST", "/api/v1/admin/deployments", json=body)
    assert created.status_code == 201, created.text
    deployment_id = created.json()["id"]

    def ready():
        found = api(server, "GET", f"/api/v1/admin/deployments/{deployment_id}").json()
        assert found["state"] != "failed", found
        return found if found["state"] == "ready" else None

    return wait_until(ready, f"deployment {name} ready", LOAD_TIMEOUT)
