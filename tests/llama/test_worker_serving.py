"""The runtime worker's serving mode: a deployment keeps its model loaded in an engine process of
its own and streams generations over the Unix socket (S2, S4, S5, W1).

The real worker and llama.cpp on the tiny random-weight llama (tests/support/tiny_gguf.py),
whose EOS logit is zero: a greedy generation never stops early, so every completion runs to its
limit and a long one takes seconds.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.tiny_gguf import write_tiny_llama, write_truncated
from tests.support.worker import UnixHTTPConnection, WorkerProcess, deploy, serving_worker

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
LOAD_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serving-artifacts")
    write_tiny_llama(root / "tiny.gguf", seed=0)
    write_tiny_llama(root / "templated.gguf", seed=0, chat_template=CHAT_TEMPLATE)
    write_truncated(root / "truncated.gguf")
    return root


@pytest.fixture(scope="module")
def worker(artifacts, tmp_path_factory):
    with serving_worker(artifacts, tmp_path_factory.mktemp("worker") / "worker.log") as process:
        yield process


class Stream:
    """One POST …/generate, read event by event as the worker streams it."""

    def __init__(self, worker: WorkerProcess, deployment_id: str, body: dict) -> None:
        self.connection = UnixHTTPConnection(str(worker.socket_path), timeout=30)
        data = json.dumps(body).encode()
        self.connection.request(
            "POST", f"/v1/deployments/{deployment_id}/generate", body=data, headers={"Content-Type": "application/json"}
        )
        self.response = self.connection.getresponse()
        self.status = self.response.status

    def events(self):
        while line := self.response.readline():
            yield json.loads(line)

    def close(self) -> None:
        self.connection.close()


def generate(worker: WorkerProcess, deployment_id: str, **body) -> tuple[str, dict, list[str]]:
    """A whole generation: its text, its last event, and the pieces it came in."""
    stream = Stream(worker, deployment_id, {"kind": "completion", "prompt": "Hello", **body})
    try:
        assert stream.status == 200, stream.response.read()
        pieces, last = [], None
        for event in stream.events():
            if event["event"] == "token":
                pieces.append(event["text"])
            else:
                last = event
        return "".join(pieces), last, pieces
    finally:
        stream.close()


def engine_pid(worker: WorkerProcess) -> set[int]:
    """The worker's children: its engine processes."""
    pid = worker.process.pid
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children |= {int(child) for child in (task / "children").read_text().split()}
        except FileNotFoundError:
            continue
    return children


# --------------------------------------------------------------------------- deployments


