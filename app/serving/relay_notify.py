"""S5 on PostgreSQL: a request meets its node's relay connection in another worker or replica,
over LISTEN/NOTIFY — what PostgreSQL already has, no broker of our own.

Every process LISTENs on one shared channel and on one of its own (`modelforge_relay_<hex>`):

- shared: `{"op": "generate", "id", "node_id", "deployment_id", "reply_to", "part", "parts", "data"}`
  — the request in pieces (a NOTIFY carries under 8,000 bytes); only the process that holds the
  node's connection takes it. `{"op": "attached", "node_id", "holder"}` when a process accepts a
  node's connection: any other process holding an older one of that node closes it.
- the holder's own channel: `{"op": "cancel", "id"}` when the client has left.
- the asking process's own channel: `{"op": "accepted" | "refused" | "events", "id", …}`.

The holder runs the request as a local stream (relay.HUB.open, so its bounds hold for every
process's clients) and forwards its events, several per NOTIFY when they queue up. A request
nobody accepts within ACCEPT_SECONDS is 503 NODE_UNAVAILABLE: no process holds the node.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid

from app.errors import DomainError
from app.serving import relay

log = logging.getLogger(__name__)

SHARED_CHANNEL = "modelforge_relay"
PART_CHARS = 6000  # of ASCII JSON: a NOTIFY payload must stay under 8,000 bytes with its envelope
ACCEPT_SECONDS = 3.0
EVENTS_PER_NOTIFY = 64
PARTS_KEPT_SECONDS = 30.0  # pieces of a request whose rest never came are dropped after this
LISTEN_POLL_SECONDS = 1.0  # how often the listener looks up from its wait (to stop)


class RemoteStream(relay.Stream):
    """A stream whose node's connection another process holds; cancelled over NOTIFY."""

    holder: str | None = None

    def close(self) -> None:
        super().close()
        self.remote.forget(self.id)

    def cancel(self) -> None:
        if self.holder is not None:
            self.remote.notify(self.holder, {"op": "cancel", "id": self.id})


