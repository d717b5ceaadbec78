"""The real agent loses its enrol reply on the wire, after the control plane committed the claim,
and enrols on its retry (E2, I2, A4, P2): a proxy between them swallows the first reply."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import threading
import time

import pytest
import requests
import sqlalchemy as sa

from tests.support import ADMIN, assert_no_secrets, factories
from tests.support.agent import AgentProcess
from tests.support.gunicorn import GunicornServer

ENROLL = "/api/v1/agent/enroll"


class ReplyLosingProxy:
    """A TCP proxy on loopback that forwards everything, except the reply to the first enrol
    request: once the control plane has sent that reply whole (so the claim is committed) the
    proxy either hangs up on the agent without a byte of it, or holds the connection silent until
    the agent's own read timeout gives up. gunicorn's sync workers close each connection after a
    reply, so the reply ends where the upstream connection does."""

    def __init__(self, upstream_port: int, hang_up: bool = True) -> None:
        self.upstream_port, self.hang_up = upstream_port, hang_up
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.request_lines: list[str] = []
        self.swallowed: bytes | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        first = client.recv(65536)
        line = first.split(b"\r\n", 1)[0].decode("latin-1")
        with self.lock:
            self.request_lines.append(line)
            lose = self.swallowed is None and line.startswith(f"POST {ENROLL} ")
            if lose:
                self.swallowed = b""
        upstream.sendall(first)
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        if not lose:
            self._pump(upstream, client)
            return
        reply = b""
        while chunk := upstream.recv(65536):
            reply += chunk
        self.swallowed = reply
        upstream.close()
        if self.hang_up:  # the agent sees the connection end with no reply at all
            client.shutdown(socket.SHUT_RDWR)
            client.close()
        # else: silence; the pump closes the connection once the agent's timeout does

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def swallowed_reply(self) -> tuple[int, dict]:
        """The status and JSON body of the reply the agent never got."""
        head, _, body = self.swallowed.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), json.loads(body)

    def close(self) -> None:
        self.listener.close()


def lossy_control_plane(database_url: str, tmp_path, hang_up: bool):
    """The control plane under gunicorn, reached by agents only through the reply-losing proxy,
    which is the origin its tokens record (as behind a reverse proxy)."""
    server = GunicornServer(database_url, tmp_path, workers=2, MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1")
    proxy = ReplyLosingProxy(server.port, hang_up=hang_up)
    server.env["MODELFORGE_PUBLIC_API_ORIGIN"] = proxy.url
    server.start()
    yield server, proxy
    server.stop()
    proxy.close()
    print(server.log()[-20000:])  # shown only when the test fails


@pytest.fixture
def hung_up(database_url, tmp_path):
    """SQLite and PostgreSQL: the first enrol reply's connection is closed on the agent."""
    yield from lossy_control_plane(database_url, tmp_path, hang_up=True)


@pytest.fixture
def silenced(sqlite_template, tmp_path):
    """SQLite only (it costs the agent's 15 s read timeout): the first enrol reply never comes."""
    path = tmp_path / "silenced.sqlite3"
    shutil.copyfile(sqlite_template, path)
    yield from lossy_control_plane(f"sqlite:///{path}", tmp_path, hang_up=False)


def node(server, node_id: str) -> dict:
    response = requests.get(f"{server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def wait_for_heartbeats(server, node_id: str, count: int, timeout: float = 30) -> None:
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beat = node(server, node_id)["last_heartbeat_at"]
        if beat:
            seen.add(beat)
        if len(seen) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{len(seen)} of {count} heartbeats within {timeout}s")


def test_agent_enrols_on_its_retry_when_the_connection_drops_before_the_reply(hung_up, tmp_path):
    server, proxy = hung_up
    enrols_on_its_retry(server, proxy, server.env["MODELFORGE_DATABASE_URL"], tmp_path, "ConnectError")


def test_agent_enrols_on_its_retry_when_the_reply_times_out(silenced, tmp_path):
    server, proxy = silenced
    enrols_on_its_retry(server, proxy, server.env["MODELFORGE_DATABASE_URL"], tmp_path, "Timeout", timeout=45)


def enrols_on_its_retry(server, proxy, database_url: str, tmp_path, failure: str, timeout: float = 30) -> None:
    """The agent loses the first reply, enrols on its retry with one active credential, the
    reissue audited, heartbeats flowing; what is refused stays refused; no secret in any log."""
    minted = requests.post(
        server.url + "/api/v1/admin/node-enrollments", json=factories.enrollment_body(), headers=ADMIN, timeout=10
    ).json()
    token = minted["token"]
    agent = AgentProcess(tmp_path, proxy.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=token).start()
    agent.wait_for(r"inventory published", timeout=timeout)
    node_id = agent.node_id()

    # The first reply was a committed 201 that never reached the agent; it retried the same claim.
    status, lost = proxy.swallowed_reply()
    assert status == 201 and lost["node_id"] == node_id
    assert f"{failure} on POST {ENROLL} (backoff 1s…16s); next try in 1s" in agent.log()
    assert [line for line in proxy.request_lines if line.startswith(f"POST {ENROLL} ")] == [
        f"POST {ENROLL} HTTP/1.1"
    ] * 2
    assert agent.log().count("enrolled as node") == 1
    credential = agent.credential()
    assert credential != lost["credential"]
    wait_for_heartbeats(server, node_id, count=3)
    assert node(server, node_id)["status"] == "online"

    engine = sa.create_engine(database_url)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT token_hash, revoked_at IS NULL AS active, revoked_reason, first_used_at IS NOT NULL AS used "
                "FROM credentials WHERE node_id = :node ORDER BY id"
            ),
            {"node": node_id},
        ).all()
        actions = connection.execute(
            sa.text("SELECT action FROM audit_events WHERE node_id = :node ORDER BY id"), {"node": node_id}
        ).scalars()
        actions = [action for action in actions if action.startswith(("node.enrolled", "credential."))]
    engine.dispose()
    assert [tuple(row) for row in rows] == [
        (digest(lost["credential"]), False, "reissued", False),
        (digest(credential), True, None, True),
    ]
    assert actions == ["node.enrolled", "credential.reissued"]

    # The lost credential is refused; the token, now its credential is used, is refused too.
    heartbeat = factories.heartbeat_body(telemetry=[])
    refused = requests.post(
        server.url + "/api/v1/agent/heartbeat", json=heartbeat, headers=factories.bearer(lost["credential"]), timeout=10
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "CREDENTIAL_REVOKED"
    retry = factories.enroll_body(token, origin=proxy.url, node_id=node_id)
    again = requests.post(server.url + ENROLL, json=retry, timeout=10)
    assert again.status_code == 409 and again.json()["error"]["code"] == "ENROLLMENT_TOKEN_CONSUMED"
    other = AgentProcess(tmp_path, proxy.url, "other", MODELFORGE_AGENT_ENROLLMENT_TOKEN=token)
    assert other.run("--once") == 4
    assert f"HTTP 409 ENROLLMENT_TOKEN_CONSUMED on POST {ENROLL}" in other.log()
    assert other.node_id() != node_id and not (other.state_dir / "node-credential").exists()
    wait_for_heartbeats(server, node_id, count=2)  # the enrolled agent carries on

    assert agent.stop() < 1.0 and agent.process.returncode == 0
    server.stop()
    assert "re-issued its never-used credential" in server.log()
    assert_no_secrets(agent.log() + other.log() + server.log(), token, lost["credential"], credential)
