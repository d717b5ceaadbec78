"""Deleting an artifact (J5): refused while in use, then an artifact.delete.v1 job for its node,
and the artifact leaves the list once the agent has removed it. SQLite and PostgreSQL."""

from __future__ import annotations

import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent
from tests.support import ADMIN, BENCHMARK
from tests.support.nodes import agent
from tests.support.runtime import ARTIFACT_PATH, acquired_artifact, create, serving_node

DELETE = "artifact.delete.v1"
DEPLOYMENTS = "/api/v1/admin/deployments"


def listed(client, node) -> list[dict]:
    return client.get(f"/api/v1/admin/nodes/{node['id']}/artifacts", headers=ADMIN).get_json()["artifacts"]


def test_an_artifact_in_use_is_refused_then_deleted_by_its_node_and_leaves_the_list(app, client):
    node = serving_node(client)
    artifact = acquired_artifact(client, node)
    body = {"name": "in-use", "artifact_id": artifact["id"], "model_file": "tiny.gguf"}
    deployment = client.post(DEPLOYMENTS, json=body, headers=ADMIN).get_json()

    refused = client.delete(f"/api/v1/admin/artifacts/{artifact['id']}", headers=ADMIN)
    assert refused.status_code == 409
    error = refused.get_json()["error"]
    assert error["code"] == "ARTIFACT_IN_USE" and "deployment in-use" in error["message"] and error["next_step"]
    as_job = create(client, DELETE, node["id"], {"artifact_id": artifact["id"]})  # the jobs API guards it too
    assert as_job.status_code == 409 and as_job.get_json()["error"]["code"] == "ARTIFACT_IN_USE"

    assert client.delete(f"{DEPLOYMENTS}/{deployment['id']}", headers=ADMIN).status_code == 202
    assert agent(client, node, f"deployments/{deployment['id']}/status", state="stopped").status_code == 200
    asked = client.delete(f"/api/v1/admin/artifacts/{artifact['id']}", headers=ADMIN)
    assert asked.status_code == 202
    job = asked.get_json()
    assert (job["type"], job["node_id"], job["state"]) == (DELETE, node["id"], "queued")
    again = client.delete(f"/api/v1/admin/artifacts/{artifact['id']}", headers=ADMIN)
    assert again.status_code == 202 and again.get_json()["id"] == job["id"]  # one delete at a time
    assert listed(client, node)[0]["deleting_job_id"] == job["id"]
    # Nothing new starts on it meanwhile.
    benchmark = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"})
    assert benchmark.status_code == 409 and benchmark.get_json()["error"]["code"] == "ARTIFACT_DELETING"
    redeploy = client.post(DEPLOYMENTS, json={**body, "name": "again"}, headers=ADMIN)
    assert redeploy.status_code == 409 and redeploy.get_json()["error"]["code"] == "ARTIFACT_DELETING"

    claimed = agent(client, node, "jobs/claim", capabilities=[DELETE]).get_json()["job"]
    assert claimed["id"] == job["id"] and claimed["params"]["container_path"] == ARTIFACT_PATH
    result = {"artifact_id": artifact["id"], "removed_files": 3, "freed_bytes": 402112}
    assert agent(client, node, f"jobs/{job['id']}/complete", attempt=1, result=result).status_code == 200
    assert listed(client, node) == []
    done = client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()
    assert done["state"] == "succeeded" and done["result"]["repo_id"] == "owner/tiny-gguf"
    assert done["result"]["freed_bytes"] == 402112
    with app.app_context():
        event = db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == "artifact.deleted")).one()
    assert event.details["artifact_id"] == artifact["id"] and event.details["job_id"] == job["id"]
    missing = client.delete(f"/api/v1/admin/artifacts/{artifact['id']}", headers=ADMIN)
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "ARTIFACT_NOT_FOUND"


def test_a_failed_delete_leaves_the_artifact_listed_and_it_can_be_asked_again(client):
    node = serving_node(client)
    artifact = acquired_artifact(client, node)
    job = client.delete(f"/api/v1/admin/artifacts/{artifact['id']}", headers=ADMIN).get_json()
    agent(client, node, "jobs/claim", capabilities=[DELETE])
    error = {"code": "ARTIFACT_PATH_UNSAFE", "message": "a symlink where a directory belongs"}
    assert agent(client, node, f"jobs/{job['id']}/fail", attempt=1, error=error, retryable=False).status_code == 200
    shown = listed(client, node)
    assert [item["id"] for item in shown] == [artifact["id"]] and shown[0]["deleting_job_id"] is None
    assert client.delete(f"/api/v1/admin/artifacts/{artifact['id']}", headers=ADMIN).get_json()["id"] != job["id"]
