"""Drain: a node that finishes what runs and takes no new job or deployment, until undrained (S3)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent
from tests.support import ACQUIRE, ADMIN
from tests.support.jobs import add_job, add_root, claim
from tests.support.nodes import agent, beat, online_node
from tests.support.runtime import acquired_artifact, serving_node

COMMIT = "b" * 40


@pytest.fixture
def node(client):
    return online_node(client, capabilities=[ACQUIRE])


def drain(client, node, undo: bool = False):
    response = client.post(f"/api/v1/admin/nodes/{node['id']}/{'undrain' if undo else 'drain'}", headers=ADMIN)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def node_actions(app, node_id: str) -> list[str]:
    with app.app_context():
        found = db.session.scalars(sa.select(AuditEvent).where(AuditEvent.node_id == node_id).order_by(AuditEvent.id))
        return [event.action for event in found if event.action in ("node.draining", "node.undrained")]


def test_a_draining_node_finishes_its_running_job_takes_no_new_one_and_picks_up_again_when_undrained(app, client, node):
    root = add_root(client, node["id"]).get_json()
    running = add_job(client, node["id"], root["id"], revision="main")
    assert claim(client, node).get_json()["job"]["id"] == running["id"]
    queued = add_job(client, node["id"], root["id"], revision="v2")  # asked for before the drain

    drained = drain(client, node)
    assert drained["draining"] is True and drained["draining_since"]
    assert client.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).get_json()["draining"] is True
    refused = client.post(
        "/api/v1/admin/jobs",
        json={
            "type": ACQUIRE,
            "node_id": node["id"],
            "params": {"repo_id": "owner/tiny", "storage_root_id": root["id"]},
        },
        headers=ADMIN,
    )
    assert refused.status_code == 409
    error = refused.get_json()["error"]
    assert error["code"] == "NODE_DRAINING" and "undrain" in error["next_step"] and error["field"] == "node_id"

    # The running job is handed back and finishes; the queued one waits, and no heartbeat announces it.
    assert claim(client, node).get_json()["job"]["id"] == running["id"]
    final = "/data/artifacts/model-registry/models/owner/tiny/" + COMMIT
    result = {"commit": COMMIT, "container_path": final, "files": 1, "total_bytes": 10}
    assert agent(client, node, f"jobs/{running['id']}/complete", attempt=1, result=result).status_code == 200
    assert beat(client, node)["jobs_waiting"] == 0
    assert claim(client, node).status_code == 204
    assert client.get(f"/api/v1/admin/jobs/{queued['id']}", headers=ADMIN).get_json()["state"] == "queued"

    undrained = drain(client, node, undo=True)
    assert undrained["draining"] is False and undrained["draining_since"] is None
    assert beat(client, node)["jobs_waiting"] == 1
    assert claim(client, node).get_json()["job"]["id"] == queued["id"]
    drain(client, node, undo=True)  # undrain again: nothing to change, nothing audited
    assert node_actions(app, node["id"]) == ["node.draining", "node.undrained"]


def test_a_deployment_on_a_draining_node_is_refused_and_nothing_is_stored(app, client):
    node = serving_node(client)
    artifact = acquired_artifact(client, node)
    drain(client, node)
    body = {"name": "drained-chat", "artifact_id": artifact["id"], "model_file": "tiny.gguf"}
    named = client.post("/api/v1/admin/deployments", json={**body, "node_id": node["id"]}, headers=ADMIN)
    assert named.status_code == 409 and named.get_json()["error"]["code"] == "NODE_DRAINING"
    placed = client.post("/api/v1/admin/deployments", json=body, headers=ADMIN)  # S3: placed, it is a reason
    assert placed.status_code == 409 and placed.get_json()["error"]["code"] == "NO_NODE_FITS"
    assert [(each["node_id"], each["reason"]) for each in placed.get_json()["nodes"]] == [
        (node["id"], "node is draining")
    ]
    assert client.get("/api/v1/admin/deployments", headers=ADMIN).get_json()["deployments"] == []
    drain(client, node, undo=True)
    assert client.post("/api/v1/admin/deployments", json=body, headers=ADMIN).status_code == 201


def test_drain_and_undrain_need_the_operator_and_a_known_node(client, node):
    assert client.post(f"/api/v1/admin/nodes/{node['id']}/drain").status_code == 401
    missing = client.post("/api/v1/admin/nodes/00000000-0000-4000-8000-000000000000/drain", headers=ADMIN)
    assert missing.status_code == 404
