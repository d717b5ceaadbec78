"""One malformed GGUF must not take the runtime worker down (issue 22, W1, W2).

llama.cpp aborts the whole process on files that pass every hash and manifest check: a vocabulary
that lists a token twice, metadata with an absurd layer count (GGML_ASSERT, SIGABRT while
loading), a vocabulary without byte-fallback tokens fed a newline (`std::out_of_range`, SIGABRT
while generating). The worker runs each job in an engine process of its own: the job fails with
the right code and the signal, the worker keeps its socket and answers the next job, and every
wait on the engine process has a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.tiny_gguf import MALFORMED, write_tiny_llama
from tests.support.worker import WorkerProcess, answers, gone, short_socket_dir

BENCHMARK = "runtime.benchmark.v1"
GENERATE = "runtime.generate.v1"
SMALL_BENCHMARK = {"prompt_tokens": 32, "generate_tokens": 8, "repetitions": 2}
# Minutes of work for the tiny model: still running whenever a test acts on it.
LONG_GENERATE = {"prompts": ["Hello"] * 16, "max_tokens": 4096}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """The good tiny model and every malformed one the tests can write."""
    root = tmp_path_factory.mktemp("artifacts")
    write_tiny_llama(root / "tiny.gguf")
    for name, write in MALFORMED.items():
        write(root / name)
    return root


@pytest.fixture(scope="module")
def worker(artifacts, tmp_path_factory):
    """One worker for every malformed model in turn: it must outlive them all."""
    directory = short_socket_dir()
    process = WorkerProcess(directory / "w.sock", artifacts, tmp_path_factory.mktemp("worker") / "worker.log").start()
    yield process
    process.stop(signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


def params(model_path: str, job_type: str, **extra) -> dict:
    """A job's params as the agent sends them."""
    base = {"artifact_id": str(uuid.uuid4()), "model_file": model_path, "model_path": model_path}
    if job_type == BENCHMARK:
        return {**base, **SMALL_BENCHMARK, **extra}
    return {**base, "prompts": ["Hello\nworld"], "max_tokens": 4, **extra}


def outcome(worker: WorkerProcess, job_type: str, job_params: dict, timeout: float = 120) -> dict:
    """Submit a job and poll it to its end; fail at once, saying so, if the worker process dies."""
    code, status = worker.submit(job_type, job_params)
    assert code == 202, status
    deadline = time.monotonic() + timeout
    while status["state"] == "running":
        assert time.monotonic() < deadline, f"job still {status} after {timeout} s"
        time.sleep(0.05)
        if worker.process.poll() is not None:
            pytest.fail(
                f"the worker died (rc={worker.process.returncode}) running {job_type} on {job_params['model_path']}; "
                f"its socket file is {'still there' if worker.socket_path.exists() else 'gone'}; log tail:\n"
                + worker.log()[-1500:]
            )
        code, status = worker.call("GET", f"/v1/jobs/{status['id']}")
        assert code == 200, status
    return status


def assert_serves(worker: WorkerProcess) -> None:
    """The same worker process, on its socket, runs a job on the good model to success."""
    assert worker.process.poll() is None and answers(worker.socket_path)
    status = outcome(worker, GENERATE, params("tiny.gguf", GENERATE, prompts=["Hello world"], max_tokens=4))
    assert status["state"] == "succeeded", status
    assert status["result"]["outputs"][0]["completion_tokens"] == 4


# --------------------------------------------------------------------------- every malformed model


@pytest.mark.parametrize(
    ("model", "job_type", "code", "says"),
    [
        ("repeated-token.gguf", BENCHMARK, "MODEL_LOAD_FAILED", ["SIGABRT", "while loading the model", "GGML_ASSERT"]),
        ("repeated-token.gguf", GENERATE, "MODEL_LOAD_FAILED", ["SIGABRT", "id_to_token.size() == token_to_id"]),
        ("absurd-dimensions.gguf", BENCHMARK, "MODEL_LOAD_FAILED", ["SIGABRT", "n_layer"]),
        ("no-byte-tokens.gguf", GENERATE, "RUNTIME_ENGINE_CRASHED", ["SIGABRT", "phase prompts", "out_of_range"]),
        ("truncated-data.gguf", BENCHMARK, "MODEL_LOAD_FAILED", ["not within the file bounds"]),
        ("truncated-header.gguf", GENERATE, "MODEL_LOAD_FAILED", ["llama.cpp could not load the model"]),
    ],
)
def test_a_malformed_model_fails_its_job_and_the_worker_serves_the_next(worker, artifacts, model, job_type, code, says):
    status = outcome(worker, job_type, params(model, job_type))
    assert status["state"] == "failed", status
    error = status["error"]
    assert (error["code"], error["retryable"]) == (code, False), error
    for words in says:
        assert words in error["message"], error
    assert str(artifacts) not in error["message"], "the worker's own paths stay out of job errors"
    assert status["result"] is None
    if "SIGABRT" in says:
        assert f"job {status['id']}: the engine process" in worker.log() and "SIGABRT" in worker.log()
    assert_serves(worker)


