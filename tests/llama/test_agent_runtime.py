"""The agent's side of the runtime worker (W1, W2, J2, A1, A3).

The worker is the real one (`python -m modelforge_runtime_worker` on a CPU, with a tiny GGUF model
from tests/support/tiny_gguf.py) wherever it can be made to do what a test needs; a stand-in socket server
answers only what the real worker never says (another protocol version, garbage, a stall). The
control plane is the recording fake of tests/support/agent.py.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

import modelforge_agent_runtime as runtime_relay
import modelforge_node_agent as agent
from tests.support import wait_until
from tests.support.agent import FakeControlPlane, assert_matches_the_servers_schema, make_agent, make_config, runner_for
from tests.support.worker import WorkerProcess

ARTIFACT = "registry/models/org/tiny/0123456789abcdef0123456789abcdef01234567"
MODEL_FILE = "gguf/tiny.gguf"
RUNTIME_TYPES = [agent.RUNTIME_BENCHMARK_JOB_TYPE, agent.RUNTIME_GENERATE_JOB_TYPE]
# What an agent beside a worker that serves advertises (S2); claims name the job types only.
SERVING = [*RUNTIME_TYPES, agent.RUNTIME_SERVE_CAPABILITY]
ARTIFACT_ID = "5f0c6a54-3f9e-4d3a-9a43-0d6f3f0b7a11"  # the control plane's artifact ids are UUIDs
INVENTORY = {"hostname": "h", "gpus": []}
# Seconds of work for the tiny model, inside its 2048-token context.
LONG_BENCHMARK = {"prompt_tokens": 1024, "generate_tokens": 1000, "repetitions": 50}


# --------------------------------------------------------------------------- the worker, real and stand-in


@pytest.fixture
def artifacts(tmp_path) -> Path:
    """The agent's (and worker's) artifact directory with one verified artifact holding a tiny model."""
    tiny_gguf = pytest.importorskip("tests.support.tiny_gguf")
    root = tmp_path / "artifacts"
    model = root / ARTIFACT / MODEL_FILE
    model.parent.mkdir(parents=True)
    tiny_gguf.write_tiny_llama(model)
    (root / ARTIFACT / "config.json").write_text("{}")
    write_manifest(root / ARTIFACT, {MODEL_FILE: model.stat().st_size, "config.json": 2})
    return root


def write_manifest(artifact: Path, sizes: dict[str, int]) -> None:
    """modelforge-manifest.json as the acquire job writes it (J3)."""
    manifest = {
        "manifest_version": 1,
        "repo_id": "org/tiny",
        "repo_type": "model",
        "revision": "main",
        "commit": artifact.name,
        "files": [{"path": path, "size": size, "sha256": "0" * 64} for path, size in sorted(sizes.items())],
        "total_bytes": sum(sizes.values()),
        "job_id": "acquire-1",
        "acquired_at": "2030-01-01T00:00:00Z",
    }
    (artifact / agent.MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


@pytest.fixture
def worker(socket_dir, artifacts, tmp_path):
    """The real worker, started; stopped after the test."""
    pytest.importorskip("llama_cpp")
    process = WorkerProcess(socket_dir / "worker.sock", artifacts, tmp_path / "worker.log").start()
    yield process
    process.stop()


class StandinWorker:
    """A Unix-socket server that answers every request with one fixed reply, after `delay`
    seconds: only for what the real worker cannot be made to say."""

    def __init__(
        self, path: Path, body: bytes | Callable[[dict], bytes], status: int = 200, delay: float = 0.0
    ) -> None:
        self.path, self.requests, self.busy = path, [], threading.Semaphore(64)
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with standin.busy:
                    standin.requests.append((self.command, self.path))
                    sent = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    answer = body(json.loads(sent or b"{}")) if callable(body) else body
                    time.sleep(delay)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)

            do_POST = do_GET

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving, let a delayed answer finish, and remove the socket file."""
        self.server.shutdown()
        self.thread.join()
        for _ in range(64):  # every handler has let go
            self.busy.acquire(timeout=5)
        self.server.server_close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def standin(socket_dir):
    """Start a stand-in worker: standin(body, status=200, delay=0)."""
    started = []

    def start(body: bytes | dict | Callable[[dict], bytes], status: int = 200, delay: float = 0.0) -> StandinWorker:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        started.append(StandinWorker(socket_dir / "worker.sock", data, status, delay))
        return started[-1]

    yield start
    for server in started:
        server.close()


