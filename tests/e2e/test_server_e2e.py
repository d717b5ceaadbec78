"""Through the real server: gunicorn with several sync workers on loopback (E2, P2, A2)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import sqlalchemy as sa

from tests.support import ADMIN, assert_no_secrets, factories

CLAIMERS = 60
ROUNDS = 20


def mint(server, **overrides):
    response = requests.post(
        server.url + "/api/v1/admin/node-enrollments",
        json=factories.enrollment_body(**overrides),
        headers=ADMIN,
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return response.json()


def test_enrol_publish_read_back_rotate_revoke_over_http(server):
    minted = mint(server, display_name="Tower", labels={"site": "garage"})
    assert minted["api_origin"] == server.url
    body = factories.enroll_body(minted["token"], origin=server.url + "/")
    enrolled = requests.post(server.url + "/api/v1/agent/enroll", json=body, timeout=10)
    assert enrolled.status_code == 201, enrolled.text
    credential = enrolled.json()["credential"]
    auth = factories.bearer(credential)
    inventory = requests.post(
        server.url + "/api/v1/agent/inventory", json=factories.inventory_body(), headers=auth, timeout=10
    )
    heartbeat = requests.post(
        server.url + "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=auth, timeout=10
    )
    assert (inventory.status_code, heartbeat.status_code) == (200, 200)
    assert heartbeat.json()["heartbeat_interval_seconds"] == 15

    node = requests.get(f"{server.url}/api/v1/hardware/nodes/{body['node_id']}", headers=ADMIN, timeout=10).json()
    assert (node["status"], node["display_name"], node["labels"]) == ("online", "Tower", {"site": "garage"})
    assert node["gpus"][0]["uuid"] == factories.gpu()["uuid"] and len(node["telemetry"]) == 1

    rotated = requests.post(
        f"{server.url}/api/v1/admin/nodes/{body['node_id']}/credential/rotate", headers=ADMIN, timeout=10
    ).json()["credential"]
    old = requests.post(
        server.url + "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=auth, timeout=10
    )
    assert old.status_code == 401 and old.json()["error"]["code"] == "CREDENTIAL_REVOKED"
    revoked = requests.post(
        f"{server.url}/api/v1/admin/nodes/{body['node_id']}/credential/revoke", headers=ADMIN, timeout=10
    )
    assert revoked.status_code == 200
    after = requests.post(
        server.url + "/api/v1/agent/heartbeat",
        json=factories.heartbeat_body(),
        headers=factories.bearer(rotated),
        timeout=10,
    )
    assert after.status_code == 401

    server.stop()
    log = server.log()
    assert "POST /api/v1/agent/heartbeat" in log  # the access log is on, and checked
    assert_no_secrets(log, minted["token"], credential, rotated)


def claim_all_at_once(server, token: str) -> list[requests.Response]:
    """Fire CLAIMERS claims of one token, released together by a barrier."""
    barrier = threading.Barrier(CLAIMERS)
    bodies = [factories.enroll_body(token, origin=server.url) for _ in range(CLAIMERS)]

    def claim(body):
        session = requests.Session()
        barrier.wait()
        return session.post(server.url + "/api/v1/agent/enroll", json=body, timeout=60)

    with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
        return list(pool.map(claim, bodies))


@pytest.mark.slow
def test_sixty_concurrent_claims_of_one_token_yield_exactly_one_node(server, database_url):
    tokens = []
    winners = []
    for _ in range(ROUNDS):
        minted = mint(server)
        tokens.append(minted["token"])
        responses = claim_all_at_once(server, minted["token"])
        statuses = Counter(response.status_code for response in responses)
        assert statuses[201] == 1, statuses
        assert set(statuses) <= {201, 409}, statuses  # losers: clear 409, never 5xx
        codes = {response.json()["error"]["code"] for response in responses if response.status_code == 409}
        assert codes == {"ENROLLMENT_TOKEN_CONSUMED"}
        (winner,) = [response.json() for response in responses if response.status_code == 201]
        winners.append(winner)
        enrolment = requests.get(
            f"{server.url}/api/v1/admin/node-enrollments/{minted['id']}", headers=ADMIN, timeout=10
        ).json()
        assert enrolment["state"] == "consumed" and enrolment["node_id"] == winner["node_id"]

    engine = sa.create_engine(database_url)
    with engine.connect() as connection:
        nodes = connection.execute(sa.text("SELECT id FROM nodes")).scalars().all()
        active = connection.execute(sa.text("SELECT node_id FROM credentials WHERE revoked_at IS NULL")).scalars().all()
        enrolled_events = connection.execute(
            sa.text("SELECT COUNT(*) FROM audit_events WHERE action = 'node.enrolled'")
        ).scalar_one()
    engine.dispose()
    assert sorted(nodes) == sorted(winner["node_id"] for winner in winners)
    assert sorted(active) == sorted(nodes)  # one active credential per node, no more
    assert enrolled_events == ROUNDS

    for winner in winners[:3]:
        ok = requests.post(
            server.url + "/api/v1/agent/heartbeat",
            json=factories.heartbeat_body(),
            headers=factories.bearer(winner["credential"]),
            timeout=10,
        )
        assert ok.status_code == 200

    server.stop()
    assert_no_secrets(server.log(), *tokens, *(winner["credential"] for winner in winners))


def test_one_node_id_racing_with_two_tokens_gets_one_credential(server):
    node_id = str(uuid.uuid4())
    tokens = [mint(server)["token"] for _ in range(8)]
    barrier = threading.Barrier(len(tokens))

    def claim(token):
        barrier.wait()
        body = factories.enroll_body(token, origin=server.url, node_id=node_id)
        return requests.post(server.url + "/api/v1/agent/enroll", json=body, timeout=60)

    with ThreadPoolExecutor(max_workers=len(tokens)) as pool:
        responses = list(pool.map(claim, tokens))
    statuses = Counter(response.status_code for response in responses)
    assert statuses == {201: 1, 409: len(tokens) - 1}, statuses
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 409} == {"NODE_ALREADY_ENROLLED"}
    node = requests.get(f"{server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()
    assert node["credential"]["active"] is True
    pending = requests.get(
        server.url + "/api/v1/admin/node-enrollments?state=pending", headers=ADMIN, timeout=10
    ).json()["enrollments"]
    assert len(pending) == len(tokens) - 1  # I4: the refused claims did not spend their tokens


def node_with_queued_jobs(server, jobs: int) -> tuple[str, dict[str, str]]:
    """An enrolled, online node that advertises artifact.acquire.v1, with `jobs` acquire jobs queued."""
    minted = mint(server)
    enrolled = requests.post(
        server.url + "/api/v1/agent/enroll", json=factories.enroll_body(minted["token"], origin=server.url), timeout=10
    ).json()
    auth = factories.bearer(enrolled["credential"])
    node_id = enrolled["node_id"]
    inventory = {**factories.inventory_body(), "capabilities": ["artifact.acquire.v1"]}
    assert requests.post(server.url + "/api/v1/agent/inventory", json=inventory, headers=auth, timeout=10).ok
    assert requests.post(server.url + "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=auth).ok
    root = requests.post(
        f"{server.url}/api/v1/admin/nodes/{node_id}/storage-roots",
        json={"name": "models", "host_path": "/mnt/m", "container_path": "/data/artifacts/m", "min_free_bytes": 0},
        headers=ADMIN,
        timeout=10,
    ).json()
    for index in range(jobs):
        params = {"repo_id": f"org/m{index}", "storage_root_id": root["id"]}
        body = {"type": "artifact.acquire.v1", "node_id": node_id, "params": params}
        assert requests.post(server.url + "/api/v1/admin/jobs", json=body, headers=ADMIN, timeout=10).status_code == 201
    return node_id, auth


@pytest.mark.slow
def test_concurrent_claims_by_one_node_yield_one_running_job_and_one_attempt(server, database_url):
    """J2: twenty claims at once through gunicorn's workers, round after round: one job runs, attempt 1."""
    nodes = []
    for _ in range(ROUNDS):
        node_id, auth = node_with_queued_jobs(server, jobs=3)
        nodes.append(node_id)
        barrier = threading.Barrier(CLAIMERS)

        def claim(_, barrier=barrier, auth=auth):
            session = requests.Session()
            barrier.wait()
            return session.post(
                server.url + "/api/v1/agent/jobs/claim",
                json={**factories.versions(), "capabilities": ["artifact.acquire.v1"]},
                headers=auth,
                timeout=60,
            )

        with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
            responses = list(pool.map(claim, range(CLAIMERS)))
        statuses = Counter(response.status_code for response in responses)
        assert set(statuses) <= {200, 204}, statuses  # never a 5xx or a constraint error
        handed = {(r.json()["job"]["id"], r.json()["job"]["attempt"]) for r in responses if r.status_code == 200}
        assert len(handed) == 1 and next(iter(handed))[1] == 1, handed
    engine = sa.create_engine(database_url)
    with engine.connect() as connection:
        states = Counter(connection.execute(sa.text("SELECT state FROM jobs")).scalars())
        attempts = Counter(connection.execute(sa.text("SELECT attempt FROM jobs")).scalars())
        started = connection.execute(sa.text("SELECT COUNT(*) FROM audit_events WHERE action = 'job.started'")).scalar()
    engine.dispose()
    assert states == {"running": ROUNDS, "queued": 2 * ROUNDS} and started == ROUNDS
    assert attempts == {1: ROUNDS, 0: 2 * ROUNDS}