def test_the_model_without_byte_tokens_still_benchmarks_and_answers_what_it_can_spell(worker):
    """Only the character it cannot spell kills it: the same file benchmarks (random token ids)."""
    status = outcome(worker, BENCHMARK, params("no-byte-tokens.gguf", BENCHMARK))
    assert status["state"] == "succeeded", status
    status = outcome(worker, GENERATE, params("no-byte-tokens.gguf", GENERATE, prompts=["Hello world"]))
    assert status["state"] == "succeeded", status


def test_every_retry_of_a_crashing_job_fails_the_same_and_the_worker_never_dies(worker):
    pid = worker.process.pid
    for _ in range(3):
        status = outcome(worker, GENERATE, params("no-byte-tokens.gguf", GENERATE))
        assert status["error"]["code"] == "RUNTIME_ENGINE_CRASHED", status
    assert worker.process.pid == pid and worker.process.poll() is None
    assert_serves(worker)


# --------------------------------------------------------------------------- the engine process's end


def running_engine(worker: WorkerProcess, phase: str = "prompts") -> tuple[str, int]:
    """Start a long generate job; its id and its engine process's pid, once it generates."""
    code, status = worker.submit(GENERATE, params("tiny.gguf", GENERATE, **LONG_GENERATE))
    assert code == 202, status
    worker.wait_until(status["id"], lambda current: current["phase"] == phase)
    (pid,) = worker.children()
    return status["id"], pid


def test_an_engine_process_killed_mid_job_is_runtime_engine_crashed_naming_sigkill(worker):
    job_id, pid = running_engine(worker)
    os.kill(pid, signal.SIGKILL)
    status = worker.finish(job_id)
    assert (status["state"], status["error"]["code"], status["error"]["retryable"]) == (
        "failed",
        "RUNTIME_ENGINE_CRASHED",
        False,
    ), status
    assert "SIGKILL" in status["error"]["message"] and "phase prompts" in status["error"]["message"]
    assert_serves(worker)


def test_cancel_kills_the_engine_process_within_a_second(worker):
    job_id, pid = running_engine(worker)
    asked = time.monotonic()
    code, answer = worker.call("POST", f"/v1/jobs/{job_id}/cancel")
    assert code == 200 and answer["state"] == "cancelled", answer
    wait_until(lambda: gone(pid), "the engine process's end", timeout=1.0)
    assert time.monotonic() - asked < 1.5
    assert answer["error"]["code"] == "JOB_CANCELLED"
    assert_serves(worker)


def test_a_cancel_while_the_engine_process_starts_lands_within_a_second(worker):
    code, status = worker.submit(GENERATE, params("tiny.gguf", GENERATE, **LONG_GENERATE))
    assert code == 202, status
    asked = time.monotonic()
    code, answer = worker.call("POST", f"/v1/jobs/{status['id']}/cancel")  # still importing llama.cpp
    assert (code, answer["state"], answer["phase"]) == (200, "cancelled", "loading"), answer
    assert time.monotonic() - asked < 1.5
    wait_until(lambda: not worker.children(), "no engine process left", timeout=5)
    assert_serves(worker)


def test_a_frozen_engine_process_is_killed_after_its_silence_deadline(worker):
    job_id, pid = running_engine(worker)
    os.kill(pid, signal.SIGSTOP)
    try:
        status = worker.wait_until(job_id, lambda current: current["state"] != "running", timeout=60)
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert (status["state"], status["error"]["code"]) == ("failed", "RUNTIME_ENGINE_CRASHED"), status
    assert "went silent for 15 s" in status["error"]["message"]
    wait_until(lambda: gone(pid), "the frozen engine process's end", timeout=10)
    assert_serves(worker)


def test_a_job_nobody_asks_about_is_cancelled_and_its_engine_process_killed(artifacts, tmp_path):
    directory = short_socket_dir()
    quick = WorkerProcess(
        directory / "w.sock", artifacts, tmp_path / "abandon.log", MODELFORGE_WORKER_ABANDON_SECONDS="3"
    ).start()
    try:
        code, status = quick.submit(GENERATE, params("tiny.gguf", GENERATE, **LONG_GENERATE))
        assert code == 202, status
        time.sleep(1.0)  # the engine process has started
        (pid,) = quick.children()
        wait_until(lambda: gone(pid), "the abandoned job's engine process's end", timeout=30)  # nobody asks meanwhile
        status = quick.wait_until(status["id"], lambda current: current["state"] != "running", timeout=10)
        assert (status["state"], status["error"]["code"]) == ("cancelled", "JOB_CANCELLED"), status
        assert "nobody asked about it for 3 s" in status["error"]["message"]
    finally:
        quick.stop(signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_killed_worker_leaves_no_engine_process_behind(artifacts, tmp_path):
    directory = short_socket_dir()
    doomed = WorkerProcess(directory / "w.sock", artifacts, tmp_path / "doomed.log").start()
    try:
        job_id, pid = running_engine(doomed)
        doomed.kill()  # SIGKILL: no goodbye to its engine process
        wait_until(lambda: gone(pid), "the orphaned engine process's end", timeout=10)
    finally:
        doomed.stop(signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)