def info_reply(protocol_version: object = 1) -> dict:
    """A GET /v1/info answer shaped as protocol v1 says, with any protocol version."""
    return {
        "worker_version": "9.9.9",
        "protocol_version": protocol_version,
        "engines": [{"name": "llama.cpp", "version": "0.3.0", "backend": "cpu"}],
        "devices": [],
        "job": None,
    }


# --------------------------------------------------------------------------- the client


def test_a_missing_socket_and_a_dead_one_are_named_at_once(socket_dir):
    path = socket_dir / "worker.sock"
    client = agent.WorkerClient(str(path))
    started = time.monotonic()
    with pytest.raises(agent.WorkerError) as missing:
        client.info()
    assert missing.value.reason == f"no socket at {path}" and missing.value.status is None
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # a socket file nobody listens on: what a SIGKILLed worker leaves
    dead.close()
    with pytest.raises(agent.WorkerError) as refused:
        client.info()
    assert refused.value.reason == f"connection refused at {path}"
    assert time.monotonic() - started < 0.5


def test_a_worker_that_does_not_answer_in_time_is_a_timeout(standin, socket_dir):
    standin(info_reply(), delay=0.6)
    client = agent.WorkerClient(str(socket_dir / "worker.sock"), read_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(agent.WorkerError) as timed_out:
        client.info()
    assert time.monotonic() - started < 0.5
    assert timed_out.value.timed_out and timed_out.value.reason.startswith("timed out on GET /v1/info at ")


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"<html>hello</html>", 200, "not JSON on GET /v1/info"),
        (b"[1, 2]", 200, "not a JSON object on GET /v1/info"),
        (b"x" * (agent.WORKER_REPLY_MAX_BYTES + 1), 200, "reply to GET /v1/info is larger than 1048576 bytes"),
        (b'{"error": {"code": "WORKER_BUSY", "message": "job j is running", "retryable": true}}', 409, None),
        (b"oops", 500, "HTTP 500 ERROR on GET /v1/info"),
    ],
)
def test_every_bad_answer_is_one_line(standin, socket_dir, body, status, reason):
    standin(body, status)
    with pytest.raises(agent.WorkerError) as bad:
        agent.WorkerClient(str(socket_dir / "worker.sock")).info()
    if status == 409:
        error = bad.value
        assert (error.reason, error.status, error.code) == ("HTTP 409 WORKER_BUSY on GET /v1/info", 409, "WORKER_BUSY")
        assert (error.message, error.retryable) == ("job j is running", True)
    else:
        assert bad.value.reason == reason
    assert "\n" not in bad.value.reason


# --------------------------------------------------------------------------- probe and gating


