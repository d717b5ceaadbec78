"""A lost enrol reply (E2, I4, P2): the same node retrying the same token gets a fresh credential
while the first was never used; anything else is refused as before."""

from __future__ import annotations

import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent, Credential, Node
from tests.support import ADMIN, SECRET_PATTERN, factories

HEARTBEAT = "/api/v1/agent/heartbeat"
ENROLL = "/api/v1/agent/enroll"


def credentials(app) -> list[Credential]:
    with app.app_context():
        rows = list(db.session.scalars(sa.select(Credential).order_by(Credential.id)))
        db.session.expunge_all()
        return rows


def audit_events(app, action: str) -> list[AuditEvent]:
    with app.app_context():
        rows = list(db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == action)))
        db.session.expunge_all()
        return rows


def beat(client, credential: str):
    return client.post(HEARTBEAT, json=factories.heartbeat_body(telemetry=[]), headers=factories.bearer(credential))


def claimed(client) -> tuple[dict, dict]:
    """A claim whose reply the agent is taken never to have read: its body and the 201 reply."""
    minted = factories.mint(client)
    body = factories.enroll_body(minted["token"])
    first = client.post(ENROLL, json=body)
    assert first.status_code == 201
    return body, first.get_json()


def assert_refused_as_today(response) -> None:
    assert response.status_code == 409
    assert response.get_json()["error"]["code"] == "ENROLLMENT_TOKEN_CONSUMED"


def test_a_retried_claim_gets_a_fresh_credential_once_per_unused_one(app, client):
    body, lost = claimed(client)
    retry = client.post(ENROLL, json=body)
    assert retry.status_code == 201
    reissued = retry.get_json()
    assert reissued["node_id"] == body["node_id"] and reissued["credential"].startswith("mfn_")
    assert reissued["credential"] != lost["credential"]

    # The lost credential is revoked as "reissued"; the fresh one is the node's only active one.
    first, second = credentials(app)
    assert (first.revoked_reason, first.revoked_at is not None) == ("reissued", True)
    assert (second.active, second.first_used_at, second.enrollment_id) == (True, None, first.enrollment_id)
    refused = beat(client, lost["credential"])
    assert refused.status_code == 401 and refused.get_json()["error"]["code"] == "CREDENTIAL_REVOKED"

    # Lost again: the still-unused second credential is replaced the same way.
    third = client.post(ENROLL, json=body).get_json()["credential"]
    assert beat(client, reissued["credential"]).status_code == 401
    assert beat(client, third).status_code == 200

    # Used once, never reissued again: the retry is refused as any second claim is.
    assert_refused_as_today(client.post(ENROLL, json=body))
    rows = credentials(app)
    assert [row.active for row in rows] == [False, False, True]
    assert [row.revoked_reason for row in rows] == ["reissued", "reissued", None]
    assert rows[2].first_used_at is not None
    with app.app_context():
        assert db.session.scalar(sa.select(sa.func.count(Node.id))) == 1

    events = audit_events(app, "credential.reissued")
    assert [event.node_id for event in events] == [body["node_id"]] * 2
    assert [(e.details["revoked_credential_id"], e.details["credential_id"]) for e in events] == [
        (rows[0].id, rows[1].id),
        (rows[1].id, rows[2].id),
    ]
    assert events[0].details["credential_prefix"] == reissued["credential"][:10]
    assert len(audit_events(app, "node.enrolled")) == 1
    # P2: no secret in any audit detail.
    details = json.dumps([event.details for event in events])
    for secret in (body["enrollment_token"], lost["credential"], reissued["credential"], third):
        assert secret not in details
    assert not SECRET_PATTERN.findall(details)


@pytest.mark.parametrize(
    "use",
    [
        pytest.param(lambda client, credential: beat(client, credential), id="heartbeat"),
        pytest.param(
            lambda client, credential: client.post(
                "/api/v1/agent/inventory", json=factories.inventory_body(), headers=factories.bearer(credential)
            ),
            id="inventory",
        ),
        # A refused call still proves the agent holds the credential: its use is kept.
        pytest.param(
            lambda client, credential: client.post(
                HEARTBEAT, json=factories.heartbeat_body(protocol_version=99), headers=factories.bearer(credential)
            ),
            id="incompatible-heartbeat",
        ),
    ],
)
def test_a_retry_after_the_credential_was_used_is_refused(app, client, use):
    body, first = claimed(client)
    assert use(client, first["credential"]).status_code in (200, 426)
    assert_refused_as_today(client.post(ENROLL, json=body))
    (only,) = credentials(app)
    assert only.active and only.first_used_at is not None
    assert beat(client, first["credential"]).status_code == 200
    assert audit_events(app, "credential.reissued") == []


