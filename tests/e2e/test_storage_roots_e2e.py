"""Storage roots checked end to end (J1, issue 25): the real gunicorn, the real agent process (made
to obey file modes as any user does, even when the tests run as root) and the stand-in Hub.

A root outside the agent's artifact directory is refused; a missing root is created by the agent
and takes a download; a root whose parent the agent may not write to shows why, on its row in
the console too, and takes no acquire job."""

from __future__ import annotations

import os
import time

import requests

from tests.support import ACQUIRE, OPERATOR_KEY
from tests.support.acquire import acquire, api, start_agent, wait_job, wait_node_online
from tests.support.agent import without_permission_override
from tests.support.console import csrf_from

FILES = {"tiny.gguf": b"GGUF" + b"\x00" * 4092, "README.md": b"# tiny\n"}


def register(server, node_id: str, name: str, container_path) -> requests.Response:
    body = {"name": name, "host_path": f"/mnt/cache/{name}", "container_path": str(container_path)}
    return api(server, "POST", f"/api/v1/admin/nodes/{node_id}/storage-roots", json={**body, "min_free_bytes": 0})


def wait_observed(server, node_id: str, root_id: str, timeout: float = 20, **expected) -> dict:
    """The root's `observed` once the agent has reported it as `expected` says (J1)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        roots = api(server, "GET", f"/api/v1/admin/nodes/{node_id}/storage-roots").json()["storage_roots"]
        seen = next(root["observed"] for root in roots if root["id"] == root_id)
        if seen is not None and all(expected[key](seen[key]) for key in expected):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"the agent never reported {sorted(expected)} as expected: {seen}")


def test_roots_are_checked_created_by_the_agent_or_refused_with_why(tmp_path, jobs_server, hub):
    commit = hub.add_repo("org/tiny", FILES)
    agent = start_agent(tmp_path, jobs_server, hub, prefix=without_permission_override())
    node_id = agent.node_id()
    wait_node_online(jobs_server, node_id)
    artifacts = agent.home / "artifacts"

    # 1. Outside the artifact directory the agent reported: refused, nothing stored.
    outside = register(jobs_server, node_id, "elsewhere", tmp_path / "elsewhere")
    assert outside.status_code == 400, outside.text
    error = outside.json()["error"]
    assert (error["code"], error["field"]) == ("STORAGE_ROOT_OUTSIDE_ARTIFACT_DIR", "container_path")
    assert str(artifacts) in error["message"] and f"{artifacts}/elsewhere" in error["next_step"]
    assert api(jobs_server, "GET", f"/api/v1/admin/nodes/{node_id}/storage-roots").json()["storage_roots"] == []

    # 2. Missing, below a parent the agent may write to: the agent makes it, and it takes a download.
    fresh_dir = artifacts / "fresh"
    fresh = register(jobs_server, node_id, "fresh", fresh_dir)
    assert fresh.status_code == 201, fresh.text
    assert fresh.json()["checked_against"] == str(artifacts) and not fresh_dir.exists()
    seen = wait_observed(jobs_server, node_id, fresh.json()["id"], exists=bool, writable=bool)
    assert seen["problem"] is None and fresh_dir.is_dir()
    done = wait_job(jobs_server, acquire(jobs_server, node_id, fresh.json()["id"])["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    assert (fresh_dir / "models" / "org" / "tiny" / commit / "tiny.gguf").read_bytes() == FILES["tiny.gguf"]

    # 3. Missing, below a parent the agent may not write to: refused with why, and no job.
    locked = artifacts / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        refused = register(jobs_server, node_id, "locked", locked / "models")
        assert refused.status_code == 201, refused.text
        seen = wait_observed(
            jobs_server, node_id, refused.json()["id"], problem=lambda text: (text or "").startswith("parent not")
        )
        assert (seen["exists"], seen["writable"]) == (False, False)
        assert seen["problem"].startswith(
            f"parent not writable: the agent (uid {os.getuid()}) cannot create models in {locked}"
        )
        assert not (locked / "models").exists()
        params = {"repo_id": "org/tiny", "storage_root_id": refused.json()["id"]}
        queued = api(
            jobs_server, "POST", "/api/v1/admin/jobs", json={"type": ACQUIRE, "node_id": node_id, "params": params}
        )
        assert queued.status_code == 409, queued.text
        error = queued.json()["error"]
        assert error["code"] == "STORAGE_ROOT_UNAVAILABLE" and "parent not writable" in error["message"]
        jobs = api(jobs_server, "GET", f"/api/v1/admin/jobs?node_id={node_id}").json()["jobs"]
        assert [job["id"] for job in jobs] == [done["id"]]  # the refused acquire queued nothing

        # The console shows the refusal on the root's row, and the acquire form does not offer it.
        console = requests.Session()
        login = console.get(jobs_server.url + "/login", timeout=10)
        signed = console.post(
            jobs_server.url + "/login",
            data={"csrf_token": csrf_from(login.text), "operator_key": OPERATOR_KEY},
            timeout=10,
        )
        assert signed.status_code == 200, signed.text
        page = console.get(f"{jobs_server.url}/hardware/nodes/{node_id}/storage", timeout=10)
        assert page.status_code == 200
        assert (
            f"Refused: parent not writable: the agent (uid {os.getuid()}) cannot create models in {locked}" in page.text
        )
        assert f'<option disabled value="{refused.json()["id"]}">' in page.text
        assert f'<option selected value="{fresh.json()["id"]}">' in page.text
    finally:
        locked.chmod(0o755)  # so tmp_path can be cleaned up
    agent.stop()
