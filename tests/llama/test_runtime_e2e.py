"""Runtime jobs end to end: acquire → benchmark and generate on the real worker (W1, W2, J2).

A tiny random-weight llama GGUF made here is served by the stand-in Hub; gunicorn, the agent
process and the runtime worker process (llama.cpp's CPU build) are what runs in production.
"""

from __future__ import annotations

import html
import re
import time

import requests

from tests.support import BENCHMARK, GENERATE, OPERATOR_KEY, assert_no_secrets
from tests.support.acquire import HF_TOKEN, api, wait_job
from tests.support.gunicorn import GunicornServer
from tests.support.serving import create, runtime_node, start_worker
from tests.support.tiny_gguf import MALFORMED, write_tiny_llama

SMALL_BENCHMARK = {"prompt_tokens": 64, "generate_tokens": 16, "repetitions": 2}
PROMPTS = ["Once upon a time", "The capital of"]
# Seconds of work for the tiny model (inside its 2048-token context): still running when a test acts.
LONG_BENCHMARK = {"prompt_tokens": 1024, "generate_tokens": 1000, "repetitions": 20}
HOSTILE = ("no-byte-tokens.gguf", "repeated-token.gguf")


def signed_in(server: GunicornServer) -> requests.Session:
    """A console session, signed in through the login form as a browser would."""
    session = requests.Session()
    form = session.get(server.url + "/login", timeout=10).text
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', form).group(1)
    response = session.post(
        server.url + "/login",
        data={"csrf_token": token, "operator_key": OPERATOR_KEY},
        headers={"Referer": server.url + "/login"},
        allow_redirects=False,
        timeout=10,
    )
    assert response.status_code == 302, response.text
    return session


