"""The runtime worker as the node agent meets it: the real process, HTTP over its Unix socket (W1, W2).

Every test talks to `python -m modelforge_runtime_worker` started with its settings in the
environment, on a tiny random-weight llama model that llama.cpp really loads and runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time
import uuid
from pathlib import Path

import pytest

from tests.support import agent as support_agent
from tests.support.tiny_gguf import write_not_gguf, write_tiny_llama, write_truncated
from tests.support.worker import UnixHTTPConnection, WorkerProcess, answers, short_socket_dir

FAKE_NVML_DIR = Path(support_agent.FAKE_NVML_DIR)
SMALL_BENCHMARK = {"prompt_tokens": 32, "generate_tokens": 8, "repetitions": 2}
# Long enough that it is still running whenever a test cancels or kills it (minutes on the tiny model).
LONG_BENCHMARK = {"prompt_tokens": 1024, "generate_tokens": 4096, "repetitions": 50}
BENCHMARK_RESULT_FIELDS = {
    "engine", "model_file", "model_bytes", "n_gpu_layers", "gpu_uuids", "load_seconds", "prompt_tokens",
    "generate_tokens", "repetitions", "prompt_tokens_per_second", "generate_tokens_per_second",
    "time_to_first_token_seconds", "peak_rss_bytes", "peak_gpu_memory_bytes",
}  # fmt: skip
GENERATE_RESULT_FIELDS = {
    "engine",
    "model_file",
    "seed",
    "temperature",
    "max_tokens",
    "gpu_uuids",
    "load_seconds",
    "outputs",
}
STATUS_FIELDS = {"id", "type", "state", "phase", "steps_done", "steps_total", "result", "error"}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """The worker's artifact directory: good, broken and hostile model paths."""
    root = tmp_path_factory.mktemp("artifacts")
    write_tiny_llama(root / "tiny.gguf", seed=0)
    (root / "models" / "other").mkdir(parents=True)
    write_tiny_llama(root / "models" / "other" / "tiny-seed1.gguf", seed=1)
    write_truncated(root / "truncated.gguf")
    write_not_gguf(root / "not-gguf.gguf")
    (root / "a-directory.gguf").mkdir()
    outside = tmp_path_factory.mktemp("outside")
    write_tiny_llama(outside / "outside.gguf")
    (root / "escape.gguf").symlink_to(outside / "outside.gguf")
    (root / "inside-link.gguf").symlink_to(root / "tiny.gguf")
    return root


@pytest.fixture
def make_worker(artifacts, socket_dir, tmp_path):
    """Start workers of the test's own; each is stopped (SIGTERM) at the end."""
    started: list[WorkerProcess] = []

    def make(name: str = "worker", socket_path: Path | None = None, **env: str) -> WorkerProcess:
        worker = WorkerProcess(socket_path or socket_dir / f"{name}.sock", artifacts, tmp_path / f"{name}.log", **env)
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def worker(artifacts, tmp_path_factory):
    """One worker shared by the tests that leave it idle; stopped with SIGTERM at the end."""
    directory = short_socket_dir()
    process = WorkerProcess(directory / "w.sock", artifacts, tmp_path_factory.mktemp("worker") / "worker.log").start()
    yield process
    code = process.stop()
    assert code == 0, process.log()
    assert not process.socket_path.exists(), "SIGTERM left the socket behind"
    shutil.rmtree(directory, ignore_errors=True)


def benchmark(model_path: str = "tiny.gguf", **params) -> dict:
    """runtime.benchmark.v1 params as the agent sends them: the control plane's plus model_path."""
    model_file = Path(model_path).name or "model.gguf"
    return {"artifact_id": str(uuid.uuid4()), "model_file": model_file, "model_path": model_path, **params}


def generate(prompts: list[str], model_path: str = "tiny.gguf", max_tokens: int = 12) -> dict:
    """runtime.generate.v1 params as the agent sends them."""
    return {"artifact_id": str(uuid.uuid4()), "model_file": Path(model_path).name, "model_path": model_path,
            "prompts": prompts, "max_tokens": max_tokens}  # fmt: skip


def assert_serves(worker: WorkerProcess) -> None:
    """The worker still answers and still runs a job to success."""
    status = worker.run_job("runtime.generate.v1", generate(["still there?"], max_tokens=2))
    assert status["state"] == "succeeded", status


# --------------------------------------------------------------------------- info and socket