@pytest.mark.parametrize(
    ("answered", "protocol_sent"),
    [
        (0, 0),
        (2, 2),
        ("garbage", "garbage"),
        (1.0, "1.0"),
        (True, "true"),
        (None, "null"),
        ("", '""'),
        ([1], "[1]"),
        ("x" * 100, "x" * 32),
    ],
)
def test_a_worker_of_another_protocol_is_reported_but_never_advertised(
    tmp_path, socket_dir, standin, answered, protocol_sent
):
    standin(info_reply(answered))
    watch = agent.RuntimeWorkerWatch(agent.WorkerClient(str(socket_dir / "worker.sock")))
    assert watch.probe() is True
    assert not watch.compatible and agent.advertised_capabilities(watch.compatible) == [
        agent.ACQUIRE_JOB_TYPE,
        agent.DELETE_JOB_TYPE,
    ]
    fields = watch.inventory_fields()
    # A1: the control plane answers TOO_OLD / TOO_NEW / UNKNOWN from the version as it was sent.
    assert fields["runtime_worker"] == {
        "worker_version": "9.9.9",
        "protocol_version": protocol_sent,
        "engines": [{"name": "llama.cpp", "version": "0.3.0", "backend": "cpu"}],
        "devices": [],
    }
    assert fields["runtime_worker_problem"] == f"the worker speaks protocol {protocol_sent}; this agent speaks 1"
    body = {"protocol_version": 1, "agent_version": agent.AGENT_VERSION, "inventory": INVENTORY, **fields}
    assert_matches_the_servers_schema(body, "InventoryRequest")
    assert watch.probe() is False  # the same answer again changes nothing


def test_odd_entries_are_left_out_so_the_inventory_is_never_refused_for_them(socket_dir, standin):
    reply = info_reply()
    reply["engines"] += [{"version": "1"}, {"name": "  "}, "llama.cpp"]
    reply["devices"] = [
        {"uuid": "GPU-1", "name": "n" * 300, "memory_total_bytes": -1},
        {"name": "no uuid"},
        {"uuid": "GPU-\u0007", "name": None},
    ]
    standin(reply)
    watch = agent.RuntimeWorkerWatch(agent.WorkerClient(str(socket_dir / "worker.sock")))
    watch.probe()
    facts = watch.inventory_fields()["runtime_worker"]
    assert facts["engines"] == [{"name": "llama.cpp", "version": "0.3.0", "backend": "cpu"}]
    assert facts["devices"] == [
        {"uuid": "GPU-1", "name": "n" * 200, "memory_total_bytes": None},
        {"uuid": "GPU-?", "name": None, "memory_total_bytes": None},
    ]
    body = {
        "protocol_version": 1,
        "agent_version": agent.AGENT_VERSION,
        "inventory": INVENTORY,
        **watch.inventory_fields(),
    }
    assert_matches_the_servers_schema(body, "InventoryRequest")


def test_an_answer_without_a_worker_version_is_no_workers(socket_dir, standin):
    standin({**info_reply(), "worker_version": " "})
    watch = agent.RuntimeWorkerWatch(agent.WorkerClient(str(socket_dir / "worker.sock")))
    watch.probe()
    assert watch.inventory_fields() == {
        "runtime_worker": None,
        "runtime_worker_problem": "GET /v1/info answered without a worker_version",
    }


def test_a_worker_that_answers_garbage_is_no_worker(socket_dir, standin):
    standin(b"not json at all")
    watch = agent.RuntimeWorkerWatch(agent.WorkerClient(str(socket_dir / "worker.sock")))
    watch.probe()
    assert watch.inventory_fields() == {
        "runtime_worker": None,
        "runtime_worker_problem": "not JSON on GET /v1/info",
    }
    assert not watch.compatible


def test_the_real_worker_is_compatible_and_its_facts_go_in_the_inventory(worker):
    watch = agent.RuntimeWorkerWatch(agent.WorkerClient(str(worker.socket_path)))
    assert watch.probe() is True and watch.compatible
    facts = watch.inventory_fields()
    assert facts["runtime_worker_problem"] is None
    runtime = facts["runtime_worker"]
    assert runtime.keys() == {"worker_version", "protocol_version", "engines", "devices"}
    assert runtime["protocol_version"] == 1 and runtime["devices"] == []  # CPU mode: no GPU, none invented
    (engine,) = runtime["engines"]
    assert engine["name"] == "llama.cpp" and engine["backend"] == "cpu" and engine["version"]
    assert agent.advertised_capabilities(True) == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE, *RUNTIME_TYPES]
    assert agent.advertised_capabilities(True, True) == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE, *SERVING]


