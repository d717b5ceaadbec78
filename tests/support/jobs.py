"""Acquire jobs through the Flask test client: a storage root, a job, and the agent's claim."""

from __future__ import annotations

from tests.support import ACQUIRE, ADMIN
from tests.support.nodes import agent


def add_root(client, node_id, **overrides):
    body = {
        "name": "models",
        "host_path": "/mnt/cache/appdata/modelforge/model-registry",
        "container_path": "/data/artifacts/model-registry",
        "min_free_bytes": 10 * 2**30,
        **overrides,
    }
    return client.post(f"/api/v1/admin/nodes/{node_id}/storage-roots", json=body, headers=ADMIN)


def add_job(client, node_id, root_id, **params):
    body = {
        "type": ACQUIRE,
        "node_id": node_id,
        "params": {"repo_id": "owner/tiny", "storage_root_id": root_id, **params},
    }
    response = client.post("/api/v1/admin/jobs", json=body, headers=ADMIN)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def claim(client, node):
    return agent(client, node, "jobs/claim", capabilities=[ACQUIRE])