def test_info_names_the_worker_engine_and_no_gpu_in_cpu_mode(worker):
    code, info = worker.call("GET", "/v1/info")
    assert code == 200
    assert info["worker_version"] == "0.1.0"
    assert info["protocol_version"] == 1
    assert info["engines"] == [{"name": "llama.cpp", "version": "0.3.36", "backend": info["engines"][0]["backend"]}]
    assert info["engines"][0]["backend"] in ("cpu", "cuda")
    assert info["devices"] == []
    assert set(info) == {"worker_version", "protocol_version", "engines", "devices", "job", "serving", "deployments"}


def test_the_socket_is_created_mode_0660(worker):
    mode = os.stat(worker.socket_path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660


# --------------------------------------------------------------------------- benchmark


def test_benchmark_answers_the_readme_result_with_sane_figures(worker, artifacts):
    code, accepted = worker.submit("runtime.benchmark.v1", benchmark(**SMALL_BENCHMARK))
    assert code == 202, accepted
    assert set(accepted) == STATUS_FIELDS
    assert accepted["state"] == "running"
    assert accepted["steps_total"] == 2 + 2 * 2 + 1
    status = worker.finish(accepted["id"])
    assert status["state"] == "succeeded", status
    assert status["error"] is None
    assert (status["phase"], status["steps_done"]) == ("done", status["steps_total"])
    result = status["result"]
    assert set(result) == BENCHMARK_RESULT_FIELDS
    assert result["engine"]["name"] == "llama.cpp"
    assert result["model_file"] == "tiny.gguf"
    assert result["model_bytes"] == (artifacts / "tiny.gguf").stat().st_size
    assert (result["n_gpu_layers"], result["gpu_uuids"], result["peak_gpu_memory_bytes"]) == (0, [], None)
    assert (result["prompt_tokens"], result["generate_tokens"], result["repetitions"]) == (32, 8, 2)
    for figure in ("prompt_tokens_per_second", "generate_tokens_per_second"):
        spread = result[figure]
        assert len(spread["samples"]) == 2
        assert all(sample > 0 for sample in spread["samples"])
        assert min(spread["samples"]) <= spread["mean"] <= max(spread["samples"])
        assert spread["stddev"] >= 0
    assert 0 < result["load_seconds"] < 30
    assert 0 < result["time_to_first_token_seconds"] < 30
    assert 20 << 20 < result["peak_rss_bytes"] < 4 << 30  # a Python process with llama.cpp, not a guess
    assert worker.call("GET", "/v1/info")[1]["job"] == {"id": accepted["id"], "state": "succeeded"}


def test_one_repetition_has_a_zero_stddev_and_defaults_apply(worker):
    status = worker.run_job("runtime.benchmark.v1", benchmark(prompt_tokens=16, generate_tokens=4, repetitions=1))
    assert status["state"] == "succeeded", status
    for figure in ("prompt_tokens_per_second", "generate_tokens_per_second"):
        assert status["result"][figure]["stddev"] == 0.0
        assert len(status["result"][figure]["samples"]) == 1


# --------------------------------------------------------------------------- generate


PROMPTS = ["Hello", "The model forge runs on a", "1, 2, 3,"]


def texts(status: dict) -> dict[str, str]:
    """Each prompt's completion text."""
    assert status["state"] == "succeeded", status
    return {output["prompt"]: output["text"] for output in status["result"]["outputs"]}


def test_generate_gives_the_same_text_twice_in_any_order_and_in_another_process(worker, make_worker):
    first = worker.run_job("runtime.generate.v1", generate(PROMPTS))
    result = first["result"]
    assert set(result) == GENERATE_RESULT_FIELDS
    assert (result["seed"], result["temperature"], result["max_tokens"], result["gpu_uuids"]) == (42, 0.0, 12, [])
    assert [output["prompt"] for output in result["outputs"]] == PROMPTS
    for output in result["outputs"]:
        assert set(output) == {"prompt", "text", "prompt_tokens", "completion_tokens", "finish_reason"}
        assert output["text"].strip(), output
        assert output["prompt_tokens"] > 0
        assert (output["completion_tokens"], output["finish_reason"]) == (12, "length")

    again = worker.run_job("runtime.generate.v1", generate(PROMPTS))
    reversed_order = worker.run_job("runtime.generate.v1", generate(PROMPTS[::-1]))
    other = make_worker("second").start()
    elsewhere = other.run_job("runtime.generate.v1", generate(PROMPTS))
    assert texts(again) == texts(first)
    assert texts(reversed_order) == texts(first)
    assert texts(elsewhere) == texts(first)


def test_a_different_model_gives_different_text(worker):
    tiny = texts(worker.run_job("runtime.generate.v1", generate(PROMPTS)))
    other = texts(worker.run_job("runtime.generate.v1", generate(PROMPTS, "models/other/tiny-seed1.gguf")))
    assert other != tiny  # the comparison above could not pass by always answering the same


# --------------------------------------------------------------------------- one job at a time, cancel


def test_a_second_job_while_one_runs_is_busy_and_the_same_id_answers_its_status(worker):
    code, running = worker.submit("runtime.benchmark.v1", benchmark(**LONG_BENCHMARK))
    assert code == 202, running
    job_id = running["id"]
    try:
        code, busy = worker.submit("runtime.generate.v1", generate(["hi"]))
        assert code == 409
        assert busy["error"]["code"] == "WORKER_BUSY"
        assert set(busy["error"]) == {"code", "message", "retryable"}
        code, again = worker.submit("runtime.benchmark.v1", benchmark(**LONG_BENCHMARK), job_id=job_id)
        assert code == 202
        assert (again["id"], again["state"]) == (job_id, "running")
        assert worker.call("GET", "/v1/info")[1]["job"] == {"id": job_id, "state": "running"}
    finally:
        worker.call("POST", f"/v1/jobs/{job_id}/cancel")
        worker.finish(job_id)
    code, after = worker.submit("runtime.benchmark.v1", benchmark(**SMALL_BENCHMARK), job_id=job_id)
    assert (code, after["state"]) == (202, "cancelled"), "a resent id answers the kept status, it does not rerun"


@pytest.mark.parametrize(
    ("job_type", "params", "phase"),
    [
        ("runtime.benchmark.v1", benchmark(prompt_tokens=32, generate_tokens=4096, repetitions=50), "generate"),
        ("runtime.benchmark.v1", benchmark(prompt_tokens=4096, generate_tokens=8, repetitions=50), "prompt"),
        ("runtime.generate.v1", generate(["Hello"] * 16, max_tokens=4096), "prompts"),
    ],
    ids=["benchmark-generating", "benchmark-prompt-batches", "generate"],
)
def test_cancel_stops_the_job_within_a_second_and_the_next_job_runs(worker, job_type, params, phase):
    code, accepted = worker.submit(job_type, params)
    assert code == 202, accepted
    job_id = accepted["id"]
    worker.wait_until(job_id, lambda status: status["phase"] == phase)
    asked = time.monotonic()
    code, answer = worker.call("POST", f"/v1/jobs/{job_id}/cancel")
    assert code == 200
    status = worker.wait_until(job_id, lambda status: status["state"] != "running", timeout=5)
    elapsed = time.monotonic() - asked
    assert elapsed < 1.0, f"the cancel took {elapsed:.2f} s"
    assert status["state"] == "cancelled"
    assert status["error"] == {"code": "JOB_CANCELLED", "message": status["error"]["message"], "retryable": False}
    assert answer["id"] == job_id
    assert_serves(worker)


def test_cancel_of_a_finished_job_changes_nothing_and_unknown_ids_are_404(worker):
    done = worker.run_job("runtime.generate.v1", generate(["x"], max_tokens=1))
    code, answer = worker.call("POST", f"/v1/jobs/{done['id']}/cancel")
    assert (code, answer) == (200, done)
    for method, path in (("GET", "/v1/jobs/never-was"), ("POST", "/v1/jobs/never-was/cancel")):
        code, answer = worker.call(method, path)
        assert code == 404
        assert answer["error"]["code"] == "WORKER_JOB_UNKNOWN"


# --------------------------------------------------------------------------- model files


@pytest.mark.parametrize(
    "model_path",
    ["../x.gguf", "models/../tiny.gguf", "ABSOLUTE", "escape.gguf", "missing.gguf", "a-directory.gguf", "."],
)
def test_model_paths_outside_the_artifact_dir_or_not_files_are_refused_with_422(worker, artifacts, model_path):
    if model_path == "ABSOLUTE":
        model_path = str(artifacts / "tiny.gguf")
    code, refused = worker.submit("runtime.benchmark.v1", benchmark(model_path, **SMALL_BENCHMARK))
    assert code == 422, refused
    assert refused["error"]["code"] == "MODEL_FILE_INVALID"
    assert refused["error"]["retryable"] is False
    assert "model_path" in refused["error"]["message"]
    assert_serves(worker)


def test_a_symlink_that_stays_inside_the_artifact_dir_is_followed(worker):
    status = worker.run_job("runtime.generate.v1", generate(["Hello"], "inside-link.gguf", max_tokens=2))
    assert status["state"] == "succeeded", status


@pytest.mark.parametrize(
    ("model_path", "reason"),
    [
        ("not-gguf.gguf", "not a GGUF file: it starts with the bytes 50 4b 03 04, not “GGUF”"),
        ("truncated.gguf", "not within the file bounds"),
    ],
)
def test_a_file_llama_cpp_cannot_load_fails_the_job_with_model_load_failed(worker, artifacts, model_path, reason):
    status = worker.run_job("runtime.benchmark.v1", benchmark(model_path, **SMALL_BENCHMARK))
    assert status["state"] == "failed"
    assert status["error"]["code"] == "MODEL_LOAD_FAILED"
    assert status["error"]["retryable"] is False
    assert reason in status["error"]["message"]
    assert "b'" not in status["error"]["message"], "a person reads the file's first bytes, not a Python repr"
    assert str(artifacts) not in status["error"]["message"], "the worker's own paths stay out of job errors"
    assert status["result"] is None
    assert_serves(worker)


# --------------------------------------------------------------------------- request handling


def test_a_body_over_64_kib_is_413_and_the_worker_keeps_serving(worker):
    body = json.dumps({"id": "big", "type": "runtime.generate.v1", "params": {"pad": "x" * (64 * 1024)}}).encode()
    code, refused = worker.call("POST", "/v1/jobs", raw=body)
    assert code == 413
    assert refused["error"]["code"] == "WORKER_REQUEST_TOO_LARGE"
    assert_serves(worker)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{not json", "body"),
        (b"\xff\xfe", "body"),
        (b"[]", "body"),
        (json.dumps({"id": "a/b", "type": "runtime.generate.v1", "params": {}}).encode(), "id"),
        (json.dumps({"id": "j", "type": "runtime.train.v1", "params": {}}).encode(), "type"),
        (json.dumps({"id": "j", "type": "runtime.generate.v1", "params": []}).encode(), "params"),
        (b"[" * 30000 + b"]" * 30000, "body"),  # issue 22: nested past the parser's recursion limit
        (b'{"id": ' + b"1" * 5000 + b"}", "body"),  # a number of more digits than int() takes
    ],
    ids=["not-json", "not-utf8", "a-list", "id", "type", "params", "deeply-nested", "huge-number"],
)
def test_a_malformed_submission_is_400_naming_what_is_wrong(worker, raw, field):
    code, refused = worker.call("POST", "/v1/jobs", raw=raw)
    assert code == 400
    assert refused["error"]["code"] == "WORKER_REQUEST_INVALID"
    assert refused["error"]["message"].startswith(field + ":")