class Remote:
    """This process's side of LISTEN/NOTIFY: its listener thread and a connection to send on."""

    def __init__(self, conninfo: str, hub: relay.Hub) -> None:
        self.conninfo = conninfo
        self.hub = hub
        self.channel = f"{SHARED_CHANNEL}_{uuid.uuid4().hex}"
        self.waiting: dict[str, RemoteStream] = {}  # streams asked of another process, by id
        self.accepted: dict[str, threading.Event] = {}
        self.forwarded: dict[str, relay.Stream] = {}  # streams this process relays for another
        self.parts: dict[str, tuple[float, dict[int, str]]] = {}
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.sender = None
        self.listening = threading.Event()
        self.stopping = threading.Event()
        threading.Thread(target=self.listen, name="relay-notify", daemon=True).start()

    def stop(self) -> None:
        """Stop listening (within LISTEN_POLL_SECONDS); what it carried is failed."""
        self.stopping.set()

    # ------------------------------------------------------------------ sending

    def notify(self, channel: str, message: dict) -> bool:
        """One NOTIFY; False when PostgreSQL could not take it (the caller gives up that stream)."""
        import psycopg

        payload = json.dumps(message, separators=(",", ":"))
        with self.send_lock:
            for _ in range(2):  # one reconnect: a connection PostgreSQL closed while idle
                try:
                    if self.sender is None or self.sender.closed:
                        self.sender = psycopg.connect(self.conninfo, autocommit=True)
                    self.sender.execute("SELECT pg_notify(%s, %s)", (channel, payload))
                    return True
                except psycopg.Error:
                    self.sender = None
        log.warning("relay: NOTIFY on %s failed", channel)
        return False

    def attached(self, node_id: str) -> None:
        self.notify(SHARED_CHANNEL, {"op": "attached", "node_id": node_id, "holder": self.channel})

    def open(self, node_id: str, deployment_id: str, request: dict) -> relay.Stream:
        """Ask whichever process holds the node's connection to relay this request."""
        if not self.listening.wait(ACCEPT_SECONDS):
            raise relay.node_unavailable("this control plane cannot reach its other processes now")
        stream = RemoteStream(id=str(uuid.uuid4()), deployment_id=deployment_id, connection=None)
        stream.remote = self
        accepted = threading.Event()
        with self.lock:
            self.waiting[stream.id] = stream
            self.accepted[stream.id] = accepted
        data = json.dumps(request, separators=(",", ":"))  # ASCII: json escapes the rest
        pieces = [data[start : start + PART_CHARS] for start in range(0, len(data), PART_CHARS)] or [""]
        envelope = {"op": "generate", "id": stream.id, "node_id": node_id, "deployment_id": deployment_id}
        try:
            for index, piece in enumerate(pieces):
                message = {**envelope, "reply_to": self.channel, "part": index, "parts": len(pieces), "data": piece}
                if not self.notify(SHARED_CHANNEL, message):
                    raise relay.node_unavailable("this control plane cannot reach its other processes now")
            if not accepted.wait(ACCEPT_SECONDS):
                raise relay.node_unavailable("its agent has no relay connection to the control plane")
            refusal = getattr(stream, "refusal", None)
            if refusal is not None:
                raise refusal
        except BaseException:
            stream.done = True
            self.forget(stream.id)
            raise
        return stream

    def forget(self, stream_id: str) -> None:
        with self.lock:
            self.waiting.pop(stream_id, None)
            self.accepted.pop(stream_id, None)

    # ------------------------------------------------------------------ listening

    def listen(self) -> None:
        """LISTEN forever; a lost connection fails the streams it carried and is opened again."""
        import psycopg

        while not self.stopping.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as connection:
                    connection.execute(f"LISTEN {SHARED_CHANNEL}")
                    connection.execute(f"LISTEN {self.channel}")
                    self.listening.set()
                    while not self.stopping.is_set():
                        for notice in connection.notifies(timeout=LISTEN_POLL_SECONDS):
                            try:
                                self.receive(json.loads(notice.payload))
                            except Exception:  # one bad message never stops the listener
                                log.exception("relay: a NOTIFY message could not be handled")
            except psycopg.Error as error:
                if not self.stopping.is_set():
                    log.warning("relay: LISTEN connection lost (%s); opening it again", type(error).__name__)
                    self.stopping.wait(1)
            finally:
                self.listening.clear()
                with self.lock:
                    lost = list(self.waiting.values())
                for stream in lost:
                    stream.events.put({"event": relay.RELAY_LOST, "message": "the control plane lost its database"})

    def receive(self, message: dict) -> None:
        op, key = message.get("op"), message.get("id")
        if op == "attached":
            if message.get("holder") != self.channel:
                self.hub.drop_node(str(message.get("node_id")), "the agent connected to another process")
        elif op == "generate":
            self.take_part(message)
        elif op == "cancel":
            with self.lock:
                stream = self.forwarded.get(key)
            if stream is not None:
                stream.close()
        elif op in ("accepted", "refused", "events"):
            with self.lock:
                stream, accepted = self.waiting.get(key), self.accepted.get(key)
            if stream is None:
                return
            if op == "accepted":
                stream.holder = message.get("holder")
            elif op == "refused":
                stream.refusal = DomainError(
                    str(message.get("code")), str(message.get("message")), str(message.get("next_step"))
                )
            else:
                for event in message.get("events") or []:
                    stream.events.put(event)
            if accepted is not None:
                accepted.set()

    def take_part(self, message: dict) -> None:
        """Keep a piece of a request for a node this process holds; run it once whole."""
        if not self.hub.connected(str(message.get("node_id"))):
            return  # another process holds it (or nobody: the asker hears nothing and says 503)
        key, parts = str(message.get("id")), int(message.get("parts") or 0)
        now = time.monotonic()
        with self.lock:
            self.parts = {k: v for k, v in self.parts.items() if now - v[0] < PARTS_KEPT_SECONDS}
            _, pieces = self.parts.setdefault(key, (now, {}))
            pieces[int(message.get("part") or 0)] = str(message.get("data") or "")
            if len(pieces) < parts:
                return
            del self.parts[key]
        reply_to = str(message.get("reply_to"))
        try:
            request = json.loads("".join(pieces[index] for index in range(parts)))
            stream = self.hub.open(str(message["node_id"]), str(message.get("deployment_id")), request)
        except DomainError as error:
            refusal = {"code": error.code, "message": error.message, "next_step": error.next_step}
            self.notify(reply_to, {"op": "refused", "id": key, **refusal})
            return
        except (ValueError, KeyError):
            return
        with self.lock:
            self.forwarded[key] = stream
        self.notify(reply_to, {"op": "accepted", "id": key, "holder": self.channel})
        threading.Thread(target=self.forward, args=(key, stream, reply_to), name="relay-forward", daemon=True).start()

    def forward(self, key: str, stream: relay.Stream, reply_to: str) -> None:
        """Send the local stream's events to the process whose client asked, batched. A node silent
        for relay.NODE_SILENCE_SECONDS ends it here too, so an asker that vanished leaks nothing."""
        try:
            for event in stream.iterate(relay.NODE_SILENCE_SECONDS):
                if event is None:
                    continue
                batch = [event]
                while not stream.done and len(batch) < EVENTS_PER_NOTIFY:
                    try:
                        more = stream.events.get_nowait()
                    except queue.Empty:
                        break
                    batch.append(more)
                    if more.get("event") in relay.FINAL_EVENTS or more.get("event") == relay.RELAY_LOST:
                        stream.done = True
                if not self.notify(reply_to, {"op": "events", "id": key, "events": batch}):
                    stream.close()  # nobody can hear it: stop the generation
                    return
        finally:
            with self.lock:
                self.forwarded.pop(key, None)
            self.hub.forget(stream)


def start(engine, hub: relay.Hub) -> None:
    """Start this process's side once, on PostgreSQL only (SQLite runs one process: relay.py). A
    process serves one database; should it be handed another (the tests' apps), it listens there."""
    if engine.dialect.name != "postgresql":
        return
    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    if hub.remote is not None and hub.remote.conninfo == conninfo:
        return
    with _starting:
        if hub.remote is None or hub.remote.conninfo != conninfo:
            if hub.remote is not None:
                hub.remote.stop()
            hub.remote = Remote(conninfo, hub)


_starting = threading.Lock()