def test_runtime_types_are_advertised_only_while_a_compatible_worker_answers(tmp_path, socket_dir, artifacts, caplog):
    pytest.importorskip("llama_cpp")
    socket_path = socket_dir / "worker.sock"
    control_plane = FakeControlPlane()
    config = make_config(tmp_path, control_plane.url, MODELFORGE_AGENT_WORKER_SOCKET=str(socket_path))
    running = make_agent(config)
    caplog.set_level("INFO", logger="modelforge_node_agent")
    process = WorkerProcess(socket_path, artifacts, tmp_path / "worker.log")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(agent.log, "propagate", True)
            running.start()
            for _ in range(3):  # no worker: asked at every beat, said once
                running.publish_once()
                running.maybe_claim()
            process.start()
            running.publish_once()  # the next beat finds it, and the inventory goes out at once
            running.claim_due = True
            running.maybe_claim()
            process.stop()
            running.publish_once()  # a compatible worker is asked again only at the inventory check
            running.inventory_checked_at -= agent.INVENTORY_CHECK_SECONDS
            running.publish_once()
            running.publish_once()
    finally:
        process.stop()
        control_plane.close()
    first, second, third = control_plane.bodies("inventory")
    assert control_plane.names()[:2] == ["inventory", "heartbeat"]
    assert first["capabilities"] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE]
    assert first["runtime_worker"] is None and first["runtime_worker_problem"] == f"no socket at {socket_path}"
    assert second["capabilities"] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE, *SERVING]
    assert second["runtime_worker"]["protocol_version"] == 1 and second["runtime_worker_problem"] is None
    assert third["capabilities"] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE] and third["runtime_worker"] is None
    # The worker's SIGTERM removes its socket file.
    assert third["runtime_worker_problem"] == f"no socket at {socket_path}"
    # No worker: an inventory, then beats; one appears: an inventory before the very next beat;
    # it goes: noticed at the next inventory check.
    assert control_plane.names() == [
        *("inventory", "heartbeat", "claim", "heartbeat", "heartbeat"),
        *("inventory", "heartbeat", "claim", "heartbeat"),
        *("inventory", "heartbeat", "heartbeat"),
    ]
    claims = control_plane.bodies("claim")
    assert claims[0]["capabilities"] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE]
    assert claims[-1]["capabilities"] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE, *RUNTIME_TYPES]
    assert caplog.text.count("no runtime worker: no socket at") == 1
    assert caplog.text.count("(protocol 1, llama.cpp ") == 1 and "runtime jobs are advertised" in caplog.text
    assert caplog.text.count("runtime worker gone: no socket at") == 1


# --------------------------------------------------------------------------- runtime jobs


def runtime_job(artifacts: Path, job_type: str = agent.RUNTIME_BENCHMARK_JOB_TYPE, **params) -> dict:
    """The `job` of a claim reply for a runtime job, with the artifact's container_path resolved."""
    defaults = (
        {"prompt_tokens": 16, "generate_tokens": 4, "repetitions": 2}
        if job_type == agent.RUNTIME_BENCHMARK_JOB_TYPE
        else {"prompts": ["Hello", "the model"], "max_tokens": 8}
    )
    return {
        "id": "job-7",
        "type": job_type,
        "attempt": 1,
        "max_attempts": 3,
        "params": {
            "artifact_id": ARTIFACT_ID,
            "model_file": MODEL_FILE,
            "container_path": str(artifacts / ARTIFACT),
            **defaults,
            **params,
        },
        "lease_expires_at": "2030-01-01T00:00:00Z",
        "lease_seconds": 60,
        "progress_interval_seconds": 0.1,
    }


@pytest.fixture
def control_plane():
    fake = FakeControlPlane()
    yield fake
    fake.close()