@pytest.mark.parametrize(
    ("job_type", "params", "field"),
    [
        ("runtime.benchmark.v1", {"model_path": None}, "params.model_path"),
        ("runtime.benchmark.v1", {"n_gpu_layers": -2}, "params.n_gpu_layers"),
        ("runtime.benchmark.v1", {"n_gpu_layers": 1001}, "params.n_gpu_layers"),
        ("runtime.benchmark.v1", {"prompt_tokens": 0}, "params.prompt_tokens"),
        ("runtime.benchmark.v1", {"prompt_tokens": 8193}, "params.prompt_tokens"),
        ("runtime.benchmark.v1", {"prompt_tokens": 12.5}, "params.prompt_tokens"),
        ("runtime.benchmark.v1", {"prompt_tokens": True}, "params.prompt_tokens"),
        ("runtime.benchmark.v1", {"generate_tokens": 4097}, "params.generate_tokens"),
        ("runtime.benchmark.v1", {"repetitions": 51}, "params.repetitions"),
        ("runtime.benchmark.v1", {"repetitions": "5"}, "params.repetitions"),
        ("runtime.generate.v1", {"prompts": []}, "params.prompts"),
        ("runtime.generate.v1", {"prompts": ["x"] * 17}, "params.prompts"),
        ("runtime.generate.v1", {"prompts": ["x" * 8001]}, "params.prompts"),
        ("runtime.generate.v1", {"prompts": [1]}, "params.prompts"),
        ("runtime.generate.v1", {"prompts": "Hello"}, "params.prompts"),
        ("runtime.generate.v1", {"max_tokens": 0}, "params.max_tokens"),
        ("runtime.generate.v1", {"max_tokens": 4097}, "params.max_tokens"),
    ],
)
def test_params_out_of_range_are_400_naming_the_field(worker, job_type, params, field):
    full = benchmark(**SMALL_BENCHMARK) if job_type == "runtime.benchmark.v1" else generate(["Hello"])
    code, refused = worker.submit(job_type, {**full, **params})
    assert code == 400, refused
    assert refused["error"] == {
        "code": "WORKER_REQUEST_INVALID",
        "message": refused["error"]["message"],
        "retryable": False,
    }
    assert refused["error"]["message"].startswith(field + ":")


