"""The serving relay's transport and process model, measured before either is built (S5, issue 23).

Three candidate relays, each alone in its own server process, each between CLIENTS clients that
stream Server-Sent Events and one stand-in node that dialled out to the relay (P1) and answers
every request with TOKENS tokens:

  gthread  Flask under gunicorn's gthread worker (1 worker, THREADS threads, as the control
           plane would run its streaming routes): the node long-polls GET /relay/next for a
           request and streams that request's tokens back in one chunked POST.
  gthread-ws  the same Flask-on-gthread server, but the node holds one WebSocket (flask-sock,
           over simple-websocket): requests go down it and tokens come back up it as frames.
  aiohttp  an aiohttp application (asyncio, one thread), the same WebSocket frames.

The stand-in node stamps each token with its send time (time.time(); one box, one clock), so a
client's receive time minus the stamp is what the relay added. The node and the clients run in
other processes than the relay, so the relay's CPU time (/proc, the server's whole process tree)
is its own. While the streams run, a prober asks the same server for GET /ping every 50 ms: a
stream must never starve the other routes (S5).

Prints, per relay, median over ROUNDS alternating rounds: tokens/s through the relay, relay
latency p50/p99 per token, the relay's CPU µs per token, and GET /ping p50/p99 during the
streams; then each WebSocket candidate ÷ gthread.

    .venv/bin/python bench/relay.py [--clients 8] [--tokens 400] [--token-ms 0] [--rounds 3]
    .venv/bin/python bench/relay.py --token-ms 20     # a 50 tokens/s model: latency, not throughput

Needs the test extra plus the candidates' libraries: `.venv/bin/pip install aiohttp flask-sock`.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREADS = 64  # gthread: threads for streams, the node's polls and the prober together
POLL_SECONDS = 20  # a long-poll's hold before it answers 204 and the node asks again

# ------------------------------------------------------------------ relay A: Flask on gthread


def flask_relay():
    """gunicorn's app factory (bench.relay:flask_relay()) for the gthread candidate."""
    from flask import Flask, Response, request

    app = Flask("relay-gthread")
    waiting: queue.Queue = queue.Queue()  # requests no node has taken yet
    streams: dict[str, queue.Queue] = {}  # request id -> its tokens, for the client's thread
    polled = threading.Event()  # a node has asked for work

    @app.get("/ping")
    def ping():
        return "node" if polled.is_set() else "no node"

    @app.get("/relay/next")
    def next_request():
        polled.set()
        try:
            request_id, tokens = waiting.get(timeout=POLL_SECONDS)
        except queue.Empty:
            return "", 204
        return {"id": request_id, "tokens": tokens}

    @app.post("/relay/reply/<request_id>")
    def reply(request_id: str):
        tokens = streams[request_id]
        # readline, not read(n): gunicorn's read(n) waits for n bytes, which holds a slow model's
        # tokens back until 64 KiB of them have come (measured: p50 1 s at 50 tokens/s).
        while line := request.stream.readline(65536):
            tokens.put(line.rstrip(b"\n"))
        tokens.put(None)
        return "", 204

    @app.get("/v1/stream")
    def stream():
        request_id = uuid.uuid4().hex
        tokens = streams[request_id] = queue.Queue()
        waiting.put((request_id, int(request.args["tokens"])))

        def events():
            try:
                while (line := tokens.get(timeout=60)) is not None:
                    yield b"data: " + line + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                streams.pop(request_id, None)

        return Response(events(), mimetype="text/event-stream", headers={"X-Accel-Buffering": "no"})

    return app


def flask_ws_relay():
    """gunicorn's app factory (bench.relay:flask_ws_relay()) for gthread with a WebSocket (flask-sock)."""
    from flask import Flask, Response, request
    from flask_sock import Sock

    app = Flask("relay-gthread-ws")
    sock = Sock(app)
    nodes: list = []  # (websocket, send lock): one node here
    streams: dict[str, queue.Queue] = {}

    @app.get("/ping")
    def ping():
        return "node" if nodes else "no node"

    @sock.route("/relay/ws")
    def node_socket(ws):
        entry = (ws, threading.Lock())
        nodes.append(entry)
        try:
            while True:
                frame = json.loads(ws.receive())
                tokens = streams.get(frame["id"])
                if tokens is not None:
                    tokens.put(None if frame.get("done") else frame["token"].encode())
        finally:
            nodes.remove(entry)

    @app.get("/v1/stream")
    def stream():
        request_id = uuid.uuid4().hex
        tokens = streams[request_id] = queue.Queue()
        ws, lock = nodes[0]
        with lock:  # one writer at a time on the node's socket
            ws.send(json.dumps({"id": request_id, "tokens": int(request.args["tokens"])}))

        def events():
            try:
                while (line := tokens.get(timeout=60)) is not None:
                    yield b"data: " + line + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                streams.pop(request_id, None)

        return Response(events(), mimetype="text/event-stream", headers={"X-Accel-Buffering": "no"})

    return app