def worker_config(tmp_path: Path, control_plane: FakeControlPlane, socket_path: Path) -> agent.Config:
    return make_config(tmp_path, control_plane.url, MODELFORGE_AGENT_WORKER_SOCKET=str(socket_path))


def test_a_benchmark_runs_in_the_worker_and_its_result_names_the_artifact(tmp_path, worker, control_plane, caplog):
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    caplog.set_level("INFO", logger="modelforge_node_agent")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent.log, "propagate", True)
        runner = runner_for(config, runtime_job(worker.artifact_dir)).start()
        runner.thread.join(timeout=60)
    (complete,) = control_plane.bodies("complete")
    result = complete["result"]
    assert (result["artifact_id"], result["model_file"]) == (ARTIFACT_ID, MODEL_FILE)
    assert result["engine"]["name"] == "llama.cpp" and result["engine"]["backend"] == "cpu"
    assert (result["prompt_tokens"], result["generate_tokens"], result["repetitions"]) == (16, 4, 2)
    assert len(result["prompt_tokens_per_second"]["samples"]) == 2 and result["prompt_tokens_per_second"]["mean"] > 0
    assert result["gpu_uuids"] == [] and result["peak_gpu_memory_bytes"] is None
    assert control_plane.bodies("fail") == []
    progress = [body["progress"] for body in control_plane.bodies("progress")]
    # Runtime progress: the zero counts, and the worker's phase and steps (J2 renews the lease).
    assert progress[-1]["phase"] == "done" and progress[-1]["steps_done"] == progress[-1]["steps_total"] > 0
    assert all(body.keys() <= {*agent.Progress().to_wire(), "phase", "steps_done", "steps_total"} for body in progress)
    assert all(body["bytes_done"] == body["files_done"] == 0 for body in progress)
    assert f"job job-7 ({agent.RUNTIME_BENCHMARK_JOB_TYPE}, attempt 1) succeeded: {MODEL_FILE}: prompt " in caplog.text
    assert worker.call("GET", "/v1/info")[1]["job"]["state"] == "succeeded"
    assert_matches_the_servers_schema(result, "BenchmarkResult")
    for body in control_plane.bodies("progress"):
        assert_matches_the_servers_schema(body, "ProgressRequest")


def test_a_generate_job_returns_the_text_twice_the_same(tmp_path, worker, control_plane):
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    for _ in range(2):
        runner = runner_for(config, runtime_job(worker.artifact_dir, agent.RUNTIME_GENERATE_JOB_TYPE)).start()
        runner.thread.join(timeout=60)
    first, second = (body["result"] for body in control_plane.bodies("complete"))
    assert first["artifact_id"] == ARTIFACT_ID and first["model_file"] == MODEL_FILE
    assert [output["prompt"] for output in first["outputs"]] == ["Hello", "the model"]
    assert first["outputs"] == second["outputs"]  # temperature 0, fixed seed
    assert_matches_the_servers_schema(first, "GenerateResult")


def break_manifest(artifact: Path) -> None:
    (artifact / agent.MANIFEST_NAME).unlink()


def unlist_model(artifact: Path) -> None:
    write_manifest(artifact, {"config.json": 2})


def wrong_size(artifact: Path) -> None:
    write_manifest(artifact, {MODEL_FILE: (artifact / MODEL_FILE).stat().st_size + 1, "config.json": 2})


def symlinked_file(artifact: Path) -> None:
    model = artifact / MODEL_FILE
    real = artifact / "gguf" / "real.gguf"
    model.rename(real)
    model.symlink_to(real)  # even a link that stays inside the artifact is refused


def symlinked_folder(artifact: Path) -> None:
    (artifact / "gguf").rename(artifact / "elsewhere")
    (artifact / "gguf").symlink_to(artifact / "elsewhere")


