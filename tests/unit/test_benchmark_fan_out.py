"""S3: a benchmark without `node_id` runs on every benchmark-eligible node that holds the model.

`POST /api/v1/admin/jobs` with a `runtime.benchmark.v1` body and no `node_id` queues one job on each
node that is benchmark-eligible, may receive work (online, enabled, not draining, compatible: L4),
runs the type (a compatible worker, the type advertised) and holds a copy of the model (the same
repository at the same commit, not being deleted, with the model file) — each job on that node's own
copy. The reply lists the jobs and every other node with the first rule it fails; when no node
qualifies, `409 NO_NODE_FITS` names each node and why, and nothing is queued. Naming a node is the
one-node path, as before. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from jsonschema import Draft202012Validator

from app.api.openapi import document
from app.extensions import db
from app.models import AuditEvent, Job
from tests.support import ACQUIRE, ADMIN, BENCHMARK, EVERY_TYPE, GENERATE, factories
from tests.support.benchmarks import JOBS, benchmark_node, cpu_node, fan_out
from tests.support.nodes import agent, publish_inventory, silence
from tests.support.runtime import COMMIT, acquired_artifact, create, worker

# What every fan-out below asks, defaults filled in as the one-node path stores them.
ASKED = {"model_file": "tiny.gguf", "n_gpu_layers": -1, "prompt_tokens": 512, "generate_tokens": 128, "repetitions": 5}


def by_name(nodes: dict[str, dict], listed: list[dict]) -> dict[str, str]:
    """Each listed node's reason, by the name the test gave the node."""
    names = {node["id"]: name for name, node in nodes.items()}
    return {names[each["node_id"]]: each["reason"] for each in listed}


def job_count(app) -> int:
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(Job))


@pytest.fixture
def fleet(app, client):
    """Ten nodes, each with one thing that decides for or against it; all but one hold the model."""
    nodes = {
        "gpu": benchmark_node(client, "gpu"),
        "cpu": cpu_node(client, "cpu"),
        "not-benchmark": benchmark_node(client, "not-benchmark", {"lab_eligible": True}),
        "disabled": benchmark_node(client, "disabled"),
        "draining": benchmark_node(client, "draining"),
        "offline": benchmark_node(client, "offline"),
        "no-worker": benchmark_node(client, "no-worker", runtime_worker=None),
        "not-advertised": benchmark_node(client, "not-advertised", capabilities=[ACQUIRE]),
        "deleting": benchmark_node(client, "deleting"),
        "no-model": benchmark_node(client, "no-model"),
    }
    copies = {name: acquired_artifact(client, node) for name, node in nodes.items() if name != "no-model"}
    for name, action in (("disabled", "disable"), ("draining", "drain")):
        assert client.post(f"/api/v1/admin/nodes/{nodes[name]['id']}/{action}", headers=ADMIN).status_code == 200
    assert client.delete(f"/api/v1/admin/artifacts/{copies['deleting']['id']}", headers=ADMIN).status_code == 202
    silence(app, nodes["offline"]["id"])
    return nodes, copies


REASONS = {
    "not-benchmark": "not benchmark-eligible (benchmark_eligible is false)",
    "disabled": "node is disabled",
    "draining": "node is draining",
    "offline": "node is offline",
    "no-worker": "no compatible runtime worker answers on the node",
    "not-advertised": "its agent does not advertise runtime.benchmark.v1",
    "deleting": "its copy of owner/tiny-gguf is being deleted",
    "no-model": f"does not hold owner/tiny-gguf at {COMMIT[:12]}",
}


def test_a_benchmark_without_a_node_runs_on_every_qualifying_node_and_says_why_not_elsewhere(app, client, fleet):
    nodes, copies = fleet
    created = fan_out(client, copies["not-benchmark"])  # any node's copy names the model, its own node or not
    assert created.status_code == 201, created.get_json()
    reply = created.get_json()
    assert reply["model"] == {
        "repo_id": "owner/tiny-gguf",
        "repo_type": "model",
        "commit": COMMIT,
        "model_file": "tiny.gguf",
    }
    jobs = {job["node_id"]: job for job in reply["jobs"]}
    assert set(jobs) == {nodes["gpu"]["id"], nodes["cpu"]["id"]}
    for name in ("gpu", "cpu"):
        job = jobs[nodes[name]["id"]]
        assert (job["type"], job["state"], job["max_attempts"]) == (BENCHMARK, "queued", 3)
        assert job["params"] == {**ASKED, "artifact_id": copies[name]["id"]}  # the node's own copy
    assert by_name(nodes, reply["skipped"]) == REASONS
    assert all(each["name"] for each in reply["skipped"])

    # Each job is an ordinary job from here on: the node claims it with its own copy resolved.
    claimed = agent(client, nodes["gpu"], "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]
    assert claimed["id"] == jobs[nodes["gpu"]["id"]]["id"]
    assert claimed["params"]["container_path"] == copies["gpu"]["container_path"]
    with app.app_context():
        audited = db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == "job.created")).all()
        fanned = {(event.node_id, event.details["job_id"]) for event in audited if event.details["type"] == BENCHMARK}
    assert fanned == {(node_id, job["id"]) for node_id, job in jobs.items()}


