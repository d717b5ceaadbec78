"""Runtime jobs and the runtime worker, through the admin and agent APIs (W1, W2, J2, A1, A5).

A runtime job names an artifact of its own node; the node gets runtime.* jobs only while its agent
reports a COMPATIBLE worker; results are checked against the job's type and kept per node and model.
Everything runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent, Job, NodeLease
from tests.support import ACQUIRE, ADMIN, BENCHMARK, EVERY_TYPE, GENERATE, factories
from tests.support.bodies import WRONG_BENCHMARK_RESULTS, WRONG_JOB_BODIES
from tests.support.nodes import agent, beat, online_node, publish_inventory
from tests.support.runtime import (
    ARTIFACT_PATH,
    COMMIT,
    ENGINE,
    GOOD_GENERATE,
    acquired_artifact,
    benchmark_result,
    create,
    generate_result,
    rate,
    worker,
)


def job_count(app) -> int:
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(Job))


def api_job(client, job_id) -> dict:
    return client.get(f"/api/v1/admin/jobs/{job_id}", headers=ADMIN).get_json()


def described(client, node) -> dict:
    return client.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).get_json()


def complete(client, node, job_id, result, attempt=1):
    """POST …/complete; an infinite number goes as 1e400, which JSON parsers read as infinity."""
    body = json.dumps({**factories.versions(), "attempt": attempt, "result": result}).replace("Infinity", "1e400")
    headers = {**node["auth"], "Content-Type": "application/json"}
    return client.post(f"/api/v1/agent/jobs/{job_id}/complete", data=body, headers=headers)


@pytest.fixture
def node(client):
    """An online node whose agent advertises every job type and reports a compatible worker."""
    return online_node(client, capabilities=EVERY_TYPE, runtime_worker=worker())


@pytest.fixture
def artifact(client, node):
    return acquired_artifact(client, node)


# --------------------------------------------------------------------------- creating runtime jobs


def test_a_runtime_job_takes_its_params_with_defaults_and_names_its_artifact(client, node, artifact):
    response = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"})
    assert response.status_code == 201, response.get_json()
    assert response.get_json()["params"] == {
        "artifact_id": artifact["id"],
        "model_file": "tiny.gguf",
        "n_gpu_layers": -1,
        "prompt_tokens": 512,
        "generate_tokens": 128,
        "repetitions": 5,
    }
    prompts = {"artifact_id": artifact["id"].upper(), "model_file": "sub/dir/tiny.gguf", "prompts": [" Hi "]}
    generate = create(client, GENERATE, node["id"], prompts).get_json()
    # A prompt is sent as written (outer spaces included); the artifact id is a UUID, read lowercase.
    assert generate["params"] == {**prompts, "artifact_id": artifact["id"], "max_tokens": 64}


def test_a_runtime_job_is_refused_for_an_unknown_artifact_or_one_on_another_node(app, client, node, artifact):
    unknown = create(client, BENCHMARK, node["id"], {"artifact_id": str(uuid.uuid4()), "model_file": "tiny.gguf"})
    assert unknown.status_code == 404
    assert unknown.get_json()["error"]["code"] == "ARTIFACT_NOT_FOUND"

    other = online_node(client, capabilities=EVERY_TYPE, runtime_worker=worker())
    before = job_count(app)
    elsewhere = create(
        client, GENERATE, other["id"], {"artifact_id": artifact["id"], "model_file": "t.gguf", "prompts": ["Hi"]}
    )
    assert elsewhere.status_code == 409
    error = elsewhere.get_json()["error"]
    assert error["code"] == "ARTIFACT_NOT_ON_NODE"
    assert "another node" in error["message"] and "this node" in error["next_step"]
    assert job_count(app) == before


@pytest.mark.parametrize(("job_type", "params", "field"), WRONG_JOB_BODIES)
def test_each_type_takes_only_its_own_params_and_a_refusal_names_the_field(
    app, client, node, artifact, job_type, params, field
):
    body = {"node_id": node["id"], "params": {"artifact_id": artifact["id"], **params}}
    if job_type is not None:
        body["type"] = job_type
    before = job_count(app)
    response = client.post("/api/v1/admin/jobs", json=body, headers=ADMIN)
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert (error["code"], error["field"]) == ("VALIDATION_FAILED", field)
    assert error["message"].startswith(field + ": ")
    assert job_count(app) == before


def test_a_model_file_refusal_says_which_rule(client, node, artifact):
    response = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "a/../b.gguf"})
    assert "inside the artifact" in response.get_json()["error"]["message"]


# --------------------------------------------------------------------------- W1: gating by the worker


@pytest.mark.parametrize(
    ("report", "answer"),
    [
        ({"runtime_worker": worker(0)}, "TOO_OLD"),
        ({"runtime_worker": worker(2)}, "TOO_NEW"),
        ({"runtime_worker": worker("garbage")}, "UNKNOWN"),
        ({"runtime_worker": worker(None)}, "UNKNOWN"),
        ({"runtime_worker": None, "runtime_worker_problem": "no socket at /run/modelforge/worker.sock"}, None),
        ({}, None),  # an agent from before the runtime worker says nothing of one
    ],
)
def test_no_runtime_job_reaches_a_node_without_a_compatible_worker(app, client, node, artifact, report, answer):
    job = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"}).get_json()
    publish_inventory(client, node, capabilities=EVERY_TYPE, **report)

    shown = described(client, node)
    assert ACQUIRE in shown["capabilities"] and BENCHMARK not in shown["capabilities"]
    if answer is None:
        assert shown["runtime_worker"] == (
            None
            if not report
            else {"reported": None, "problem": report["runtime_worker_problem"], "compatibility": None}
        )
    else:
        compatibility = shown["runtime_worker"]["compatibility"]
        assert compatibility["answer"] == answer and compatibility["supported"] == [1]
        assert compatibility["protocol_version"] == report["runtime_worker"]["protocol_version"]
        assert "no runtime jobs" in compatibility["action"]
    assert beat(client, node)["jobs_waiting"] == 0
    # A claim that names runtime types anyway gets nothing: the lease's worker answer decides.
    assert agent(client, node, "jobs/claim", capabilities=EVERY_TYPE).status_code == 204
    assert api_job(client, job["id"])["state"] == "queued"


def test_a_compatible_worker_gets_the_job_with_its_artifact_resolved_and_completes_it(app, client, node, artifact):
    params = {"artifact_id": artifact["id"], "model_file": "tiny.gguf", "n_gpu_layers": 0, "repetitions": 3}
    job = create(client, BENCHMARK, node["id"], params).get_json()
    shown = described(client, node)
    assert shown["runtime_worker"]["compatibility"]["answer"] == "COMPATIBLE"
    assert shown["runtime_worker"]["reported"] == worker()
    assert beat(client, node)["jobs_waiting"] == 1

    leased = agent(client, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]
    assert (leased["id"], leased["type"], leased["attempt"]) == (job["id"], BENCHMARK, 1)
    assert leased["params"] == {
        **params,
        "prompt_tokens": 512,
        "generate_tokens": 128,
        "container_path": ARTIFACT_PATH,
    }

    progress = {"bytes_done": 0, "files_done": 0, "phase": "prompt", "steps_done": 2, "steps_total": 7}
    assert agent(client, node, f"jobs/{job['id']}/progress", attempt=1, progress=progress).status_code == 200
    stored = api_job(client, job["id"])["progress"]
    assert {key: stored[key] for key in ("phase", "steps_done", "steps_total")} == {
        "phase": "prompt",
        "steps_done": 2,
        "steps_total": 7,
    }

    result = benchmark_result(artifact["id"], repetitions=3, prompt_tokens_per_second=rate(8000.0, 3))
    done = agent(client, node, f"jobs/{job['id']}/complete", attempt=1, result=result)
    assert done.status_code == 200, done.get_json()
    finished = api_job(client, job["id"])
    assert finished["state"] == "succeeded"
    assert finished["result"]["repo_id"] == "owner/tiny-gguf" and finished["result"]["commit"] == COMMIT
    assert finished["result"]["prompt_tokens_per_second"]["samples"] == [8000.0] * 3


def test_an_acquire_progress_report_is_stored_as_before(client, node):
    root = {"name": "m", "host_path": "/mnt/m", "container_path": "/data/artifacts/m", "min_free_bytes": 0}
    root = client.post(f"/api/v1/admin/nodes/{node['id']}/storage-roots", json=root, headers=ADMIN).get_json()
    job = create(client, ACQUIRE, node["id"], {"repo_id": "o/n", "storage_root_id": root["id"]}).get_json()
    agent(client, node, "jobs/claim", capabilities=[ACQUIRE])
    progress = {"bytes_done": 10, "bytes_total": 100, "files_done": 1, "files_total": 3}
    agent(client, node, f"jobs/{job['id']}/progress", attempt=1, progress=progress)
    assert set(api_job(client, job["id"])["progress"]) == {*progress, "updated_at"}


def test_a_worker_change_is_audited_once_not_on_every_inventory(app, client, node):
    for report in (
        {"runtime_worker": worker()},  # the same as the fixture's: no change
        {"runtime_worker": worker(worker_version="0.2.0")},
        {"runtime_worker": worker(worker_version="0.2.0")},
        {"runtime_worker": None, "runtime_worker_problem": "connection refused"},
        {"runtime_worker": None, "runtime_worker_problem": "timed out"},  # still none: no new event
        {"runtime_worker": worker(2, "0.3.0")},
    ):
        publish_inventory(client, node, capabilities=EVERY_TYPE, **report)
    with app.app_context():
        events = db.session.scalars(
            sa.select(AuditEvent).where(AuditEvent.action == "node.runtime_worker_changed").order_by(AuditEvent.id)
        ).all()
        details = [
            (e.details["old_version"], e.details["new_version"], e.details["old_answer"], e.details["new_answer"])
            for e in events
        ]
    assert details == [
        (None, "0.1.0", None, "COMPATIBLE"),
        ("0.1.0", "0.2.0", "COMPATIBLE", "COMPATIBLE"),
        ("0.2.0", None, "COMPATIBLE", None),
        (None, "0.3.0", None, "TOO_NEW"),
    ]
    assert events[2].details["problem"] == "connection refused"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"runtime_worker": {"protocol_version": 1}}, "runtime_worker.worker_version"),
        ({"runtime_worker": {**worker(), "protocol_version": True}}, "runtime_worker.protocol_version"),
        ({"runtime_worker": {**worker(), "protocol_version": "x" * 33}}, "runtime_worker.protocol_version"),
        ({"runtime_worker": {**worker(), "engines": [{"version": "1"}]}}, "runtime_worker.engines[0].name"),
        ({"runtime_worker": {**worker(), "engines": [ENGINE] * 9}}, "runtime_worker.engines"),
        ({"runtime_worker": {**worker(), "devices": [{"uuid": ""}]}}, "runtime_worker.devices[0].uuid"),
        ({"runtime_worker_problem": "p" * 501}, "runtime_worker_problem"),
        ({"runtime_worker_problem": "two\nlines"}, "runtime_worker_problem"),
    ],
)
def test_a_malformed_worker_report_is_refused_by_field_and_changes_nothing(app, client, node, change, field):
    before = described(client, node)
    body = {**factories.inventory_body(), "capabilities": EVERY_TYPE, **change}
    response = client.post("/api/v1/agent/inventory", json=body, headers=node["auth"])
    assert response.status_code == 400
    assert response.get_json()["error"]["field"] == field
    after = described(client, node)
    assert (after["runtime_worker"], after["capabilities"]) == (before["runtime_worker"], before["capabilities"])


# --------------------------------------------------------------------------- results


@pytest.fixture
def running_benchmark(client, node, artifact):
    job = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"}).get_json()
    assert agent(client, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]["id"] == job["id"]
    return job


@pytest.mark.parametrize(("change", "field"), WRONG_BENCHMARK_RESULTS)
def test_a_result_of_the_wrong_shape_is_refused_by_field_and_the_job_keeps_running(
    client, node, artifact, running_benchmark, change, field
):
    job = running_benchmark
    if change == "acquire-shaped":
        result = {"commit": COMMIT, "container_path": ARTIFACT_PATH, "files": 1, "total_bytes": 1}
    elif change == "generate-shaped":
        result = generate_result(artifact["id"])
    else:
        result = benchmark_result(artifact["id"], **change)
    response = complete(client, node, job["id"], result)
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["error"]["field"] == field
    unchanged = api_job(client, job["id"])
    assert (unchanged["state"], unchanged["result"]) == ("running", None)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"outputs": []}, "result.outputs"),
        ({"outputs": generate_result("x")["outputs"] * 17}, "result.outputs"),
        (
            {"outputs": [{**generate_result("x")["outputs"][0], "text": "x" * (64 * 1024 + 1)}]},
            "result.outputs[0].text",
        ),
        ({"outputs": [{**generate_result("x")["outputs"][0], "text": "nul\x00"}]}, "result.outputs[0].text"),
        ({"temperature": float("inf")}, "result.temperature"),
    ],
)
def test_a_generate_result_is_bounded(client, node, artifact, change, field):
    job = create(client, GENERATE, node["id"], {"artifact_id": artifact["id"], **GOOD_GENERATE}).get_json()
    agent(client, node, "jobs/claim", capabilities=EVERY_TYPE)
    response = complete(client, node, job["id"], generate_result(artifact["id"], **change))
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["error"]["field"] == field
    assert api_job(client, job["id"])["state"] == "running"


def test_results_are_kept_per_node_and_model_newest_first_with_the_last_smoke_test(app, client, node, artifact):
    assert client.get(f"/api/v1/admin/nodes/{node['id']}/runtime-results", headers=ADMIN).get_json() == {
        "benchmarks": [],
        "smoke_test": None,
    }
    ids = []
    for mean in (100.0, 200.0):
        job = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"})
        job_id = job.get_json()["id"]
        agent(client, node, "jobs/claim", capabilities=EVERY_TYPE)
        result = benchmark_result(artifact["id"], generate_tokens_per_second=rate(mean))
        assert agent(client, node, f"jobs/{job_id}/complete", attempt=1, result=result).status_code == 200
        ids.append(job_id)
    for prompt in ("first", "second"):
        job_id = create(
            client, GENERATE, node["id"], {"artifact_id": artifact["id"], **GOOD_GENERATE, "prompts": [prompt]}
        ).get_json()["id"]
        agent(client, node, "jobs/claim", capabilities=EVERY_TYPE)
        outputs = [{**generate_result("x")["outputs"][0], "prompt": prompt}]
        result = generate_result(artifact["id"], outputs=outputs)
        assert agent(client, node, f"jobs/{job_id}/complete", attempt=1, result=result).status_code == 200
    smoke_id = job_id

    results = client.get(f"/api/v1/admin/nodes/{node['id']}/runtime-results", headers=ADMIN).get_json()
    assert [row["job_id"] for row in results["benchmarks"]] == ids[::-1]
    newest = results["benchmarks"][0]
    assert newest["generate_tokens_per_second"]["mean"] == 200.0
    assert (newest["artifact_id"], newest["repo_id"], newest["commit"], newest["model_file"]) == (
        artifact["id"],
        "owner/tiny-gguf",
        COMMIT,
        "tiny.gguf",
    )
    assert (newest["peak_gpu_memory_bytes"], newest["gpu_uuids"], newest["engine"]) == (None, [], ENGINE)
    smoke = results["smoke_test"]
    assert smoke["job_id"] == smoke_id and smoke["outputs"][0]["prompt"] == "second"
    assert smoke["outputs"][0]["text"] == " world.\nIt answers 👩‍💻"

    # Another node's results stay its own; an unknown node is a 404.
    other = online_node(client, capabilities=EVERY_TYPE)
    assert (
        client.get(f"/api/v1/admin/nodes/{other['id']}/runtime-results", headers=ADMIN).get_json()["benchmarks"] == []
    )
    missing = client.get(f"/api/v1/admin/nodes/{uuid.uuid4()}/runtime-results", headers=ADMIN)
    assert missing.status_code == 404


def test_odd_stored_results_read_back_as_nulls_never_a_500(app, client, node, artifact):
    job = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"}).get_json()
    odd = {
        "prompt_tokens_per_second": {"mean": "fast"},
        "generate_tokens_per_second": [1, 2],
        "load_seconds": True,
        "gpu_uuids": "GPU-1",
        "engine": "llama",
        "peak_rss_bytes": 1.5,
    }
    with app.app_context():
        db.session.execute(sa.update(Job).where(Job.id == job["id"]).values(state="succeeded", result=odd))
        db.session.execute(sa.update(NodeLease).values(runtime_worker=["not", "an", "object"]))
        db.session.commit()
    row = client.get(f"/api/v1/admin/nodes/{node['id']}/runtime-results", headers=ADMIN).get_json()["benchmarks"][0]
    assert row["prompt_tokens_per_second"] is None and row["generate_tokens_per_second"] is None
    assert (row["load_seconds"], row["gpu_uuids"], row["engine"], row["peak_rss_bytes"]) == (None, [], None, None)
    assert row["model_file"] == "tiny.gguf"  # from the params when the result lacks it
    assert described(client, node)["runtime_worker"]["reported"] is None


def test_a_root_whose_artifact_a_runtime_job_uses_cannot_be_deleted(client, node, artifact):
    job = create(client, GENERATE, node["id"], {"artifact_id": artifact["id"], **GOOD_GENERATE}).get_json()
    refused = client.delete(f"/api/v1/admin/storage-roots/{artifact['storage_root_id']}", headers=ADMIN)
    assert refused.status_code == 409 and refused.get_json()["error"]["code"] == "STORAGE_ROOT_IN_USE"
    client.post(f"/api/v1/admin/jobs/{job['id']}/cancel", headers=ADMIN)
    assert client.delete(f"/api/v1/admin/storage-roots/{artifact['storage_root_id']}", headers=ADMIN).status_code == 200
    assert api_job(client, job["id"])["state"] == "cancelled"  # history stays; its artifact link is gone


def test_the_runtime_error_codes_each_say_what_to_do_next(client, node, artifact):
    job = create(client, BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"}).get_json()
    agent(client, node, "jobs/claim", capabilities=EVERY_TYPE)
    error = {"code": "RUNTIME_WORKER_UNAVAILABLE", "message": "connection refused on /run/modelforge/worker.sock"}
    agent(client, node, f"jobs/{job['id']}/fail", attempt=1, error=error, retryable=True)
    requeued = api_job(client, job["id"])
    assert requeued["state"] == "queued"
    assert "runtime worker container" in requeued["error"]["next_step"]
    assert "socket volume" in requeued["error"]["next_step"]


def test_a_smoke_test_with_every_output_long_fits_through_complete(client, node, artifact):
    """Sixteen outputs of 20,000 characters are past the general 256 KiB body limit; complete reads them."""
    prompts = [f"prompt {number}" for number in range(16)]
    job = create(client, GENERATE, node["id"], {"artifact_id": artifact["id"], **GOOD_GENERATE, "prompts": prompts})
    job_id = job.get_json()["id"]
    agent(client, node, "jobs/claim", capabilities=EVERY_TYPE)
    output = generate_result("x")["outputs"][0]
    outputs = [{**output, "prompt": prompt, "text": "word " * 4000} for prompt in prompts]
    response = complete(client, node, job_id, generate_result(artifact["id"], outputs=outputs))
    assert response.status_code == 200, response.get_json()
    assert len(api_job(client, job_id)["result"]["outputs"]) == 16
    # Other agent routes keep the general limit.
    huge = {**factories.heartbeat_body(), "pad": "x" * (300 * 1024)}
    assert client.post("/api/v1/agent/heartbeat", json=huge, headers=node["auth"]).status_code == 413