def test_an_acquired_model_is_benchmarked_and_answers_the_same_text_twice(
    tmp_path, socket_dir, jobs_server, hub, model_repo
):
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    node = api(jobs_server, "GET", f"/api/v1/hardware/nodes/{node_id}").json()
    assert node["runtime_worker"]["compatibility"]["answer"] == "COMPATIBLE"
    assert node["runtime_worker"]["reported"]["engines"][0]["name"] == "llama.cpp"

    bench = create(jobs_server, BENCHMARK, node_id, artifact_id=artifact_id, model_file="tiny.gguf", **SMALL_BENCHMARK)
    done = wait_job(jobs_server, bench["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    result = done["result"]
    assert result["artifact_id"] == artifact_id and result["model_file"] == "tiny.gguf"
    for figure in ("prompt_tokens_per_second", "generate_tokens_per_second"):
        assert result[figure]["mean"] > 0 and len(result[figure]["samples"]) == 2, result
    assert result["load_seconds"] > 0 and result["time_to_first_token_seconds"] > 0
    assert result["peak_rss_bytes"] > 0 and result["peak_gpu_memory_bytes"] is None  # no GPU here: never invented
    assert result["engine"]["backend"] == "cpu" and result["gpu_uuids"] == []

    texts = []
    for _ in range(2):
        job = create(
            jobs_server,
            GENERATE,
            node_id,
            artifact_id=artifact_id,
            model_file="tiny.gguf",
            prompts=PROMPTS,
            max_tokens=12,
        )
        done = wait_job(jobs_server, job["id"], {"succeeded", "failed"})
        assert done["state"] == "succeeded", done
        outputs = done["result"]["outputs"]
        assert [output["prompt"] for output in outputs] == PROMPTS
        assert all(output["completion_tokens"] > 0 and output["text"] for output in outputs), outputs
        texts.append([output["text"] for output in outputs])
    assert texts[0] == texts[1]  # temperature 0, fixed seed: the same answer twice

    results = api(jobs_server, "GET", f"/api/v1/admin/nodes/{node_id}/runtime-results").json()
    assert [run["job_id"] for run in results["benchmarks"]] == [bench["id"]]
    assert results["smoke_test"]["outputs"][0]["text"] == texts[1][0]
    # The node page's Jobs & runtime tab: the worker, the benchmark runs and the last smoke test.
    page = signed_in(jobs_server).get(f"{jobs_server.url}/hardware/nodes/{node_id}/work", timeout=10)
    assert page.status_code == 200
    assert 'data-testid="worker-answer">COMPATIBLE<' in page.text and 'data-testid="benchmarks"' in page.text
    assert html.escape(texts[1][0]) in page.text  # the last smoke test's answer
    assert_no_secrets(agent.log() + worker.log(), HF_TOKEN, agent.credential())


def test_bad_model_files_fail_clearly_and_the_worker_keeps_serving(tmp_path, socket_dir, jobs_server, hub, model_repo):
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    for model_file in ("notes.txt", "broken.gguf"):
        job = create(jobs_server, BENCHMARK, node_id, artifact_id=artifact_id, model_file=model_file, **SMALL_BENCHMARK)
        done = wait_job(jobs_server, job["id"], {"succeeded", "failed"})
        assert done["state"] == "failed" and done["error"]["code"] == "MODEL_LOAD_FAILED", done
        assert done["attempt"] == 1  # not retried: another attempt would fail the same way
    job = create(jobs_server, BENCHMARK, node_id, artifact_id=artifact_id, model_file="missing.gguf", **SMALL_BENCHMARK)
    done = wait_job(jobs_server, job["id"], {"succeeded", "failed"})
    assert done["state"] == "failed" and done["error"]["code"] == "MODEL_FILE_INVALID", done

    outside = api(
        jobs_server,
        "POST",
        "/api/v1/admin/jobs",
        json={
            "type": BENCHMARK,
            "node_id": node_id,
            "params": {"artifact_id": artifact_id, "model_file": "../tiny.gguf"},
        },
    )
    assert outside.status_code == 400 and "model_file" in outside.json()["error"]["message"], outside.text

    job = create(
        jobs_server, GENERATE, node_id, artifact_id=artifact_id, model_file="tiny.gguf", prompts=["Hi"], max_tokens=4
    )
    assert wait_job(jobs_server, job["id"], {"succeeded", "failed"})["state"] == "succeeded"
    assert worker.process.poll() is None and agent.process.poll() is None


def test_a_hostile_model_fails_its_job_once_and_the_node_keeps_serving(tmp_path, socket_dir, jobs_server, hub):
    """Issue 22: files that pass every hash and manifest check but make llama.cpp abort; the worker
    runs them in an engine process of its own, so only that job fails, and it is not retried."""
    made = tmp_path / "hostile"
    made.mkdir()
    files = {name: write(made / name) for name, write in MALFORMED.items() if name in HOSTILE}
    files["tiny.gguf"] = write_tiny_llama(made / "tiny.gguf")
    hub.add_repo("org/hostile-gguf", files)
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, "org/hostile-gguf")
    for job_type, model_file, code in (
        (GENERATE, "no-byte-tokens.gguf", "RUNTIME_ENGINE_CRASHED"),  # SIGABRT on the € it cannot spell
        (BENCHMARK, "repeated-token.gguf", "MODEL_LOAD_FAILED"),  # SIGABRT while loading
    ):
        params = {"prompts": ["price: 5 €"], "max_tokens": 4} if job_type == GENERATE else SMALL_BENCHMARK
        job = create(jobs_server, job_type, node_id, artifact_id=artifact_id, model_file=model_file, **params)
        done = wait_job(jobs_server, job["id"], {"succeeded", "failed"})
        assert (done["state"], done["error"]["code"], done["attempt"]) == ("failed", code, 1), done
        assert "SIGABRT" in done["error"]["message"], done
    job = create(
        jobs_server, GENERATE, node_id, artifact_id=artifact_id, model_file="tiny.gguf", prompts=["Hi"], max_tokens=4
    )
    assert wait_job(jobs_server, job["id"], {"succeeded", "failed"})["state"] == "succeeded"
    assert worker.process.poll() is None and agent.process.poll() is None
    assert "killed by SIGABRT" in worker.log()


def test_a_worker_killed_mid_benchmark_fails_the_attempt_retryably_and_the_next_one_succeeds(
    tmp_path, socket_dir, jobs_server, hub, model_repo
):
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    job = create(jobs_server, BENCHMARK, node_id, artifact_id=artifact_id, model_file="tiny.gguf", **LONG_BENCHMARK)
    wait_phase(jobs_server, job["id"], {"prompt", "generate"})  # the worker is measuring
    worker.kill()

    retried = wait_job(jobs_server, job["id"], {"queued", "failed"}, timeout=30)
    assert retried["state"] == "queued" and retried["error"]["code"] == "RUNTIME_WORKER_UNAVAILABLE", retried
    wait_capabilities_without(jobs_server, node_id, BENCHMARK)  # it stops offering what it cannot run
    before = api(jobs_server, "GET", f"/api/v1/hardware/nodes/{node_id}").json()["last_heartbeat_at"]

    start_worker(worker.socket_path, worker.artifact_dir, tmp_path / "restarted")  # on the stale socket
    done = wait_job(jobs_server, job["id"], {"succeeded", "failed"}, timeout=240)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    node = api(jobs_server, "GET", f"/api/v1/hardware/nodes/{node_id}").json()
    assert agent.process.poll() is None and node["status"] == "online" and node["last_heartbeat_at"] > before


def wait_phase(server, job_id: str, phases: set[str], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    job = {}
    while time.monotonic() < deadline:
        job = api(server, "GET", f"/api/v1/admin/jobs/{job_id}").json()
        if (job.get("progress") or {}).get("phase") in phases:
            return job
        time.sleep(0.1)
    raise AssertionError(f"the job never reported a phase in {phases}: {job}")


def wait_capabilities_without(server, node_id: str, job_type: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = api(server, "GET", f"/api/v1/hardware/nodes/{node_id}").json()
        if job_type not in (node.get("capabilities") or []):
            return
        time.sleep(0.2)
    raise AssertionError(f"the node still advertises {job_type} with its worker gone")


def test_cancel_stops_the_worker_within_a_second_and_frees_it(tmp_path, socket_dir, jobs_server, hub, model_repo):
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    job = create(jobs_server, BENCHMARK, node_id, artifact_id=artifact_id, model_file="tiny.gguf", **LONG_BENCHMARK)
    wait_phase(jobs_server, job["id"], {"prompt", "generate"})
    asked = time.monotonic()
    assert api(jobs_server, "POST", f"/api/v1/admin/jobs/{job['id']}/cancel").status_code == 200
    done = wait_job(jobs_server, job["id"], {"cancelled", "succeeded", "failed"}, timeout=10)
    took = time.monotonic() - asked
    assert done["state"] == "cancelled", done
    # J2: the agent hears it within one progress interval (1 s here), the worker stops within a second.
    assert took < 1 + 1 + 1, took
    assert worker.call("GET", "/v1/info")[1]["job"]["state"] == "cancelled"  # idle, the model freed
    job = create(
        jobs_server, GENERATE, node_id, artifact_id=artifact_id, model_file="tiny.gguf", prompts=["Hi"], max_tokens=4
    )
    assert wait_job(jobs_server, job["id"], {"succeeded", "failed"})["state"] == "succeeded"