def test_the_fan_out_reply_is_the_documented_one(client, fleet):
    _, copies = fleet
    schemas = document()["components"]["schemas"]
    created = schemas["JobCreated"]
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in created["anyOf"]} == {"Job", "BenchmarkFanOut"}
    assert "node_id" not in schemas["BenchmarkJobCreate"].get("required", [])
    assert all("node_id" in schemas[name]["required"] for name in ("AcquireJobCreate", "GenerateJobCreate"))
    root = {"$ref": "#/components/schemas/JobCreated", "components": document()["components"]}
    validator = Draft202012Validator(root, format_checker=Draft202012Validator.FORMAT_CHECKER)
    validator.validate(fan_out(client, copies["gpu"], repetitions=2).get_json())


def test_no_node_fits_names_every_node_and_its_reason_and_queues_nothing(app, client, fleet):
    nodes, copies = fleet
    for name in ("gpu", "cpu"):
        assert client.post(f"/api/v1/admin/nodes/{nodes[name]['id']}/disable", headers=ADMIN).status_code == 200
    before = job_count(app)
    refused = fan_out(client, copies["gpu"])
    assert refused.status_code == 409
    body = refused.get_json()
    assert body["error"]["code"] == "NO_NODE_FITS" and body["error"]["field"] == "node_id"
    assert by_name(nodes, body["nodes"]) == {**REASONS, "gpu": "node is disabled", "cpu": "node is disabled"}
    for each in body["nodes"]:
        assert f"{each['name']}: {each['reason']}" in body["error"]["message"]
    assert "benchmark-eligible" in body["error"]["next_step"]
    assert job_count(app) == before


def test_a_copy_without_the_model_file_is_a_reason_too(app, client, fleet):
    nodes, copies = fleet
    refused = fan_out(client, copies["gpu"], model_file="other-q8_0.gguf")
    assert refused.status_code == 409
    reasons = by_name(nodes, refused.get_json()["nodes"])
    assert reasons["gpu"] == reasons["cpu"] == "its copy has no GGUF file “other-q8_0.gguf”"


def test_naming_a_node_is_the_one_node_path_as_before(app, client, fleet):
    nodes, copies = fleet
    params = {"artifact_id": copies["cpu"]["id"], "model_file": "tiny.gguf"}
    named = create(client, BENCHMARK, nodes["cpu"]["id"], params)
    assert named.status_code == 201
    job = named.get_json()
    assert (job["node_id"], job["params"]) == (nodes["cpu"]["id"], {**ASKED, "artifact_id": copies["cpu"]["id"]})
    assert "jobs" not in job and "skipped" not in job
    # The node named is taken at its word, as before: eligibility decides only where nobody named one.
    other_params = {"artifact_id": copies["not-benchmark"]["id"], "model_file": "tiny.gguf"}
    assert create(client, BENCHMARK, nodes["not-benchmark"]["id"], other_params).status_code == 201
    drained = create(client, BENCHMARK, nodes["draining"]["id"], {**params, "artifact_id": copies["draining"]["id"]})
    assert drained.status_code == 409 and drained.get_json()["error"]["code"] == "NODE_DRAINING"
    elsewhere = create(client, BENCHMARK, nodes["gpu"]["id"], params)
    assert elsewhere.status_code == 409 and elsewhere.get_json()["error"]["code"] == "ARTIFACT_NOT_ON_NODE"


def test_only_a_benchmark_may_leave_out_its_node(app, client, fleet):
    _, copies = fleet
    before = job_count(app)
    for job_type, params in (
        (GENERATE, {"artifact_id": copies["gpu"]["id"], "model_file": "tiny.gguf", "prompts": ["Hi"]}),
        (ACQUIRE, {"repo_id": "owner/tiny-gguf", "storage_root_id": copies["gpu"]["storage_root_id"]}),
    ):
        refused = client.post(JOBS, json={"type": job_type, "params": params}, headers=ADMIN)
        assert refused.status_code == 400, job_type
        assert refused.get_json()["error"]["field"] == "node_id"
    unknown = fan_out(client, {"id": "00000000-0000-4000-8000-000000000000"})
    assert unknown.status_code == 404 and unknown.get_json()["error"]["code"] == "ARTIFACT_NOT_FOUND"
    assert job_count(app) == before


def test_a_node_the_run_would_not_fit_is_skipped_by_the_header_estimate(client):
    """S3: a benchmark's model at its context (prompt and generated tokens) must fit the node's
    memory by the GGUF header's estimate, as a deployment's must; without facts it is not guessed."""
    roomy = cpu_node(client, "roomy")
    cramped = cpu_node(client, "cramped")
    inventory = factories.inventory_body([], hostname="cramped", memory_total_bytes=32 * 2**20)["inventory"]
    publish_inventory(client, cramped, inventory=inventory, capabilities=EVERY_TYPE, runtime_worker=worker())
    copies = {name: acquired_artifact(client, node) for name, node in (("roomy", roomy), ("cramped", cramped))}
    reply = fan_out(client, copies["roomy"])
    assert reply.status_code == 201, reply.get_json()
    assert [job["node_id"] for job in reply.get_json()["jobs"]] == [roomy["id"]]
    (skipped,) = reply.get_json()["skipped"]
    assert skipped["node_id"] == cramped["id"]
    assert re.fullmatch(r"needs [\d.]+ MiB, has 32\.0 MiB free", skipped["reason"]), skipped