def test_params_at_the_edges_of_their_ranges_are_accepted(worker):
    longest = " on" * 2666 + "on"  # 8000 characters, 2667 tokens of the tiny vocabulary
    status = worker.run_job("runtime.generate.v1", generate([longest] + ["y"] * 15, max_tokens=1))
    assert status["state"] == "succeeded", status
    assert len(status["result"]["outputs"]) == 16


@pytest.mark.parametrize(
    ("method", "path", "code", "error"),
    [
        ("GET", "/v2/info", 404, "WORKER_ROUTE_UNKNOWN"),
        ("GET", "/", 404, "WORKER_ROUTE_UNKNOWN"),
        ("GET", "/v1/jobs/a/b/c", 404, "WORKER_ROUTE_UNKNOWN"),
        ("POST", "/v1/info", 405, "WORKER_METHOD_NOT_ALLOWED"),
        ("GET", "/v1/jobs", 405, "WORKER_METHOD_NOT_ALLOWED"),
        ("DELETE", "/v1/jobs/x", 405, "WORKER_METHOD_NOT_ALLOWED"),
        ("GET", "/v1/jobs/x/cancel", 405, "WORKER_METHOD_NOT_ALLOWED"),
    ],
)
def test_unknown_paths_are_404_and_wrong_methods_405(worker, method, path, code, error):
    answered, refused = worker.call(method, path)
    assert answered == code
    assert refused["error"]["code"] == error


