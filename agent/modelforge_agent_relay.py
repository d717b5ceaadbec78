"""The agent's end of the serving relay (S5): one outbound WebSocket to the control plane.

The agent dials `GET /api/v1/agent/relay` with its node credential and keeps the connection; the
control plane sends generations over it, the agent posts each to the runtime worker's Unix socket
(`POST /v1/deployments/{id}/generate`) and sends back the worker's events, one frame each, as
they come. Nothing here listens on any port (P1). Frames (app/serving/relay.py holds the other
end): in, `{"type": "generate", "id", "deployment_id", "request"}` and `{"type": "cancel", "id"}`;
out, `{"type": "event", "id", "event"}`.

A cancel, or the connection dropping, hangs up on the worker, which stops the generation within a
token. A dropped connection is dialled again after 1 s, then at most one heartbeat interval
apart; the heartbeats run on their own thread whatever happens here. The core starts this module
once its worker serves deployments.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from collections.abc import Callable
from urllib.parse import quote

from modelforge_node_agent import AGENT_VERSION, Config, UnixHTTPConnection, as_dict, log, short_text

RELAY_PATH = "/api/v1/agent/relay"
FRAME_MAX_BYTES = 1 << 20  # the control plane's bound too (app/serving/relay.py)
PING_SECONDS = 15.0
EVENT_LINE_MAX_BYTES = 64 * 1024  # one worker event (a token is a few bytes; `finished` well under 1 KiB)
WORKER_CONNECT_SECONDS = 5.0
WORKER_SILENCE_SECONDS = 600.0  # a generation the worker says nothing about for this long is given up
RETRY_FIRST_SECONDS = 1.0


def relay_url(control_plane_url: str) -> str:
    """The WebSocket URL of the relay on the control plane the agent enrolled with."""
    scheme, rest = control_plane_url.split("://", 1)
    return ("wss" if scheme == "https" else "ws") + "://" + rest.rstrip("/") + RELAY_PATH


def ssl_context(config: Config) -> ssl.SSLContext | None:
    """The same trust as the agent's HTTPS calls: its CA file, or requests' bundle."""
    if not config.control_plane_url.startswith("https://"):
        return None
    verify = config.verify
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class Generation:
    """One request relayed to the worker; `cancel()` hangs up on it."""

    def __init__(self, socket_path: str, frame: dict, send: Callable[[dict], bool]) -> None:
        self.id = str(frame["id"])
        self.deployment_id = str(frame.get("deployment_id") or "")
        self.request = as_dict(frame.get("request"))
        self.socket_path = socket_path
        self.send = send
        self.connection: UnixHTTPConnection | None = None
        self.cancelled = threading.Event()

    def event(self, event: dict) -> bool:
        return self.send({"type": "event", "id": self.id, "event": event})

    def failed(self, code: str, message: str, status: int | None = None) -> None:
        self.event({"event": "request_failed", "code": code, "message": message, "status": status})

    def cancel(self) -> None:
        self.cancelled.set()
        connection = self.connection
        if connection is not None and connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)  # the worker sees the hang-up at once
            except OSError:
                pass

    def run(self) -> None:
        """POST the generation and relay each JSON line; never raises."""
        path = f"/v1/deployments/{quote(self.deployment_id, safe='')}/generate"
        self.connection = UnixHTTPConnection(self.socket_path, WORKER_CONNECT_SECONDS, WORKER_SILENCE_SECONDS)
        try:
            if self.cancelled.is_set():
                return
            body = json.dumps(self.request).encode()
            self.connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = self.connection.getresponse()
            if response.status >= 400:
                error = as_dict(as_dict(_json(response.read(EVENT_LINE_MAX_BYTES))).get("error"))
                code = error.get("code") if isinstance(error.get("code"), str) else "WORKER_REQUEST_FAILED"
                self.failed(
                    code[:64], short_text(error.get("message"), 1000) or f"HTTP {response.status}", response.status
                )
                return
            while not self.cancelled.is_set():
                line = response.readline(EVENT_LINE_MAX_BYTES + 1)
                if not line:
                    if not self.cancelled.is_set():
                        self.failed("WORKER_STREAM_ENDED", "the runtime worker ended the stream without a final event")
                    return
                event = as_dict(_json(line))
                if not event or len(line) > EVENT_LINE_MAX_BYTES:
                    self.failed("WORKER_STREAM_INVALID", "the runtime worker sent a line that is not a JSON event")
                    return
                if not self.event(event):
                    return  # the relay connection is gone: hanging up (finally) cancels it on the worker
                if event.get("event") in ("finished", "request_failed"):
                    return
        except (OSError, http.client.HTTPException) as error:
            if not self.cancelled.is_set():
                self.failed("RUNTIME_WORKER_UNAVAILABLE", f"the runtime worker did not answer ({type(error).__name__})")
        finally:
            self.connection.close()


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


class Relay:
    """The connection and the generations in flight over it, on threads of their own."""

    def __init__(self, config: Config, credential: Callable[[], str | None], socket_path: str,
                 interval: Callable[[], float]) -> None:  # fmt: skip
        self.url = relay_url(config.control_plane_url)
        self.context = ssl_context(config)
        self.credential, self.socket_path, self.interval = credential, socket_path, interval
        self.stopping = threading.Event()
        self.socket = None
        self.send_lock = threading.Lock()
        self.generations: dict[str, Generation] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name="relay", daemon=True)

    def start(self) -> Relay:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        socket_ = self.socket
        if socket_ is not None:
            try:
                socket_.close()
            except Exception:  # already closed
                pass

    def run(self) -> None:
        delay = RETRY_FIRST_SECONDS
        said = False
        while not self.stopping.is_set():
            try:
                self.connect_and_serve()
                delay = RETRY_FIRST_SECONDS
                said = False
            except Exception as error:  # any failure: say it once per outage, dial again
                if not said:
                    log.warning("relay: the connection to the control plane failed (%s); dialling again", _why(error))
                    said = True
            self.cancel_all()
            self.stopping.wait(delay)
            delay = min(max(self.interval(), RETRY_FIRST_SECONDS), delay * 2)

    def connect_and_serve(self) -> None:
        from simple_websocket import Client, ConnectionClosed

        credential = self.credential()
        if not credential:
            raise RuntimeError("no node credential yet")
        headers = {"Authorization": f"Bearer {credential}", "User-Agent": f"modelforge-node-agent/{AGENT_VERSION}"}
        self.socket = Client.connect(
            self.url, headers=headers, ping_interval=PING_SECONDS, max_message_size=FRAME_MAX_BYTES,
            ssl_context=self.context,
        )  # fmt: skip
        log.info("relay: connected to the control plane")
        try:
            while not self.stopping.is_set():
                frame = as_dict(_json(self.socket.receive()))
                kind, key = frame.get("type"), frame.get("id")
                if not isinstance(key, str):
                    continue
                if kind == "generate":
                    self.start_generation(frame)
                elif kind == "cancel":
                    with self.lock:
                        generation = self.generations.get(key)
                    if generation is not None:
                        generation.cancel()
        except ConnectionClosed:
            log.warning("relay: the control plane closed the connection; dialling again")
        finally:
            try:
                self.socket.close()
            except Exception:  # already closed
                pass

    def start_generation(self, frame: dict) -> None:
        generation = Generation(self.socket_path, frame, self.send)
        with self.lock:
            self.generations[generation.id] = generation

        def run() -> None:
            try:
                generation.run()
            finally:
                with self.lock:
                    self.generations.pop(generation.id, None)

        threading.Thread(target=run, name=f"relay-{generation.id[:8]}", daemon=True).start()

    def send(self, frame: dict) -> bool:
        data = json.dumps(frame, separators=(",", ":"))
        with self.send_lock:
            try:
                self.socket.send(data)
            except Exception:  # the connection dropped: the generation hangs up on the worker
                return False
        return True

    def cancel_all(self) -> None:
        """The connection is gone: nobody hears these answers any more."""
        with self.lock:
            running = list(self.generations.values())
        for generation in running:
            generation.cancel()


def _why(error: Exception) -> str:
    """One line, never the credential (it travels in a header only)."""
    return short_text(f"{type(error).__name__}: {error}", 200) or type(error).__name__