def test_a_deployment_loads_once_and_serves_many_generations_from_one_engine_process(worker):
    status = deploy(worker)
    assert status["state"] == "ready", status
    assert status["context_length"] == 2048  # the model's own, under the 8192 cap
    assert status["chat_template"] == "llama-2"  # the tiny model carries none: the fallback
    assert status["measured"]["load_seconds"] > 0
    assert status["measured"]["memory_bytes"] > 10 * 2**20  # the engine process's RSS with the model
    before = engine_pid(worker)
    assert before, "no engine process holds the model"

    for _ in range(3):
        text, last, _ = generate(worker, status["id"], max_tokens=8, temperature=0)
        assert last["event"] == "finished" and last["finish_reason"] == "length", last
        assert text
    assert engine_pid(worker) == before, "the model was loaded again"
    # The handler lets go of a stream just after its last event, so the count drops a moment later.
    after = wait_until(
        lambda: (found := worker.call("GET", f"/v1/deployments/{status['id']}")[1])["in_flight"] == 0 and found,
        "no request in flight once every answer has ended",
        5,
    )
    assert after["measured"]["requests"] == 3
    assert after["measured"]["generated_tokens"] == 24
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def test_the_same_seed_gives_the_same_text_and_the_pieces_join_to_it(worker):
    status = deploy(worker)
    greedy = [generate(worker, status["id"], max_tokens=16, temperature=0) for _ in range(2)]
    assert greedy[0][0] == greedy[1][0]
    text, last, pieces = greedy[0]
    assert len(pieces) > 1 and "".join(pieces) == text
    assert last["usage"]["completion_tokens"] == 16
    assert last["usage"]["prompt_tokens"] > 0
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 16
    assert last["timings"]["time_to_first_token_seconds"] > 0

    sampled = [generate(worker, status["id"], max_tokens=16, temperature=0.9, seed=7)[0] for _ in range(2)]
    assert sampled[0] == sampled[1]
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def test_a_stop_string_ends_the_text_just_before_it(worker):
    status = deploy(worker)
    whole, _, _ = generate(worker, status["id"], max_tokens=24, temperature=0)
    stop = whole[6:9]
    assert stop and stop in whole
    text, last, _ = generate(worker, status["id"], max_tokens=24, temperature=0, stop=[stop])
    assert text == whole[: whole.find(stop)]
    assert last["finish_reason"] == "stop"
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def test_chat_uses_the_models_own_template_when_it_has_one(worker):
    templated, fallback = deploy(worker, "templated.gguf"), deploy(worker, "tiny.gguf")
    assert templated["chat_template"] == "gguf" and fallback["chat_template"] == "llama-2"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    prompts = []
    for status in (templated, fallback):
        stream = Stream(worker, status["id"], {"kind": "chat", "messages": messages, "max_tokens": 4, "temperature": 0})
        last = list(stream.events())[-1]
        stream.close()
        assert last["event"] == "finished", last
        prompts.append(last["usage"]["prompt_tokens"])
    # The same messages make a different prompt under each template.
    assert prompts[0] != prompts[1]
    for status in (templated, fallback):
        worker.call("DELETE", f"/v1/deployments/{status['id']}")


# Long enough that the first answer cannot end before the fourth request is even sent (48 tokens of
# the tiny model took 1 ms less than sending four requests once, on a loaded CI machine).
TOGETHER = 400


def test_four_generations_run_together_in_slots_and_each_gets_the_text_it_gets_alone(worker):
    """W1: SERVE_SLOTS generations are decoded together (bench/slots.py): every one has its first
    token before any has its last, and each gets its own answer. (Greedy text may drift from the
    text alone after many tokens: batched kernels add in another order and a near tie can flip.)"""
    status = deploy(worker)
    prompts = [f"Hello number {index}" for index in range(4)]
    alone = [generate(worker, status["id"], prompt=prompt, max_tokens=TOGETHER, temperature=0)[0] for prompt in prompts]
    assert len(set(alone)) == 4
    streams = [
        Stream(worker, status["id"], {"kind": "completion", "prompt": prompt, "max_tokens": TOGETHER, "temperature": 0})
        for prompt in prompts
    ]
    seen: list[dict] = [{} for _ in streams]

    def read(index: int) -> None:
        pieces = []
        for event in streams[index].events():
            if event["event"] == "token":
                seen[index].setdefault("first", time.monotonic())
                pieces.append(event["text"])
            else:
                seen[index]["usage"] = event["usage"]
        seen[index].update(last=time.monotonic(), text="".join(pieces))

    readers = [threading.Thread(target=read, args=(index,)) for index in range(4)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=30)
    for stream in streams:
        stream.close()
    assert [each["text"][:12] for each in seen] == [text[:12] for text in alone]  # no answer crossed over
    assert all(each["usage"]["completion_tokens"] == TOGETHER for each in seen)
    assert max(each["first"] for each in seen) < min(each["last"] for each in seen)  # a queue would not
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def test_a_generation_that_may_fill_the_context_runs_alone_and_the_next_waits_its_turn(worker):
    """W1: the slots share one KV cache; a request without max_tokens may fill the context, so the
    next is let in only when the first ends (here: its client hangs up), never to fail mid-answer."""
    status = deploy(worker, context_length=8192)
    whole = Stream(worker, status["id"], {"kind": "completion", "prompt": "Hello", "temperature": 0})
    events = whole.events()
    assert next(events)["event"] == "token"
    answered: list[dict] = []
    waiter = threading.Thread(
        target=lambda: answered.append(generate(worker, status["id"], max_tokens=4, temperature=0)[1])
    )
    waiter.start()
    for _ in range(200):  # the first streams on meanwhile
        assert next(events)["event"] == "token"
    assert not answered, "the second request was let in beside one that may fill the context"
    whole.close()
    waiter.join(timeout=5)
    assert answered and answered[0]["event"] == "finished" and answered[0]["usage"]["completion_tokens"] == 4
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def resident_bytes(worker: WorkerProcess) -> int:
    """The worker's resident set and its engine processes', together."""
    total = 0
    for pid in {worker.process.pid, *engine_pid(worker)}:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except FileNotFoundError:
            continue
    return total