def test_one_connection_carries_several_requests(worker):
    connection = UnixHTTPConnection(str(worker.socket_path))
    try:
        for _ in range(3):
            connection.request("GET", "/v1/info")
            response = connection.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["protocol_version"] == 1
    finally:
        connection.close()


# --------------------------------------------------------------------------- start and stop


def test_sigkill_mid_benchmark_leaves_a_stale_socket_that_the_next_worker_replaces(make_worker, socket_dir):
    first = make_worker("first", socket_path=socket_dir / "w.sock").start()
    code, accepted = first.submit("runtime.benchmark.v1", benchmark(**LONG_BENCHMARK))
    assert code == 202
    first.wait_until(accepted["id"], lambda status: status["phase"] in ("prompt", "generate"))
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    assert stat.S_ISSOCK(os.lstat(socket_dir / "w.sock").st_mode), "a killed worker leaves its socket file"

    second = make_worker("second", socket_path=socket_dir / "w.sock").start()
    assert "removing the stale socket" in second.log()
    code, unknown = second.call("GET", f"/v1/jobs/{accepted['id']}")
    assert (code, unknown["error"]["code"]) == (404, "WORKER_JOB_UNKNOWN")
    assert_serves(second)


def test_a_live_worker_on_the_socket_path_is_not_replaced(make_worker, socket_dir):
    first = make_worker("first", socket_path=socket_dir / "w.sock").start()
    refused = make_worker("second", socket_path=socket_dir / "w.sock").run()
    assert refused.returncode == 3
    assert "MODELFORGE_WORKER_SOCKET" in refused.stderr
    assert answers(first.socket_path)


def test_a_path_that_is_not_a_socket_is_refused_and_left_alone(make_worker, socket_dir):
    (socket_dir / "w.sock").write_text("not a socket\n")
    refused = make_worker(socket_path=socket_dir / "w.sock").run()
    assert refused.returncode == 2
    assert "MODELFORGE_WORKER_SOCKET" in refused.stderr
    assert "not a socket" in refused.stderr
    assert (socket_dir / "w.sock").read_text() == "not a socket\n"


