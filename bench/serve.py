"""Serving through the control plane against the worker's socket and llama-cpp-python in-process (S5).

One stack on this machine, as users run it: the stand-in Hub, gunicorn (the product's
app/gunicorn_conf.py on SQLite), the real agent and the real runtime worker (CPU), a random-weight
llama GGUF written here and acquired through the Hub, one ready deployment and a client key.
The bundled nginx (deploy/nginx/nginx.conf) sits in front of gunicorn for the `nginx` rows.

The same completion — one prompt, temperature 0, `--tokens` tokens — is asked, in rounds that
rotate which path goes first, of:

- **in-process**: llama-cpp-python loaded in this process (`create_completion(stream=True)`),
  the same file and context length, while the worker idles;
- **worker**: the worker's Unix socket, `POST /v1/deployments/{id}/generate`, as the agent calls it;
- **control plane**: `POST /v1/completions` with `stream: true` at gunicorn, relayed over the
  agent's WebSocket;
- **nginx**: the same through the bundled nginx.

Each stream's time to first token (request sent → first piece of text) and its tokens/s (pieces
after the first ÷ the time from the first to the last) are medians over rounds. Then eight
concurrent streams, through gunicorn and through nginx: errors, aggregate tokens/s against one
stream's, and `GET /healthz` and the signed-in nodes page timed every 100 ms meanwhile (p95).

    .venv/bin/python bench/serve.py [--tokens 128] [--rounds 5] [--layers 8] [--embd 768]
    .venv/bin/python bench/serve.py --tokens 32 --rounds 2 --layers 2 --embd 64   # quick
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import ssl
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

import requests  # noqa: E402

from tests.support import OPERATOR_KEY, migrate, serving, wait_until  # noqa: E402
from tests.support.acquire import stop_started_agents  # noqa: E402
from tests.support.gunicorn import GunicornServer  # noqa: E402
from tests.support.hub import StandinHub  # noqa: E402
from tests.support.nginx import NGINX, DeployNginx  # noqa: E402
from tests.support.tiny_gguf import write_tiny_llama  # noqa: E402
from tests.support.worker import UnixHTTPConnection, short_socket_dir  # noqa: E402

MODEL = serving.NAME
PROMPT = "Once upon a time, in a small lab behind a slow uplink,"
CONCURRENT = 8  # app/serving/relay.py STREAMS_PER_DEPLOYMENT: the most one deployment takes at once
POLL_EVERY_SECONDS = 0.1


@dataclass
class Stream:
    """One streamed answer as the client saw it."""

    started: float
    stamps: list[float] = field(default_factory=list)  # when each non-empty piece arrived
    text: str = ""
    error: str | None = None

    def piece(self, text: str) -> None:
        if text:
            self.stamps.append(time.perf_counter())
            self.text += text

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.started

    @property
    def tokens_per_second(self) -> float:
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0])


def in_process(llm, tokens: int) -> Stream:
    llm.reset()  # no prompt reuse from the last round: the worker evaluates every prompt afresh
    stream = Stream(time.perf_counter())
    for chunk in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0.0, stream=True):
        stream.piece(chunk["choices"][0]["text"])
    return stream


def via_worker(socket_path: Path, deployment_id: str, tokens: int) -> Stream:
    body = json.dumps({"kind": "completion", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0})
    connection = UnixHTTPConnection(str(socket_path), timeout=120)
    stream = Stream(time.perf_counter())
    try:
        connection.request("POST", f"/v1/deployments/{deployment_id}/generate", body=body)
        answer = connection.getresponse()
        for line in iter(answer.readline, b""):
            event = json.loads(line)
            if event["event"] == "token":
                stream.piece(event["text"])
            elif event["event"] == "request_failed":
                stream.error = event["code"]
    finally:
        connection.close()
    return stream


def via_http(base: str, key: str, tokens: int, context: ssl.SSLContext | None = None) -> Stream:
    """A streamed /v1/completions read line by line as the bytes arrive (no client-side buffering)."""
    scheme, _, address = base.partition("://")
    host, port = address.split(":")
    if scheme == "https":
        connection = http.client.HTTPSConnection(host, int(port), timeout=120, context=context)
    else:
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    stream = Stream(time.perf_counter())
    try:
        connection.request("POST", "/v1/completions", body=body, headers=headers)
        answer = connection.getresponse()
        if answer.status != 200:
            stream.error = f"{answer.status} {answer.read()[:200]!r}"
            return stream
        for line in iter(answer.readline, b""):
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                stream.error = event["error"].get("code")
            elif event.get("choices"):
                stream.piece(event["choices"][0]["text"])
    except (OSError, http.client.HTTPException) as error:
        stream.error = repr(error)
    finally:
        connection.close()
    return stream


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


class Poller(threading.Thread):
    """GET `url` every POLL_EVERY_SECONDS with `session` until stopped; each latency, in seconds."""

    def __init__(self, session: requests.Session, url: str) -> None:
        super().__init__(daemon=True)
        self.session, self.url = session, url
        self.latencies: list[float] = []
        self.failures = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.perf_counter()
            try:
                ok = self.session.get(self.url, timeout=10, allow_redirects=False).status_code == 200
            except requests.RequestException:
                ok = False
            self.latencies.append(time.perf_counter() - started)
            self.failures += not ok
            self.halt.wait(POLL_EVERY_SECONDS)


def concurrent(run_one, count: int, pollers: list[Poller]) -> tuple[list[Stream], float]:
    """`count` streams at once with the pollers running; the streams and the wall time."""
    results: list[Stream] = [None] * count  # type: ignore[list-item]

    def client(index: int) -> None:
        results[index] = run_one()

    for poller in pollers:
        poller.start()
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    for poller in pollers:
        poller.halt.set()
        poller.join()
    return results, wall


def signed_in_session(base: str, verify: bool | str = True) -> requests.Session:
    session = requests.Session()
    session.verify = verify
    login = session.get(base + "/login", timeout=10).text
    csrf = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', login).group(1)
    answer = session.post(
        base + "/login", data={"operator_key": OPERATOR_KEY, "csrf_token": csrf}, timeout=10, allow_redirects=False
    )
    assert answer.status_code == 302, answer.status_code
    return session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8, help="layers of the random llama written")
    parser.add_argument("--embd", type=int, default=768, help="its embedding width")
    args = parser.parse_args()
    if NGINX is None:
        raise SystemExit("nginx is not installed (apt-get install nginx)")

    import llama_cpp

    scratch = Path(tempfile.mkdtemp(prefix="mfserve-", dir="/tmp"))
    sockets = short_socket_dir()
    server = proxy = None
    try:
        made = scratch / "made"
        made.mkdir()
        model = write_tiny_llama(made / "tiny.gguf", n_layer=args.layers, n_embd=args.embd)
        with StandinHub() as hub:
            hub.add_repo("bench/serve", {"tiny.gguf": model})
            database_url = f"sqlite:///{scratch / 'serve.sqlite3'}"
            migrate(database_url, scratch)
            server = GunicornServer(database_url, scratch, workers=1, MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="5")
            server.start()
            agent, worker, node_id, artifact_id = serving.runtime_node(scratch, sockets, server, hub, "bench/serve")
            serving.wait_capabilities(server, node_id, {serving.SERVE})
            deployment = serving.deploy_ready(server, artifact_id)
            key = serving.mint_key(server)
            wait_until(lambda: "relay: connected" in agent.log(), "the agent's relay connection", 20)
            (scratch / "nginx").mkdir()
            proxy = DeployNginx(scratch / "nginx", server.port)
            context_length = deployment["context_length"] or 8192
            llm = llama_cpp.Llama(model_path=str(model), n_ctx=context_length, n_gpu_layers=0, verbose=False)

            paths = {
                "in-process": lambda: in_process(llm, args.tokens),
                "worker": lambda: via_worker(worker.socket_path, deployment["id"], args.tokens),
                "control plane": lambda: via_http(server.url, key, args.tokens),
                "nginx": lambda: via_http(proxy.url, key, args.tokens),
            }
            single: dict[str, list[Stream]] = {name: [] for name in paths}
            for run in paths.values():  # warm every path once: first loads, first connections
                run()
            names = list(paths)
            for round_number in range(args.rounds):
                for name in names[round_number % len(names) :] + names[: round_number % len(names)]:
                    single[name].append(paths[name]())
            llm.close()

            crowds = {}
            for name, base in (("control plane", server.url), ("nginx", proxy.url)):
                pollers = [
                    Poller(requests.Session(), base + "/healthz"),
                    Poller(signed_in_session(base), base + "/hardware/nodes"),
                ]
                streams, wall = concurrent(paths[name], CONCURRENT, pollers)
                crowds[name] = (streams, wall, pollers)

        report(args, model, single, crowds)
        return 0
    finally:
        if proxy is not None:
            proxy.stop()
        stop_started_agents()
        serving.stop_started_workers()
        if server is not None:
            server.stop()
        shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def report(args, model: Path, single: dict[str, list[Stream]], crowds: dict) -> None:
    texts = {stream.text for streams in single.values() for stream in streams}
    errors = [stream.error for streams in single.values() for stream in streams if stream.error]
    print(f"model {model.stat().st_size / 2**20:.0f} MiB ({args.layers} layers x {args.embd}), ", end="")
    print(f"{args.tokens} tokens, temperature 0, {args.rounds} rounds, {os.cpu_count()} CPUs")
    print(f"the same text on every path and round: {'yes' if len(texts) == 1 else f'NO ({len(texts)} texts)'}")
    print(f"errors: {len(errors)} {errors[:3]}")
    print(f"load average at the end {os.getloadavg()[0]:.2f} (figures are only comparable on a quiet machine)")
    print()
    ttft = {name: statistics.median(stream.ttft for stream in streams) for name, streams in single.items()}
    rate = {name: statistics.median(stream.tokens_per_second for stream in streams) for name, streams in single.items()}
    print(f"{'one stream':<16}{'TTFT ms':>10}{'- worker':>10}{'tokens/s':>10}{'/ in-process':>14}")
    for name in single:
        print(
            f"{name:<16}{ttft[name] * 1000:>10.1f}{(ttft[name] - ttft['worker']) * 1000:>+10.1f}"
            f"{rate[name]:>10.1f}{rate[name] / rate['in-process']:>14.3f}"
        )
    print()
    print(f"{CONCURRENT} streams at once  errors  tokens/s  / one stream  TTFT p50/max ms  /healthz p95  nodes p95")
    for name, (streams, wall, pollers) in crowds.items():
        done = [stream for stream in streams if not stream.error and stream.stamps]
        aggregate = sum(len(stream.stamps) for stream in done) / wall
        ttfts = [stream.ttft * 1000 for stream in done] or [float("nan")]
        health, nodes = (percentile(poller.latencies, 0.95) * 1000 for poller in pollers)
        failed = sum(poller.failures for poller in pollers)
        print(
            f"{name:<19}{len(streams) - len(done):>6}{aggregate:>10.1f}{aggregate / rate[name]:>14.2f}"
            f"{statistics.median(ttfts):>9.0f}/{max(ttfts):<7.0f}{health:>12.1f}{nodes:>11.1f}"
            + (f"  ({failed} polls failed)" if failed else "")
        )


if __name__ == "__main__":
    sys.exit(main())
