"""Per-node rates through the real gunicorn (A2, L2, P5; issue 15 item 3): a node publishing faster
than its interval allows gets 429 NODE_RATE_LIMITED with Retry-After, and nothing it sent is kept."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import requests
import sqlalchemy as sa

from app.models import AuditEvent, Job, TelemetrySample
from tests.support import ACQUIRE, ADMIN, factories
from tests.support.gunicorn import GunicornServer

BURST = 20


INTERVAL = 4  # seconds: a node's publications of one kind are accepted 2 s apart at most
SPACING = INTERVAL / 2


@pytest.fixture
def rated_server(database_url, tmp_path):
    """The real control plane with the rate limit on and a 4 s interval, so a burst fits well
    inside the 2 s spacing."""
    running = GunicornServer(
        database_url,
        tmp_path,
        workers=2,
        MODELFORGE_HEARTBEAT_INTERVAL_SECONDS=str(INTERVAL),
        # A 12 s lease: claims name a 4 s progress interval, so progress too is spaced 2 s.
        MODELFORGE_JOB_LEASE_SECONDS=str(3 * INTERVAL),
        MODELFORGE_NODE_RATE_LIMIT="on",
    )
    running.start()
    yield running
    running.stop()
    print(running.log()[-20000:])  # shown only when the test fails


def enrolled(server) -> dict[str, str]:
    """A freshly enrolled node's Authorization header."""
    minted = requests.post(
        server.url + "/api/v1/admin/node-enrollments", json=factories.enrollment_body(), headers=ADMIN, timeout=10
    ).json()
    body = factories.enroll_body(minted["token"], origin=server.url, node_id=str(uuid.uuid4()))
    enrolled = requests.post(server.url + "/api/v1/agent/enroll", json=body, timeout=10)
    assert enrolled.status_code == 201, enrolled.text
    return factories.bearer(enrolled.json()["credential"])


def post(server, path: str, body: dict[str, object], auth: dict[str, str]) -> requests.Response:
    return requests.post(f"{server.url}/api/v1/agent/{path}", json=body, headers=auth, timeout=10)


def beat(server, auth: dict[str, str], at: datetime) -> requests.Response:
    """A heartbeat with one sample taken at `at` (distinct per beat, so a stored one is countable)."""
    sample = factories.sample(sampled_at=at.isoformat().replace("+00:00", "Z"))
    return post(server, "heartbeat", factories.heartbeat_body(telemetry=[sample]), auth)


def count(database_url: str, query: sa.Select) -> int:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.execute(query).scalar()
    finally:
        engine.dispose()


def samples_stored(database_url: str) -> int:
    return count(database_url, sa.select(sa.func.count()).select_from(TelemetrySample.__table__))


def burst(send, accepted_sent_at: float) -> list[requests.Response]:
    """Publications sent back to back for the first second after an accepted one was sent (so
    accepted no earlier): with a 2 s spacing, each must be refused even if answered slowly."""
    replies = []
    while time.monotonic() < accepted_sent_at + SPACING - 1:
        replies.append(send(len(replies)))
    assert len(replies) >= 3, "the machine is too slow to send a burst"
    return replies


def assert_rate_limited(response: requests.Response) -> int:
    """The one error shape, status 429 and a Retry-After in whole seconds; returns the seconds."""
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "NODE_RATE_LIMITED" and error["message"] and error["next_step"]
    retry_after = int(response.headers["Retry-After"])
    assert 1 <= retry_after <= SPACING
    assert response.json()["retry_after_seconds"] == retry_after
    return retry_after