@pytest.mark.parametrize(
    ("spoil", "params", "says"),
    [
        (break_manifest, {}, "has no readable modelforge-manifest.json"),
        (unlist_model, {}, "gguf/tiny.gguf is not listed (with its size) in the manifest"),
        (wrong_size, {}, "bytes on disk; its manifest says"),
        (symlinked_file, {}, "is a symlink or not a regular file"),
        (symlinked_folder, {}, "cannot be reached without a symlink"),
        (None, {"model_file": "../tiny/gguf/tiny.gguf"}, "is not a plain path inside the artifact"),
        (None, {"model_file": "/etc/passwd"}, "is not a plain path inside the artifact"),
        (None, {"container_path": "/etc"}, "is not below the artifact directory"),
        (None, {"container_path": "{artifacts}/registry/../../outside"}, "is not below the artifact directory"),
        (None, {"model_file": "config.json.missing"}, "is not listed"),
    ],
)
def test_a_model_file_that_is_not_a_verified_artifact_file_never_reaches_the_worker(
    tmp_path, worker, control_plane, spoil, params, says
):
    if spoil is not None:
        spoil(worker.artifact_dir / ARTIFACT)
    params = {key: value.format(artifacts=worker.artifact_dir) for key, value in params.items()}
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    runner = runner_for(config, runtime_job(worker.artifact_dir, **params)).start()
    runner.thread.join(timeout=10)
    (fail,) = control_plane.bodies("fail")
    assert_matches_the_servers_schema(fail, "FailRequest")
    assert (fail["error"]["code"], fail["retryable"]) == (runtime_relay.MODEL_FILE_INVALID, False)
    assert says in fail["error"]["message"]
    assert worker.call("GET", "/v1/info")[1]["job"] is None  # the worker was never asked


def test_bad_params_fail_naming_the_field_before_the_worker_is_asked(tmp_path, worker, control_plane):
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    for params, named in (
        ({"artifact_id": None}, "params.artifact_id"),
        ({"container_path": "rel"}, "params.container_path"),
    ):
        runner_for(config, runtime_job(worker.artifact_dir, **params)).start().thread.join(timeout=10)
        assert control_plane.bodies("fail")[-1]["error"]["message"].startswith(named)
    runner_for(config, runtime_job(worker.artifact_dir, repetitions=0)).start().thread.join(timeout=10)
    last = control_plane.bodies("fail")[-1]
    assert (last["error"]["code"], last["retryable"]) == (agent.JOB_PARAMS_INVALID, False)
    assert "params.repetitions" in last["error"]["message"]  # the worker names what it refused


def test_a_file_the_worker_cannot_load_fails_with_the_workers_code(tmp_path, worker, control_plane):
    tiny_gguf = pytest.importorskip("tests.support.tiny_gguf")
    model = worker.artifact_dir / ARTIFACT / MODEL_FILE
    tiny_gguf.write_not_gguf(model)
    write_manifest(worker.artifact_dir / ARTIFACT, {MODEL_FILE: model.stat().st_size})
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    runner_for(config, runtime_job(worker.artifact_dir)).start().thread.join(timeout=30)
    (fail,) = control_plane.bodies("fail")
    assert fail["error"]["code"] == "MODEL_LOAD_FAILED" and fail["retryable"] is False


def test_a_model_that_crashes_the_engine_fails_not_retryable_and_the_worker_stays(tmp_path, worker, control_plane):
    tiny_gguf = pytest.importorskip("tests.support.tiny_gguf")
    model = worker.artifact_dir / ARTIFACT / MODEL_FILE
    tiny_gguf.write_without_byte_tokens(model)  # issue 22: llama.cpp aborts on a newline it cannot spell
    write_manifest(worker.artifact_dir / ARTIFACT, {MODEL_FILE: model.stat().st_size})
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    job = runtime_job(worker.artifact_dir, agent.RUNTIME_GENERATE_JOB_TYPE, prompts=["one\ntwo"])
    runner_for(config, job).start().thread.join(timeout=60)
    (fail,) = control_plane.bodies("fail")
    assert (fail["error"]["code"], fail["retryable"]) == (runtime_relay.RUNTIME_ENGINE_CRASHED, False), fail
    assert "SIGABRT" in fail["error"]["message"] and "out_of_range" in fail["error"]["message"]
    assert_matches_the_servers_schema(fail, "FailRequest")
    assert worker.process.poll() is None and worker.call("GET", "/v1/info")[1]["job"]["state"] == "failed"


