"""S5: the relay. A request reaches its node over the WebSocket the node's agent opened.

The agent dials `GET /api/v1/agent/relay` (its node credential, P1) and keeps that connection;
nothing ever dials the node. Over it travel JSON text frames:

- control plane → agent: `{"type": "generate", "id", "deployment_id", "request"}` (the worker's
  generation body) and `{"type": "cancel", "id"}` when the client hangs up;
- agent → control plane: `{"type": "event", "id", "event"}`, one per worker event (`token`, then
  `finished` or `request_failed`), in order.

This process holds the connections it accepted (`HUB`). On SQLite there is one such process
(app/gunicorn_conf.py), so a client's request always meets its node's connection here.

Every bound is here, once: frame size, streams per deployment and per process, the keep-alive
period, the wait for a first event.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from app.errors import DomainError

log = logging.getLogger(__name__)

FRAME_MAX_BYTES = 1 << 20  # one frame, either way: a request body or one event
PING_SECONDS = 15.0  # each end pings an idle connection; a silent peer is dropped after two
KEEPALIVE_SECONDS = 15.0  # S5: a client hears at least a comment this often while nothing flows
# How long a stream may hear nothing at all from its node (queued behind others, a long prompt)
# before it is given up as lost; keep-alive comments flow meanwhile.
NODE_SILENCE_SECONDS = 300.0
STREAMS_PER_DEPLOYMENT = 8  # below the worker's queue (1 generating + 8 waiting): 429 here first
STREAMS_PER_PROCESS = 16  # each holds one of the process's 64 threads (app/gunicorn_conf.py)
FINAL_EVENTS = frozenset({"finished", "request_failed"})
RELAY_LOST = "relay_lost"  # the event a stream gets when its node's connection drops


def node_unavailable(why: str) -> DomainError:
    """503: the node that serves this deployment cannot be reached now — never the client's fault."""
    return DomainError(
        "NODE_UNAVAILABLE",
        f"The node serving this model is not connected: {why}.",
        "Retry shortly: the agent reconnects within one heartbeat interval. If it persists, check the node "
        "on the console's Nodes page.",
    )


def too_many_streams(what: str, limit: int) -> DomainError:
    return DomainError(
        "TOO_MANY_STREAMS",
        f"{what} already serves {limit} requests at once, its limit.",
        "Retry when a request has finished; send fewer requests in parallel.",
    )


@dataclass
class Stream:
    """One request in flight: its events arrive on `events`, in order. `connection` is the node's
    relay connection in this process, or None for a stream another process relays (relay_notify)."""

    id: str
    deployment_id: str
    connection: Connection | None
    events: queue.Queue = field(default_factory=queue.Queue)
    done: bool = False
    tracked: object | None = None  # app.metrics.inference.Tracked, where a client's request is answered

    def next_event(self, timeout: float) -> dict | None:
        """The next event, or None when `timeout` passed without one (time for a keep-alive)."""
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        if event.get("event") in FINAL_EVENTS or event.get("event") == RELAY_LOST:
            self.done = True
        if self.tracked is not None:
            self.tracked.see(event)
        return event

    def iterate(self, deadline_seconds: float) -> Iterator[dict | None]:
        """Events until the final one; None for each KEEPALIVE_SECONDS without one. A stream whose
        node says nothing at all for `deadline_seconds` ends with a relay_lost event."""
        quiet_since = time.monotonic()
        while not self.done:
            event = self.next_event(min(KEEPALIVE_SECONDS, deadline_seconds))
            if event is None:
                if time.monotonic() - quiet_since >= deadline_seconds:
                    self.done = True
                    yield {"event": RELAY_LOST, "message": f"the node sent nothing for {deadline_seconds:g} s"}
                    return
                yield None
                continue
            quiet_since = time.monotonic()
            yield event

    def close(self) -> None:
        """The client is done with it: a stream still running is cancelled on the node."""
        HUB.forget(self)
        if self.tracked is not None:
            self.tracked.end("cancelled")  # counted already if it ended otherwise
        if not self.done:
            self.done = True
            log.info("relay: the client left request %s before its end; cancelling it on the node", self.id)
            self.cancel()

    def cancel(self) -> None:
        self.connection.send({"type": "cancel", "id": self.id})