def test_a_burst_of_heartbeats_is_refused_after_the_first_and_stores_nothing(rated_server, database_url):
    node, other = enrolled(rated_server), enrolled(rated_server)
    for auth in (node, other):  # telemetry is kept for the GPUs an inventory listed
        assert post(rated_server, "inventory", factories.inventory_body(), auth).status_code == 200
    start = datetime.now(UTC) - timedelta(minutes=1)
    sent_at = time.monotonic()
    first = beat(rated_server, node, start)
    assert first.status_code == 200, first.text
    replies = burst(lambda i: beat(rated_server, node, start + timedelta(seconds=1 + i)), sent_at)
    retry_after = max(assert_rate_limited(reply) for reply in replies)
    assert samples_stored(database_url) == 1  # the refused beats' samples were never written

    # Another node is not affected by the first one's burst.
    assert beat(rated_server, other, start).status_code == 200
    assert samples_stored(database_url) == 2

    # After Retry-After, the node's next beat is accepted and stored; the node stayed online.
    time.sleep(retry_after)
    again = beat(rated_server, node, start + timedelta(seconds=100))
    assert again.status_code == 200, again.text
    assert samples_stored(database_url) == 3
    node_id = again.json()["node_id"]
    listed = requests.get(f"{rated_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10)
    assert listed.json()["status"] == "online"


def test_a_burst_of_inventories_is_refused_after_the_first_and_audits_nothing(rated_server, database_url):
    node, other = enrolled(rated_server), enrolled(rated_server)
    sent_at = time.monotonic()
    first = post(rated_server, "inventory", factories.inventory_body(hostname="first"), node)
    assert first.status_code == 200, first.text
    node_id = first.json()["node_id"]
    audits = sa.select(sa.func.count()).select_from(AuditEvent.__table__)
    audited = count(database_url, audits)

    # Alternating hostname and GPU set (issue 15): each would be an audited change.
    def alternate(i: int) -> requests.Response:
        gpus = [factories.gpu(f"GPU-00000000-0000-0000-0000-{i:012d}")]
        return post(rated_server, "inventory", factories.inventory_body(gpus=gpus, hostname=f"host-{i}"), node)

    retry_after = max(assert_rate_limited(reply) for reply in burst(alternate, sent_at))
    assert count(database_url, audits) == audited  # nothing was audited, nothing stored
    listed = requests.get(f"{rated_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10)
    assert listed.json()["hostname"] == "first"

    assert post(rated_server, "inventory", factories.inventory_body(), other).status_code == 200
    # Heartbeats are limited on their own: the inventory burst does not hold them back.
    assert beat(rated_server, node, datetime.now(UTC)).status_code == 200

    time.sleep(retry_after)
    again = post(rated_server, "inventory", factories.inventory_body(hostname="second"), node)
    assert again.status_code == 200, again.text
    listed = requests.get(f"{rated_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10)
    assert listed.json()["hostname"] == "second"


def test_an_accepted_inventory_lets_the_next_heartbeat_through_once(rated_server):
    """A restarting agent publishes inventory then heartbeat, maybe moments after its last beat:
    that first beat is accepted; the one after it is limited again."""
    node = enrolled(rated_server)
    now = datetime.now(UTC)
    assert beat(rated_server, node, now).status_code == 200
    assert_rate_limited(beat(rated_server, node, now + timedelta(seconds=1)))
    assert post(rated_server, "inventory", factories.inventory_body(), node).status_code == 200  # restart
    assert beat(rated_server, node, now + timedelta(seconds=2)).status_code == 200
    assert_rate_limited(beat(rated_server, node, now + timedelta(seconds=3)))


def running_job(server, auth: dict[str, str]) -> dict[str, object]:
    """A node that advertises acquire jobs, has one queued, and claims it: the claim reply's job."""
    assert post(server, "inventory", factories.inventory_body(), auth).status_code == 200
    beat_reply = beat(server, auth, datetime.now(UTC))
    assert beat_reply.status_code == 200, beat_reply.text
    node_id = beat_reply.json()["node_id"]
    root = {"name": "models", "host_path": "/mnt/m", "container_path": "/data/artifacts/m", "min_free_bytes": 0}
    made = requests.post(
        f"{server.url}/api/v1/admin/nodes/{node_id}/storage-roots", json=root, headers=ADMIN, timeout=10
    )
    assert made.status_code == 201, made.text
    job = {
        "type": ACQUIRE,
        "node_id": node_id,
        "params": {"repo_id": "owner/tiny", "storage_root_id": made.json()["id"]},
    }
    assert requests.post(f"{server.url}/api/v1/admin/jobs", json=job, headers=ADMIN, timeout=10).status_code == 201
    claimed = post(server, "jobs/claim", {**factories.versions(), "capabilities": [ACQUIRE]}, auth)
    assert claimed.status_code == 200, claimed.text
    return claimed.json()["job"]


def stored_progress(database_url: str, job_id: str) -> dict | None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.select(Job.progress).where(Job.id == job_id)).scalar()
    finally:
        engine.dispose()


def test_a_burst_of_progress_reports_is_refused_after_the_first_and_stores_nothing(rated_server, database_url):
    """Issue 22 item 6: 1,500 progress writes in 41 s were all 200. Spaced like heartbeats, by the
    progress interval the claim named (half of it), and the claim itself counts as a renewal."""
    node = enrolled(rated_server)
    job = running_job(rated_server, node)
    assert job["progress_interval_seconds"] == 2 * SPACING

    def report(files_done: int) -> requests.Response:
        body = {
            **factories.versions(),
            "attempt": job["attempt"],
            "progress": {"bytes_done": 0, "files_done": files_done},
        }
        return post(rated_server, f"jobs/{job['id']}/progress", body, node)

    assert_rate_limited(report(1))  # the claim renewed the lease a moment ago
    time.sleep(SPACING)
    sent_at = time.monotonic()
    first = report(2)
    assert first.status_code == 200, first.text
    retry_after = max(assert_rate_limited(reply) for reply in burst(lambda i: report(3 + i), sent_at))
    assert stored_progress(database_url, job["id"])["files_done"] == 2  # the refused reports wrote nothing

    time.sleep(retry_after)
    again = report(100)
    assert again.status_code == 200, again.text
    assert stored_progress(database_url, job["id"])["files_done"] == 100
    # A report the fence refuses is refused by the fence, not the rate: 409 as before.
    stale = {**factories.versions(), "attempt": job["attempt"] + 1, "progress": {"bytes_done": 0, "files_done": 0}}
    assert post(rated_server, f"jobs/{job['id']}/progress", stale, node).status_code == 409


def test_claims_come_once_per_heartbeat_or_half_an_interval_apart(rated_server):
    """A claim right after each accepted heartbeat (the agent's cadence) is accepted however soon;
    a burst of claims is refused after the first with Retry-After, and another node is unaffected."""
    node, other = enrolled(rated_server), enrolled(rated_server)
    for auth in (node, other):
        assert post(rated_server, "inventory", factories.inventory_body(), auth).status_code == 200
        assert beat(rated_server, auth, datetime.now(UTC)).status_code == 200
    body = {**factories.versions(), "capabilities": [ACQUIRE]}
    sent_at = time.monotonic()
    assert post(rated_server, "jobs/claim", body, node).status_code == 204  # first after the beat
    retry_after = max(
        assert_rate_limited(reply) for reply in burst(lambda i: post(rated_server, "jobs/claim", body, node), sent_at)
    )
    assert post(rated_server, "jobs/claim", body, other).status_code == 204

    time.sleep(retry_after)
    assert post(rated_server, "jobs/claim", body, node).status_code == 204
    time.sleep(SPACING)  # the heartbeat's own spacing, then a beat: the claim after it is free again
    assert beat(rated_server, node, datetime.now(UTC)).status_code == 200
    assert post(rated_server, "jobs/claim", body, node).status_code == 204
