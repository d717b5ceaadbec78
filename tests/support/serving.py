"""The runtime worker beside a real agent: started workers (killed after each test by
tests/conftest.py), waits for the node to advertise runtime job types, and runtime jobs over HTTP."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.acquire import api
from tests.support.worker import WorkerProcess


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