def test_an_idle_model_is_unloaded_its_memory_freed_and_the_next_request_loads_it_again(worker, artifacts):
    """S2: after idle_unload_seconds without a request the engine process ends (the memory goes
    with it); the next request waits while the model loads again and gets the same answer."""
    before = engine_pid(worker)
    status = deploy(worker, idle_unload_seconds=1)
    (engine,) = engine_pid(worker) - before
    first, _, _ = generate(worker, status["id"], max_tokens=16, temperature=0)
    loaded = resident_bytes(worker)

    def unloaded():
        answer = worker.call("GET", f"/v1/deployments/{status['id']}")[1]
        return answer if answer["state"] == "unloaded" else None

    wait_until(unloaded, "the idle model to be unloaded", 10)
    assert engine not in engine_pid(worker)  # its process, and the model with it, is gone
    model_bytes = (artifacts / "tiny.gguf").stat().st_size
    assert loaded - resident_bytes(worker) >= model_bytes
    again, last, _ = generate(worker, status["id"], max_tokens=16, temperature=0)  # loads it again
    assert again == first and last["usage"]["completion_tokens"] == 16
    after = worker.call("GET", f"/v1/deployments/{status['id']}")[1]
    assert after["state"] == "ready" and after["measured"]["requests"] == 2
    assert "unloaded after 1 s without a request" in worker.log()
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def test_a_model_kept_loaded_is_never_unloaded(worker):
    status = deploy(worker, idle_unload_seconds=0)
    generate(worker, status["id"], max_tokens=2, temperature=0)
    time.sleep(1.5)  # longer than the shortest idle time above
    assert worker.call("GET", f"/v1/deployments/{status['id']}")[1]["state"] == "ready"
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def test_a_client_that_hangs_up_stops_its_generation_within_a_second(worker):
    status = deploy(worker, context_length=8192)
    stream = Stream(worker, status["id"], {"kind": "completion", "prompt": "Hello", "temperature": 0})
    events = stream.events()
    for _ in range(5):
        assert next(events)["event"] == "token"
    stream.close()
    hung_up = time.monotonic()

    def idle():
        answer = worker.call("GET", f"/v1/deployments/{status['id']}")[1]
        return answer if answer["in_flight"] == 0 else None

    after = wait_until(idle, "the cancelled generation to end", 5.0)
    assert time.monotonic() - hung_up < 1.5  # within a second, plus this poll's own step
    assert after["measured"]["generated_tokens"] < 8000  # it did not run to its limit
    started = time.monotonic()
    _, last, _ = generate(worker, status["id"], max_tokens=4, temperature=0)
    assert last["event"] == "finished"
    assert time.monotonic() - started < 2.0  # the next request is served at once
    assert "hung up; cancelling it" in worker.log()
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


def test_stopping_a_deployment_ends_its_engine_process_and_refuses_generations(worker):
    before = engine_pid(worker)
    status = deploy(worker)
    mine = engine_pid(worker) - before
    assert len(mine) == 1
    code, stopped = worker.call("DELETE", f"/v1/deployments/{status['id']}")
    assert code == 200 and stopped["state"] == "stopped", stopped
    (pid,) = mine
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    stream = Stream(worker, status["id"], {"kind": "completion", "prompt": "Hello"})
    body = json.loads(stream.response.read())
    stream.close()
    assert stream.status == 409 and body["error"]["code"] == "WORKER_DEPLOYMENT_NOT_READY", body