def gthread_node(url: str, slots: int, token_ms: float, stop: threading.Event) -> None:
    """The node's side for gthread: `slots` threads, each long-polling and streaming a reply."""
    import requests

    def slot() -> None:
        session = requests.Session()
        while not stop.is_set():
            try:
                answer = session.get(f"{url}/relay/next", timeout=POLL_SECONDS + 10)
            except requests.RequestException:
                time.sleep(0.1)
                continue
            if answer.status_code != 200:
                continue
            job = answer.json()

            def body(count=job["tokens"]):
                for index in range(count):
                    if token_ms:
                        time.sleep(token_ms / 1000)
                    yield json.dumps({"i": index, "t": time.time(), "text": " tok"}).encode() + b"\n"

            session.post(f"{url}/relay/reply/{job['id']}", data=body(), timeout=120)

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(slots)]
    for thread in threads:
        thread.start()
    stop.wait()


# ------------------------------------------------------------------ relay B: aiohttp, WebSocket


def aiohttp_relay(port: int) -> None:
    """The aiohttp candidate, serving on 127.0.0.1:`port` until killed."""
    import asyncio

    from aiohttp import WSMsgType, web

    nodes: list[web.WebSocketResponse] = []
    streams: dict[str, asyncio.Queue] = {}

    async def ping(_request):
        return web.Response(text="node" if nodes else "no node")

    async def node_socket(request):
        ws = web.WebSocketResponse(heartbeat=15)
        await ws.prepare(request)
        nodes.append(ws)
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    continue
                frame = json.loads(message.data)
                tokens = streams.get(frame["id"])
                if tokens is not None:
                    tokens.put_nowait(None if frame.get("done") else frame["token"].encode())
        finally:
            nodes.remove(ws)
        return ws

    async def stream(request):
        request_id = uuid.uuid4().hex
        tokens = streams[request_id] = asyncio.Queue()
        await nodes[0].send_str(json.dumps({"id": request_id, "tokens": int(request.query["tokens"])}))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"})
        await response.prepare(request)
        try:
            while (line := await asyncio.wait_for(tokens.get(), 60)) is not None:
                await response.write(b"data: " + line + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
        finally:
            streams.pop(request_id, None)
        return response

    app = web.Application()
    app.add_routes([web.get("/ping", ping), web.get("/relay/ws", node_socket), web.get("/v1/stream", stream)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def aiohttp_node(url: str, token_ms: float, stop: threading.Event) -> None:
    """The node's side for aiohttp: one WebSocket, a task per request."""
    import asyncio

    import aiohttp

    async def run() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{url}/relay/ws") as ws:

            async def answer(job: dict) -> None:
                for index in range(job["tokens"]):
                    if token_ms:
                        await asyncio.sleep(token_ms / 1000)
                    token = json.dumps({"i": index, "t": time.time(), "text": " tok"})
                    await ws.send_str(json.dumps({"id": job["id"], "token": token}))
                await ws.send_str(json.dumps({"id": job["id"], "done": True}))

            tasks = set()
            async for message in ws:
                task = asyncio.create_task(answer(json.loads(message.data)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    threading.Thread(target=lambda: asyncio.run(run()), daemon=True).start()
    stop.wait()


# ------------------------------------------------------------------ the measurement


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its children (gunicorn's master and worker)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid] + [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for each in pids:
        fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


FACTORIES = {"gthread": "flask_relay", "gthread-ws": "flask_ws_relay"}  # gunicorn-served candidates


def start_relay(kind: str, port: int) -> subprocess.Popen:
    if kind in FACTORIES:
        command = [
            sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread",
            "--workers", "1", "--threads", str(THREADS), "--chdir", str(ROOT), "--log-level", "warning",
            f"bench.relay:{FACTORIES[kind]}()",
        ]  # fmt: skip
    else:
        command = [sys.executable, str(Path(__file__)), "--serve-aiohttp", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    import requests

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/ping", timeout=1).ok:
                return process
        except requests.RequestException:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the {kind} relay did not answer on {url} within 30 s")


def one_round(kind: str, args: argparse.Namespace) -> dict[str, float]:
    import requests

    port = free_port()
    relay = start_relay(kind, port)
    url = f"http://127.0.0.1:{port}"
    node = subprocess.Popen(
        [sys.executable, str(Path(__file__)), "--node", kind, url, str(args.clients), str(args.token_ms)], cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 30
        while requests.get(f"{url}/ping", timeout=5).text != "node":  # the node has dialled in
            if time.monotonic() > deadline:
                raise SystemExit(f"the stand-in node never reached the {kind} relay")
            time.sleep(0.1)
        latencies: list[float] = []
        pings: list[float] = []
        lock = threading.Lock()
        failures: list[str] = []
        done = threading.Event()

        def client() -> None:
            mine = []
            with requests.get(f"{url}/v1/stream", params={"tokens": args.tokens}, stream=True, timeout=120) as answer:
                for line in answer.iter_lines():
                    if line.startswith(b"data: {"):
                        mine.append(time.time() - json.loads(line[6:])["t"])
            with lock:
                latencies.extend(mine)
                if len(mine) != args.tokens:
                    failures.append(f"{kind}: a stream got {len(mine)} of {args.tokens} tokens")

        def prober() -> None:
            session = requests.Session()
            while not done.is_set():
                started = time.perf_counter()
                session.get(f"{url}/ping", timeout=30).raise_for_status()
                pings.append(time.perf_counter() - started)
                done.wait(0.05)

        probe = threading.Thread(target=prober)
        probe.start()
        cpu, wall = cpu_seconds(relay.pid), time.perf_counter()
        clients = [threading.Thread(target=client) for _ in range(args.clients)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        wall, cpu = time.perf_counter() - wall, cpu_seconds(relay.pid) - cpu
        done.set()
        probe.join()
        if failures:
            raise SystemExit("; ".join(failures))
        tokens = args.tokens * args.clients
        latencies.sort()
        pings.sort()
        return {
            "tokens_per_s": tokens / wall,
            "latency_p50_ms": 1000 * latencies[len(latencies) // 2],
            "latency_p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
            "cpu_us_per_token": 1e6 * cpu / tokens,
            "ping_p50_ms": 1000 * pings[len(pings) // 2],
            "ping_p99_ms": 1000 * pings[min(len(pings) - 1, int(len(pings) * 0.99))],
        }
    finally:
        for process in (node, relay):
            process.send_signal(signal.SIGTERM)
        for process in (node, relay):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent streams (default 8)")
    parser.add_argument("--tokens", type=int, default=400, help="tokens per stream (default 400)")
    parser.add_argument("--token-ms", type=float, default=0, help="the node's time per token (default 0: flat out)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinds = ("gthread", "gthread-ws", "aiohttp")
    figures: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for round_number in range(args.rounds):
        for kind in kinds if round_number % 2 == 0 else tuple(reversed(kinds)):
            figures[kind].append(one_round(kind, args))
    print(
        f"relay, {args.clients} streams x {args.tokens} tokens, node {args.token_ms or 'flat out'} ms/token, "
        f"median of {args.rounds} rounds"
    )
    keys = list(figures["gthread"][0])
    medians = {kind: {key: statistics.median(r[key] for r in rows) for key in keys} for kind, rows in figures.items()}
    print(f"  {'':12}" + "".join(f"{key:>18}" for key in keys))
    for kind in kinds:
        print(f"  {kind:20}" + "".join(f"{medians[kind][key]:18.2f}" for key in keys))
    for kind in kinds[1:]:
        ratios = {key: medians[kind][key] / medians["gthread"][key] for key in keys}
        print(f"  {kind + ' ÷ gthread':20}" + "".join(f"{ratios[key]:18.2f}" for key in keys))
    return 0


if __name__ == "__main__":
    if "--serve-aiohttp" in sys.argv:
        aiohttp_relay(int(sys.argv[sys.argv.index("--serve-aiohttp") + 1]))
    elif "--node" in sys.argv:
        at = sys.argv.index("--node")
        kind, url, slots, token_ms = sys.argv[at + 1 : at + 5]
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        if kind == "gthread":
            gthread_node(url, int(slots), float(token_ms), stop)
        else:  # both WebSocket relays speak the same frames
            aiohttp_node(url, float(token_ms), stop)
    else:
        sys.exit(main())