def test_only_the_first_use_touches_the_credential_row(app, client):
    """The heartbeat hot path stays as it was: after the first call, no statement writes credentials."""
    body, first = claimed(client)
    statements: list[str] = []

    def seen(conn, cursor, statement, *args):
        statements.append(" ".join(statement.split()).lower())

    with app.app_context():
        engine = db.engine
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        assert beat(client, first["credential"]).status_code == 200
        on_first = [s for s in statements if s.startswith("update credentials")]
        statements.clear()
        (used,) = credentials(app)
        assert beat(client, first["credential"]).status_code == 200
        on_second = [s for s in statements if s.startswith("update credentials")]
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    assert len(on_first) == 1 and on_second == []
    (again,) = credentials(app)
    assert again.first_used_at == used.first_used_at is not None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"node_id": "another"}, id="another-node-id"),
        pytest.param({"control_plane_url": "http://127.0.0.1"}, id="another-origin"),
    ],
)
def test_the_same_token_from_another_node_or_origin_is_refused(app, client, change):
    body, first = claimed(client)
    if change.get("node_id") == "another":
        change = {"node_id": str(uuid.uuid4())}
    refused = client.post(ENROLL, json={**body, **change})
    assert_refused_as_today(refused)
    (only,) = credentials(app)
    assert only.active and beat(client, first["credential"]).status_code == 200


def test_a_retry_after_the_token_expired_is_refused(app, client):
    body, first = claimed(client)
    enrollment_id = credentials(app)[0].enrollment_id
    factories.expire_enrollments(app, enrollment_id)
    assert_refused_as_today(client.post(ENROLL, json=body))
    (only,) = credentials(app)
    assert only.active and beat(client, first["credential"]).status_code == 200


def test_a_retry_after_the_operator_revoked_or_rotated_the_credential_is_refused(app, client):
    body, first = claimed(client)
    rotated = client.post(f"/api/v1/admin/nodes/{body['node_id']}/credential/rotate", headers=ADMIN)
    assert rotated.status_code == 201
    # The rotated credential came from the operator, not from this token: it is never replaced.
    assert_refused_as_today(client.post(ENROLL, json=body))
    assert beat(client, rotated.get_json()["credential"]).status_code == 200

    body, first = claimed(client)
    assert client.post(f"/api/v1/admin/nodes/{body['node_id']}/credential/revoke", headers=ADMIN).status_code == 200
    assert_refused_as_today(client.post(ENROLL, json=body))
    assert [row.active for row in credentials(app)] == [False, True, False]


def test_a_retry_with_an_unknown_token_is_refused_as_today(client):
    body, _ = claimed(client)
    refused = client.post(ENROLL, json={**body, "enrollment_token": "mfe_" + "x" * 43})
    assert refused.status_code == 401
    assert refused.get_json()["error"]["code"] == "ENROLLMENT_TOKEN_INVALID"


def test_a_first_use_racing_a_retry_leaves_exactly_one_winner(app, client):
    """The first heartbeat and a retried claim at once: either the beat wins (the retry is
    refused and the credential works) or the retry wins (the beat gets 401, the fresh one works)."""
    for _ in range(6):
        body, first = claimed(client)
        barrier = threading.Barrier(2)

        def send(request: tuple[str, dict, dict], barrier=barrier):
            path, json_body, headers = request
            barrier.wait()
            return app.test_client().post(path, json=json_body, headers=headers)

        first_beat = (HEARTBEAT, factories.heartbeat_body(telemetry=[]), factories.bearer(first["credential"]))
        with ThreadPoolExecutor(max_workers=2) as pool:
            beat_reply, retry = pool.map(send, [first_beat, (ENROLL, body, {})])
        assert (beat_reply.status_code, retry.status_code) in {(200, 409), (401, 201)}
        active = [row for row in credentials(app) if row.node_id == body["node_id"] and row.active]
        assert len(active) == 1
        winner = first["credential"] if retry.status_code == 409 else retry.get_json()["credential"]
        assert beat(client, winner).status_code == 200


def test_concurrent_retries_leave_one_active_credential(app, client):
    body, lost = claimed(client)
    barrier = threading.Barrier(8)

    def retry(_):
        barrier.wait()
        return app.test_client().post(ENROLL, json=body)

    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(retry, range(8)))
    statuses = [response.status_code for response in responses]
    # PostgreSQL: a retry that waited on the row another revoked matches nothing and is refused;
    # SQLite runs them one after another, each replacing the still-unused credential before it.
    assert set(statuses) <= {201, 409} and 201 in statuses, statuses
    handed = [response.get_json()["credential"] for response in responses if response.status_code == 201]
    rows = credentials(app)
    active = [row for row in rows if row.active]
    assert len(active) == 1
    assert len(rows) == 1 + len(handed)
    assert len(audit_events(app, "credential.reissued")) == len(handed)
    working = [
        credential for credential in [lost["credential"], *handed] if beat(client, credential).status_code == 200
    ]
    assert len(working) == 1


def test_a_credential_issued_before_the_migration_is_never_reissued(tmp_path):
    """0009 round trip on a database with an enrolled node: the credential keeps working, and with
    no enrolment recorded on it a retried claim is refused as before (SQLite; E2)."""
    from flask_migrate import downgrade, upgrade

    from app import create_app
    from tests.support import app_env

    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    application = create_app(app_env(url, tmp_path))
    with application.app_context():
        upgrade()
    body, first = claimed(application.test_client())
    with application.app_context():
        db.engine.dispose()
        downgrade(revision="0008_sweep_durations")
        with db.engine.connect() as connection:
            columns = {column["name"] for column in sa.inspect(connection).get_columns("credentials")}
            assert {"enrollment_id", "first_used_at"}.isdisjoint(columns)
        upgrade()
        db.engine.dispose()
    client = application.test_client()
    assert_refused_as_today(client.post(ENROLL, json=body))
    (only,) = credentials(application)
    assert only.active and only.enrollment_id is None
    assert beat(client, first["credential"]).status_code == 200