def test_a_model_that_cannot_load_fails_its_deployment_and_the_worker_serves_on(worker):
    failed = deploy(worker, "truncated.gguf")
    assert failed["state"] == "failed"
    assert failed["error"]["code"] == "MODEL_LOAD_FAILED", failed
    assert str(worker.artifact_dir) not in json.dumps(failed)
    code, refused = worker.call("PUT", "/v1/deployments/escape", {"model_path": "../outside.gguf"})
    assert code == 422 and refused["error"]["code"] == "MODEL_FILE_INVALID", refused
    good = deploy(worker)
    assert good["state"] == "ready"
    worker.call("DELETE", f"/v1/deployments/{good['id']}")


def test_an_engine_process_killed_mid_stream_fails_the_stream_and_the_deployment_not_the_worker(worker):
    before = engine_pid(worker)
    status = deploy(worker, context_length=8192)
    (pid,) = engine_pid(worker) - before
    stream = Stream(worker, status["id"], {"kind": "completion", "prompt": "Hello", "temperature": 0})
    events = stream.events()
    assert next(events)["event"] == "token"
    os.kill(pid, signal.SIGKILL)
    last = [event for event in events][-1]
    stream.close()
    assert last["event"] == "request_failed" and last["code"] == "RUNTIME_ENGINE_CRASHED", last
    code, after = worker.call("GET", f"/v1/deployments/{status['id']}")
    assert after["state"] == "failed" and "SIGKILL" in after["error"]["message"], after
    assert deploy(worker)["state"] == "ready"  # the worker serves on


def test_the_same_deployment_again_answers_its_status_and_other_settings_conflict(worker):
    status = deploy(worker)
    code, again = worker.call("PUT", f"/v1/deployments/{status['id']}", {"model_path": "tiny.gguf"})
    assert code == 202 and again["state"] == "ready"
    code, conflict = worker.call("PUT", f"/v1/deployments/{status['id']}", {"model_path": "templated.gguf"})
    assert code == 409 and conflict["error"]["code"] == "WORKER_DEPLOYMENT_CONFLICT"
    code, listed = worker.call("GET", "/v1/deployments")
    assert status["id"] in {each["id"] for each in listed["deployments"]}
    code, info = worker.call("GET", "/v1/info")
    assert info["serving"] == {"max_deployments": 4, "slots_per_deployment": 4, "queue_per_deployment": 8}
    worker.call("DELETE", f"/v1/deployments/{status['id']}")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "poem", "prompt": "x"}, "kind"),
        ({"kind": "completion"}, "prompt"),
        ({"kind": "chat", "messages": []}, "messages"),
        ({"kind": "chat", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"kind": "completion", "prompt": "x", "temperature": 3}, "temperature"),
        ({"kind": "completion", "prompt": "x", "top_p": 0}, "top_p"),
        ({"kind": "completion", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"kind": "completion", "prompt": "x", "stop": ["a"] * 5}, "stop"),
        ({"kind": "completion", "prompt": "x", "logit_bias": {"12": 500}}, "logit_bias"),
        ({"kind": "completion", "prompt": "x", "seed": -1}, "seed"),
    ],
)
def test_a_bad_generation_body_is_a_400_naming_the_field(worker, body, field):
    status = deploy(worker)
    try:
        stream = Stream(worker, status["id"], body)
        answer = json.loads(stream.response.read())
        stream.close()
        assert stream.status == 400, answer
        assert answer["error"]["code"] == "WORKER_REQUEST_INVALID"
        assert answer["error"]["message"].startswith(field), answer
    finally:
        worker.call("DELETE", f"/v1/deployments/{status['id']}")
