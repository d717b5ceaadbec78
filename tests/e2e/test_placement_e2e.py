"""S3 across real agents: five `python -m modelforge_node_agent` processes against gunicorn, each a
node with its own decisive fact — one that can take the model, one draining, one not eligible for
the lab tier, one without the model, one that went silent — and a real runtime worker answering
their compatibility. A deployment without a node goes to the only node that fits, and when none
fits `409 NO_NODE_FITS` gives every node's own reason. SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest

from tests import support
from tests.support import wait_until
from tests.support.acquire import acquire, add_root, api, wait_job, wait_node_online
from tests.support.agent import AgentProcess, mint_token
from tests.support.gunicorn import GunicornServer
from tests.support.serving import SERVE, start_worker, wait_capabilities

NAMES = ("fits", "draining", "not-lab", "no-model", "silent")


def start_node(tmp_path, server, hub, name: str, socket: str, **eligibility: bool) -> tuple[AgentProcess, str]:
    token = mint_token(server.url, eligibility=eligibility)["token"]
    agent = AgentProcess(
        tmp_path,
        server.url,
        name,
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=token,
        HF_ENDPOINT=hub.url,
        MODELFORGE_AGENT_WORKER_SOCKET=socket,
    ).start()
    agent.wait_for(r"enrolled")
    node_id = agent.node_id()
    wait_node_online(server, node_id)
    return agent, node_id


@pytest.fixture
def server(database_url, tmp_path):
    """jobs_server's control plane on SQLite and on PostgreSQL, a node offline 20 s after its last heartbeat."""
    running = GunicornServer(
        database_url,
        tmp_path,
        workers=2,
        MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1",
        MODELFORGE_SWEEP_INTERVAL_SECONDS="1",
        MODELFORGE_JOB_LEASE_SECONDS=str(support.JOB_LEASE_SECONDS),
        MODELFORGE_NODE_STALE_AFTER_SECONDS="10",
        MODELFORGE_NODE_OFFLINE_AFTER_SECONDS="20",
    )
    running.start()
    yield running
    running.stop()


def test_a_deployment_goes_to_the_one_node_that_fits_and_every_other_says_why(
    tmp_path, socket_dir, server, hub, model_repo
):
    jobs_server = server
    (tmp_path / "fits" / "artifacts").mkdir(parents=True)  # the worker reads the node that fits' models
    worker = start_worker(socket_dir / "worker.sock", tmp_path / "fits" / "artifacts", tmp_path)
    agents, nodes = {}, {}
    try:
        for name in NAMES:
            eligibility = {"lab_eligible": False} if name == "not-lab" else {}
            agents[name], nodes[name] = start_node(
                tmp_path, jobs_server, hub, name, str(worker.socket_path), **eligibility
            )
        for name in NAMES:
            if name == "no-model":
                continue
            root_dir = agents[name].home / "artifacts" / "registry"
            root_dir.mkdir()
            root = add_root(jobs_server, nodes[name], root_dir)
            job = acquire(jobs_server, nodes[name], root["id"], repo_id=model_repo)
            assert wait_job(jobs_server, job["id"], {"succeeded", "failed"})["state"] == "succeeded"
        for name in NAMES:
            wait_capabilities(jobs_server, nodes[name], {SERVE})
        artifacts = api(jobs_server, "GET", f"/api/v1/admin/nodes/{nodes['silent']}/artifacts").json()["artifacts"]
        named_by = artifacts[0]["id"]  # any node's copy names the model
        assert api(jobs_server, "POST", f"/api/v1/admin/nodes/{nodes['draining']}/drain").status_code == 200
        agents["silent"].stop()
        wait_until(
            lambda: api(jobs_server, "GET", f"/api/v1/hardware/nodes/{nodes['silent']}").json()["status"] == "offline",
            "the silent node to be offline",
            60,
        )

        body = {"name": "placed", "artifact_id": named_by, "model_file": "tiny.gguf"}
        created = api(jobs_server, "POST", "/api/v1/admin/deployments", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["node_id"] == nodes["fits"]
        assert created.json()["placement"]["why"].startswith("placed; fits: needs ")

        assert api(jobs_server, "POST", f"/api/v1/admin/nodes/{nodes['fits']}/drain").status_code == 200
        refused = api(jobs_server, "POST", "/api/v1/admin/deployments", json={**body, "name": "nowhere"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "NO_NODE_FITS", refused.text
        names = {node_id: name for name, node_id in nodes.items()}
        reasons = {names[verdict["node_id"]]: verdict["reason"] for verdict in refused.json()["nodes"]}
        assert reasons == {
            "fits": "node is draining",
            "draining": "node is draining",
            "not-lab": "not eligible for the lab tier (lab_eligible is false)",
            "no-model": f"does not hold {model_repo} at {artifacts[0]['commit'][:12]}",
            "silent": "node is offline",
        }
    finally:
        for agent in agents.values():
            agent.stop()
        worker.kill()