class Connection:
    """One agent's WebSocket: sends are serialised, received events go to their stream."""

    def __init__(self, node_id: str, socket) -> None:
        self.node_id = node_id
        self.socket = socket
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, frame: dict) -> bool:
        """Send one frame; False when the connection is gone (its streams are failed by detach)."""
        data = json.dumps(frame, separators=(",", ":"))
        with self._send_lock:
            if self.closed:
                return False
            try:
                self.socket.send(data)
            except Exception:  # simple_websocket's ConnectionClosed, or the socket's OSError
                self.closed = True
                return False
        return True


class Hub:
    """This process's relay connections, by node, and the streams in flight over them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[str, Connection] = {}
        self._streams: dict[str, Stream] = {}
        self.remote = None  # relay_notify.Remote on PostgreSQL: the other processes and replicas

    def attach(self, node_id: str, socket) -> Connection:
        """The node's new connection; an older one of the same node is dropped (its streams fail),
        here and, on PostgreSQL, in every other process (relay_notify)."""
        connection = Connection(node_id, socket)
        with self._lock:
            older = self._connections.get(node_id)
            self._connections[node_id] = connection
        if older is not None:
            self._close(older, "the agent opened a newer connection")
        if self.remote is not None:
            self.remote.attached(node_id)
        return connection

    def drop_node(self, node_id: str, why: str) -> None:
        """Close this process's connection of the node, if it has one (another process took it)."""
        with self._lock:
            older = self._connections.pop(node_id, None)
        if older is not None:
            self._close(older, why)

    def _close(self, connection: Connection, why: str) -> None:
        self._drop(connection, why)
        try:
            connection.socket.close()
        except Exception:  # already gone
            pass

    def detach(self, connection: Connection, why: str) -> None:
        """The connection ended: forget it and fail whatever was still in flight over it."""
        with self._lock:
            if self._connections.get(connection.node_id) is connection:
                del self._connections[connection.node_id]
        self._drop(connection, why)

    def _drop(self, connection: Connection, why: str) -> None:
        connection.closed = True
        with self._lock:
            lost = [stream for stream in self._streams.values() if stream.connection is connection]
        for stream in lost:
            stream.events.put({"event": RELAY_LOST, "message": why})

    def connected(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._connections

    def open(self, node_id: str, deployment_id: str, request: dict) -> Stream:
        """Send a generation to the node; its events arrive on the returned stream.

        Refused with 503 NODE_UNAVAILABLE when the node has no connection here, 429
        TOO_MANY_STREAMS past a bound (nothing is sent then)."""
        with self._lock:
            connection = self._connections.get(node_id)
        if connection is None and self.remote is not None:
            return self.remote.open(node_id, deployment_id, request)  # held by another process, if any
        with self._lock:
            connection = self._connections.get(node_id)
            if connection is None:
                raise node_unavailable("its agent has no relay connection to the control plane")
            if len(self._streams) >= STREAMS_PER_PROCESS:
                raise too_many_streams("The control plane", STREAMS_PER_PROCESS)
            if sum(each.deployment_id == deployment_id for each in self._streams.values()) >= STREAMS_PER_DEPLOYMENT:
                raise too_many_streams("This model", STREAMS_PER_DEPLOYMENT)
            stream = Stream(id=str(uuid.uuid4()), deployment_id=deployment_id, connection=connection)
            self._streams[stream.id] = stream
        frame = {"type": "generate", "id": stream.id, "deployment_id": deployment_id, "request": request}
        if not connection.send(frame):
            self.forget(stream)
            raise node_unavailable("its relay connection closed as the request was sent")
        return stream

    def forget(self, stream: Stream) -> None:
        with self._lock:
            self._streams.pop(stream.id, None)

    def deliver(self, connection: Connection, raw: str | bytes) -> None:
        """One frame from the agent. A malformed frame, or one for a stream that is not this
        connection's, is dropped and logged by kind only (never its content)."""
        try:
            frame = json.loads(raw)
        except ValueError:
            log.warning("relay: node %s sent a frame that is not JSON; dropped", connection.node_id)
            return
        if not isinstance(frame, dict) or frame.get("type") != "event" or not isinstance(frame.get("event"), dict):
            log.warning("relay: node %s sent a frame of an unknown kind; dropped", connection.node_id)
            return
        with self._lock:
            stream = self._streams.get(frame.get("id")) if isinstance(frame.get("id"), str) else None
        if stream is None or stream.connection is not connection:
            return  # a stream the client already left, or not this node's: nothing to deliver to
        stream.events.put(frame["event"])


HUB = Hub()