@pytest.mark.parametrize("code", ["MODEL_LOAD_FAILED", "RUNTIME_ENGINE_CRASHED", "MODEL_FILE_INVALID"])
def test_a_model_failure_is_never_retried_even_if_a_worker_says_so(tmp_path, socket_dir, standin, control_plane, code):
    def failed(submitted: dict) -> bytes:  # what the real worker never says: a bad model is retryable
        error = {"code": code, "message": "the same file fails the same way", "retryable": True}
        status = {"id": submitted.get("id"), "type": submitted.get("type"), "state": "failed", "phase": "loading",
                  "steps_done": 0, "steps_total": 1, "result": None, "error": error}  # fmt: skip
        return json.dumps(status).encode()

    standin(failed)
    artifacts = tmp_path / "artifacts"
    model = artifacts / ARTIFACT / MODEL_FILE
    model.parent.mkdir(parents=True)
    model.write_bytes(b"GGUF")
    write_manifest(artifacts / ARTIFACT, {MODEL_FILE: 4})
    config = worker_config(tmp_path, control_plane, socket_dir / "worker.sock")  # artifacts: tmp_path/artifacts
    runner_for(config, runtime_job(artifacts)).start().thread.join(timeout=30)
    (fail,) = control_plane.bodies("fail")
    assert (fail["error"]["code"], fail["retryable"]) == (code, False), fail


def test_cancel_reaches_the_worker_within_a_second_or_two_and_frees_it(tmp_path, worker, control_plane):
    cancelled_at = []

    def progress(body):
        running = body["progress"].get("phase") in ("warmup", "prompt", "generate")
        if running and not cancelled_at:
            cancelled_at.append(time.monotonic())
        return 200, {"lease_expires_at": "2030-01-01T00:00:00Z", "cancel_requested": bool(cancelled_at)}

    control_plane.scripts["progress"] = progress
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    runner = runner_for(config, runtime_job(worker.artifact_dir, **LONG_BENCHMARK)).start()
    (fail,) = control_plane.wait_for("fail", timeout=60)
    assert time.monotonic() - cancelled_at[0] < 2.0
    assert (fail["error"]["code"], fail["retryable"]) == (agent.JOB_CANCELLED, False)
    runner.thread.join(timeout=5)
    assert worker.call("GET", "/v1/info")[1]["job"]["state"] == "cancelled"  # idle again: the next job is taken


def test_a_stopping_agent_cancels_its_job_in_the_worker_and_reports_nothing(tmp_path, worker, control_plane):
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    running = make_agent(config)
    running.runner = runner_for(config, runtime_job(worker.artifact_dir, **LONG_BENCHMARK)).start()
    wait_until(lambda: (worker.call("GET", "/v1/info")[1]["job"] or {}).get("state") == "running")
    started = time.monotonic()
    running.stop_job()  # what Agent.run does on its way out (SIGTERM)
    assert time.monotonic() - started < agent.JOB_STOP_GRACE_SECONDS + 0.5
    assert not running.runner.alive()
    assert control_plane.bodies("fail") == control_plane.bodies("complete") == []  # the lease decides (J2)
    assert worker.call("GET", "/v1/info")[1]["job"]["state"] == "cancelled"


