"""Deployments end to end: the control plane holds the desired state, the agent makes the runtime
worker hold it (S2, W1).

gunicorn, the agent process and the runtime worker process on a tiny GGUF acquired through the
stand-in Hub; the deployment is created through the admin API and followed there.
"""

from __future__ import annotations

import openai

from tests.support import wait_until
from tests.support.acquire import api
from tests.support.serving import mint_key, runtime_node, start_worker, wait_capabilities
from tests.support.worker import call

SERVE = "runtime.serve.v1"
LOAD_TIMEOUT = 60.0


def deployment(server, deployment_id: str) -> dict:
    answer = api(server, "GET", f"/api/v1/admin/deployments/{deployment_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def wait_state(server, deployment_id: str, states: set[str], timeout: float = LOAD_TIMEOUT) -> dict:
    return wait_until(
        lambda: (lambda found: found if found["state"] in states else None)(deployment(server, deployment_id)),
        lambda: f"deployment {deployment_id} in {states}: it is {deployment(server, deployment_id)}",
        timeout,
    )


def create(server, artifact_id: str, name: str, model_file: str) -> dict:
    """POST a deployment of `model_file` with no node named: it goes to the node that holds the artifact."""
    created = api(
        server,
        "POST",
        "/api/v1/admin/deployments",
        json={"name": name, "artifact_id": artifact_id, "model_file": model_file},
    )
    assert created.status_code == 201, created.text
    return created.json()


def worker_deployments(worker) -> dict[str, str]:
    code, listed = call(worker.socket_path, "GET", "/v1/deployments")
    assert code == 200, listed
    return {each["id"]: each["state"] for each in listed["deployments"]}


def test_a_deployment_is_loaded_by_the_node_and_survives_a_worker_restart(
    tmp_path, socket_dir, jobs_server, hub, model_repo
):
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    wait_capabilities(jobs_server, node_id, {SERVE})  # a worker that serves answers on this node

    created = create(jobs_server, artifact_id, "tiny", "tiny.gguf")
    deployment_id = created["id"]
    assert created["state"] == "pending" and created["node_id"] == node_id  # the node that holds the artifact

    ready = wait_state(jobs_server, deployment_id, {"ready", "failed"})
    assert ready["state"] == "ready", ready
    assert ready["measured"]["load_seconds"] > 0 and ready["measured"]["memory_bytes"] > 0
    assert ready["measured"]["context_length"] == 2048
    assert worker_deployments(worker) == {deployment_id: "ready"}

    # The worker restarts and has lost its models: the agent loads the deployment again.
    assert worker.stop() == 0
    worker = start_worker(worker.socket_path, worker.artifact_dir, tmp_path / "second")
    wait_until(lambda: worker_deployments(worker).get(deployment_id) == "ready", "the deployment loaded again", 30)
    assert wait_state(jobs_server, deployment_id, {"ready"})["state"] == "ready"

    # Stopping it: the node stops it in the worker, and says so.
    stopping = api(jobs_server, "DELETE", f"/api/v1/admin/deployments/{deployment_id}")
    assert stopping.status_code == 202 and stopping.json()["state"] == "stopping", stopping.text
    assert wait_state(jobs_server, deployment_id, {"stopped"})["state"] == "stopped"
    assert worker_deployments(worker).get(deployment_id) in (None, "stopped")
    events = api(jobs_server, "GET", f"/api/v1/admin/audit-events?node_id={node_id}").json()["audit_events"]
    actions = [event["action"] for event in events if event["action"].startswith("deployment.")]
    assert "deployment.ready" in actions and actions[0] == "deployment.stopped", actions
    assert "deployments: tiny (ready)" in agent.log()


def test_a_deployment_of_a_file_the_node_did_not_verify_is_refused_before_reaching_the_node(
    tmp_path, socket_dir, jobs_server, hub, model_repo
):
    """S3: the node listed each GGUF file it verified (with its header) when it acquired the
    artifact, so a file it does not hold is refused at once, naming the node and why."""
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    wait_capabilities(jobs_server, node_id, {SERVE})
    body = {"name": "missing", "artifact_id": artifact_id, "model_file": "missing.gguf"}
    refused = api(jobs_server, "POST", "/api/v1/admin/deployments", json=body)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "NO_NODE_FITS", refused.text
    (verdict,) = refused.json()["nodes"]
    assert verdict["node_id"] == node_id and verdict["reason"] == "its artifact has no GGUF file 'missing.gguf'"
    assert api(jobs_server, "GET", "/api/v1/admin/deployments").json()["deployments"] == []
    assert worker_deployments(worker) == {}


def test_an_idle_deployment_is_unloaded_and_the_next_request_loads_it_again_with_the_same_answer(
    tmp_path, socket_dir, jobs_server, hub, model_repo
):
    """S2: ready → unloaded after idle_unload_seconds (audited), and a request to the unloaded
    model is answered once the node has loaded it again: the same greedy text as before."""
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    wait_capabilities(jobs_server, node_id, {SERVE})
    body = {"name": "napper", "artifact_id": artifact_id, "model_file": "tiny.gguf", "idle_unload_seconds": 2}
    created = api(jobs_server, "POST", "/api/v1/admin/deployments", json=body)
    assert created.status_code == 201, created.text
    deployment_id = created.json()["id"]
    wait_state(jobs_server, deployment_id, {"ready"})
    wait_until(lambda: "relay: connected" in agent.log(), "the agent's relay connection", 20)
    with openai.OpenAI(base_url=jobs_server.url + "/v1", api_key=mint_key(jobs_server), max_retries=0) as client:
        ask = {"model": "napper", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
        first = client.completions.create(**ask).choices[0].text
        unloaded = wait_state(jobs_server, deployment_id, {"unloaded"}, timeout=20)
        assert worker_deployments(worker)[deployment_id] == "unloaded"
        assert unloaded["measured"]["load_seconds"] > 0  # what it measured when loaded stays known
        assert client.completions.create(**ask).choices[0].text == first  # loaded again for it
    wait_state(jobs_server, deployment_id, {"ready"})
    events = api(jobs_server, "GET", "/api/v1/admin/audit-events").json()["audit_events"]
    actions = [
        event["action"] for event in events if (event.get("details") or {}).get("deployment_id") == deployment_id
    ]
    assert "deployment.unloaded" in actions