def test_sigterm_during_a_job_stops_cleanly_and_removes_the_socket(make_worker):
    worker = make_worker().start()
    code, accepted = worker.submit("runtime.benchmark.v1", benchmark(**LONG_BENCHMARK))
    assert code == 202
    worker.wait_until(accepted["id"], lambda status: status["phase"] in ("prompt", "generate"))
    started = time.monotonic()
    assert worker.stop() == 0, worker.log()
    assert time.monotonic() - started < 5
    assert not worker.socket_path.exists()
    assert "SIGTERM received" in worker.log()


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"MODELFORGE_WORKER_ACCELERATOR_MODE": "gpu"}, "MODELFORGE_WORKER_ACCELERATOR_MODE"),
        ({"MODELFORGE_WORKER_ARTIFACT_DIR": "/nonexistent/artifacts"}, "MODELFORGE_WORKER_ARTIFACT_DIR"),
        ({"MODELFORGE_WORKER_SOCKET": "/tmp/" + "s" * 120 + ".sock"}, "MODELFORGE_WORKER_SOCKET"),
        ({"MODELFORGE_WORKER_SOCKET": "/proc/no-such-dir/w.sock"}, "MODELFORGE_WORKER_SOCKET"),
    ],
    ids=["mode", "artifact-dir", "socket-too-long", "socket-dir-uncreatable"],
)
def test_a_bad_setting_exits_2_naming_the_variable(make_worker, env, variable):
    result = make_worker(**env).run()
    assert result.returncode == 2, result.stderr
    assert variable in result.stderr


def test_cpu_mode_never_imports_pynvml(make_worker, tmp_path):
    poison = tmp_path / "poison"
    poison.mkdir()
    (poison / "pynvml.py").write_text("raise RuntimeError('pynvml was imported in cpu mode')\n")
    worker = make_worker(PYTHONPATH=str(poison)).start()
    assert worker.call("GET", "/v1/info")[1]["devices"] == []
    status = worker.run_job("runtime.benchmark.v1", benchmark(**SMALL_BENCHMARK))
    assert status["state"] == "succeeded", status
    assert "pynvml was imported" not in worker.log()
    checked = make_worker("check", PYTHONPATH=str(poison)).run("--check")
    assert checked.returncode == 0, checked.stderr


GPU = {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA Test 16GB", "memory_total": 17179869184,
       "memory_used": 1048576}  # fmt: skip


def test_nvidia_mode_reports_the_nvml_devices(make_worker):
    scenario = json.dumps({"gpus": [GPU]})
    result = make_worker(
        MODELFORGE_WORKER_ACCELERATOR_MODE="nvidia", PYTHONPATH=str(FAKE_NVML_DIR), FAKE_NVML_SCENARIO=scenario
    ).run("--check")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["devices"] == [{"uuid": GPU["uuid"], "name": GPU["name"], "memory_total_bytes": GPU["memory_total"]}]
    assert info["protocol_version"] == 1


@pytest.mark.parametrize(
    "scenario",
    [{"gpus": []}, {"init_error": "NVMLError_LibraryNotFound"}],
    ids=["no-gpu", "no-driver"],
)
def test_nvidia_mode_without_a_gpu_exits_3_and_auto_mode_falls_back_to_cpu(make_worker, scenario):
    env = {"PYTHONPATH": str(FAKE_NVML_DIR), "FAKE_NVML_SCENARIO": json.dumps(scenario)}
    refused = make_worker(MODELFORGE_WORKER_ACCELERATOR_MODE="nvidia", **env).run("--check")
    assert refused.returncode == 3
    assert "MODELFORGE_WORKER_ACCELERATOR_MODE=nvidia" in refused.stderr
    auto = make_worker(MODELFORGE_WORKER_ACCELERATOR_MODE="auto", **env).run("--check")
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["devices"] == []


def test_a_finished_job_gives_its_memory_back(make_worker):
    worker = make_worker().start()
    idle = worker.rss_bytes()
    status = worker.run_job("runtime.benchmark.v1", benchmark(prompt_tokens=2048, generate_tokens=8, repetitions=1))
    assert status["state"] == "succeeded", status
    peak = status["result"]["peak_rss_bytes"]
    assert peak > idle + (16 << 20), "the job should have needed memory for this test to mean anything"
    assert worker.rss_bytes() < idle + (peak - idle) / 2, "the model, context and buffers were not freed"