def test_a_job_left_running_by_an_earlier_run_is_cancelled_first(tmp_path, worker, control_plane, caplog):
    client = agent.WorkerClient(str(worker.socket_path))
    stale_params = {
        **runtime_job(worker.artifact_dir)["params"],
        **LONG_BENCHMARK,
        "model_path": f"{ARTIFACT}/{MODEL_FILE}",
    }
    client.submit("job-7-1-stale", agent.RUNTIME_BENCHMARK_JOB_TYPE, stale_params)
    config = worker_config(tmp_path, control_plane, worker.socket_path)
    caplog.set_level("INFO", logger="modelforge_node_agent")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent.log, "propagate", True)
        runner = runner_for(config, {**runtime_job(worker.artifact_dir), "attempt": 2}).start()
        runner.thread.join(timeout=60)
    assert len(control_plane.bodies("complete")) == 1 and control_plane.bodies("fail") == []
    assert "the runtime worker still runs job-7-1-stale from an earlier run; cancelling it" in caplog.text
    assert "job job-7-1-stale: cancel requested" in worker.log()
    assert worker.call("GET", "/v1/info")[1]["job"]["state"] == "succeeded"  # the worker keeps only the last job: ours


def test_a_killed_worker_fails_the_job_retryable_and_is_advertised_again_once_back(
    tmp_path, socket_dir, artifacts, control_plane, caplog
):
    pytest.importorskip("llama_cpp")
    socket_path = socket_dir / "worker.sock"
    process = WorkerProcess(socket_path, artifacts, tmp_path / "worker.log").start()
    claims = []

    def claim(body):
        claims.append(body["capabilities"])
        return (200, {"job": runtime_job(artifacts, **LONG_BENCHMARK)}) if len(claims) == 2 else (204, None)

    control_plane.scripts["claim"] = claim
    running = make_agent(worker_config(tmp_path, control_plane, socket_path))
    caplog.set_level("INFO", logger="modelforge_node_agent")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(agent.log, "propagate", True)
            running.start()
            running.publish_once()
            running.maybe_claim()  # the claim after start-up: nothing waits
            running.claim_due = True
            running.maybe_claim()  # this one gets the benchmark
            wait_until(lambda: (process.call("GET", "/v1/info")[1]["job"] or {}).get("state") == "running")
            process.kill()
            running.runner.thread.join(timeout=10)
            running.publish_once()  # the agent goes on publishing
            running.maybe_claim()  # the job ended: the worker is unknown, so no runtime type is claimed
            running.publish_once()  # asked again at this beat: still gone, and the control plane is told
            process.start()
            running.publish_once()  # asked at the next beat: back
            running.claim_due = True
            running.maybe_claim()
    finally:
        process.stop()
    (fail,) = control_plane.bodies("fail")
    assert (fail["error"]["code"], fail["retryable"]) == (agent.RUNTIME_WORKER_UNAVAILABLE, True)
    # Refused, or reset when the kill lands in the middle of a poll: either way it stopped answering.
    assert fail["error"]["message"].startswith("the runtime worker stopped answering: "), fail
    assert claims[1] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE, *RUNTIME_TYPES]
    assert claims[2] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE]
    assert claims[3] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE, *RUNTIME_TYPES]
    inventories = control_plane.bodies("inventory")
    assert [body["runtime_worker"] is not None for body in inventories] == [True, False, True], inventories
    assert inventories[1]["runtime_worker_problem"] == f"connection refused at {socket_path}"
    assert control_plane.names().count("heartbeat") == 4
    assert caplog.text.count("runtime worker gone: ") == 1


# --------------------------------------------------------------------------- progress on the wire


def test_acquire_progress_stays_four_fields_and_runtime_progress_adds_three():
    assert agent.Progress(1, 2, 3, 4).to_wire() == {
        "bytes_done": 1,
        "bytes_total": 2,
        "files_done": 3,
        "files_total": 4,
    }
    assert agent.Progress(phase="warmup", steps_done=0, steps_total=12).to_wire() == {
        "bytes_done": 0,
        "bytes_total": 0,
        "files_done": 0,
        "files_total": 0,
        "phase": "warmup",
        "steps_done": 0,
        "steps_total": 12,
    }
