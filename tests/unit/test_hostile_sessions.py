"""A hostile network against the console and the enrol endpoint (issue 15): sign-out that ends
the session (C1, P2), enrol answers that do not reveal node IDs (E2, I4), Host headers that are
not an origin (E3, P5), database files only the owner reads, and `nosniff` on every response.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from datetime import timedelta

import sqlalchemy as sa

from app import create_app
from app.extensions import db
from app.models import AuditEvent, Credential, Node, OperatorSession
from app.timeutil import utcnow
from tests import support
from tests.support import OPERATOR_KEY, factories, file_modes
from tests.support.console import COOKIE, HTMX, csrf_from, signed_in


def signed_in_client(app):
    """A fresh browser with an operator session; `.csrf` holds its CSRF token."""
    return signed_in(app.test_client())


def replay(app, cookie_value: str):
    """Another browser that presents a copied session cookie."""
    thief = app.test_client()
    thief.set_cookie(COOKIE, cookie_value)
    return thief


def node_state(app, node_id: str) -> tuple[bool, list[str]]:
    """Whether the node is disabled, and its credential hashes (what a replayed action would change)."""
    with app.app_context():
        disabled = db.session.scalar(sa.select(Node.disabled).where(Node.id == node_id))
        hashes = db.session.scalars(sa.select(Credential.token_hash).order_by(Credential.id)).all()
        db.session.remove()
    return disabled, hashes


def assert_replay_changes_nothing(app, cookie_value: str, csrf: str, node_id: str) -> None:
    """The old cookie with its own CSRF token can neither read a page nor disable or rotate."""
    before = node_state(app, node_id)
    thief = replay(app, cookie_value)
    assert thief.get("/hardware/nodes").status_code == 302
    for action in ("disable", "credential/rotate", "credential/revoke"):
        response = thief.post(f"/hardware/nodes/{node_id}/{action}", headers={**HTMX, "X-CSRFToken": csrf})
        assert response.status_code == 401, (action, response.status_code)
        assert response.headers["HX-Redirect"] == "/login"
    assert node_state(app, node_id) == before


def session_rows(app) -> list[OperatorSession]:
    with app.app_context():
        rows = db.session.scalars(sa.select(OperatorSession).order_by(OperatorSession.id)).all()
        db.session.expunge_all()
        db.session.remove()
    return rows


# --------------------------------------------------------------------------- C1 sessions


def test_an_old_cookie_and_its_csrf_token_are_worthless_after_sign_out(app):
    browser = signed_in_client(app)
    node = factories.enrolled_node(browser)
    cookie = browser.get_cookie(COOKIE).value
    # Before sign-out the copy works: the replay below is refused because of the sign-out alone.
    assert replay(app, cookie).get("/hardware/nodes").status_code == 200
    assert browser.post("/logout", data={"csrf_token": browser.csrf}).status_code == 302
    assert_replay_changes_nothing(app, cookie, browser.csrf, node["node_id"])
    (row,) = session_rows(app)
    assert row.revoked_at is not None
    with app.app_context():
        assert "console.logout" in db.session.scalars(sa.select(AuditEvent.action)).all()


def test_sign_out_everywhere_ends_every_session_and_is_audited(app):
    laptop, phone = signed_in_client(app), signed_in_client(app)
    node = factories.enrolled_node(laptop)
    stolen = phone.get_cookie(COOKIE).value
    page = laptop.get("/hardware/nodes").get_data(as_text=True)
    assert 'data-testid="sign-out-everywhere"' in page and 'action="/logout/everywhere"' in page
    assert laptop.post("/logout/everywhere").status_code == 400  # CSRF, as every form
    assert phone.get("/hardware/nodes").status_code == 200
    ended = laptop.post("/logout/everywhere", data={"csrf_token": laptop.csrf})
    assert ended.status_code == 302 and ended.headers["Location"] == "/login"
    assert_replay_changes_nothing(app, stolen, phone.csrf, node["node_id"])
    assert laptop.get("/hardware/nodes").status_code == 302
    assert all(row.revoked_at is not None for row in session_rows(app))
    with app.app_context():
        event = db.session.scalar(sa.select(AuditEvent).where(AuditEvent.action == "console.sign_out_everywhere"))
        assert event.actor == "operator" and event.details["sessions_ended"] == 2
    # The operator key still gets in afterwards.
    assert signed_in_client(app).get("/hardware/nodes").status_code == 200


def test_the_server_keeps_only_a_hash_of_the_session_id(app):
    browser = signed_in_client(app)
    serializer = app.session_interface.get_signing_serializer(app)
    session_id = serializer.loads(browser.get_cookie(COOKIE).value)["sid"]
    assert len(session_id) >= 43  # 256 bits
    (row,) = session_rows(app)
    assert row.token_hash == hashlib.sha256(session_id.encode()).hexdigest()
    assert row.remote_addr == "127.0.0.1" and row.user_agent
    assert timedelta(hours=11, minutes=59) < row.expires_at - row.created_at <= timedelta(hours=12)
    with app.app_context():
        dumped = json.dumps(
            [list(r) for r in db.session.execute(sa.text("SELECT * FROM operator_sessions"))], default=str
        )
        audit_dump = json.dumps([event.to_dict() for event in db.session.scalars(sa.select(AuditEvent))])
    assert session_id not in dumped and session_id not in audit_dump


def test_a_hostile_user_agent_is_stored_printable_and_bounded(app):
    """Kept for display only: NUL (which PostgreSQL refuses), escapes and length never reach the row."""
    browser = app.test_client()
    page = browser.get("/login").get_data(as_text=True)
    signed = browser.post(
        "/login",
        data={"operator_key": OPERATOR_KEY, "csrf_token": csrf_from(page)},
        headers={"User-Agent": "evil\x00\x1b[31m\u202e" + "a" * 500},
    )
    assert signed.status_code == 302
    (row,) = session_rows(app)
    assert row.user_agent == "evil[31m" + "a" * 192


def test_a_session_past_its_expiry_is_refused(app):
    browser = signed_in_client(app)
    with app.app_context():
        db.session.execute(sa.update(OperatorSession).values(expires_at=utcnow() - timedelta(seconds=1)))
        db.session.commit()
    assert browser.get("/hardware/nodes").status_code == 302


def test_last_seen_is_written_at_most_once_a_minute(app):
    browser = signed_in_client(app)
    (first,) = session_rows(app)
    for _ in range(5):
        assert browser.get("/hardware/nodes").status_code == 200
    (same,) = session_rows(app)
    assert same.last_seen_at == first.last_seen_at
    an_hour_ago = utcnow() - timedelta(hours=1)
    with app.app_context():
        db.session.execute(sa.update(OperatorSession).values(last_seen_at=an_hour_ago))
        db.session.commit()
    assert browser.get("/hardware/nodes").status_code == 200
    (touched,) = session_rows(app)
    assert touched.last_seen_at > an_hour_ago + timedelta(minutes=59)


# --------------------------------------------------------------------------- E2, I4 enrol answers


def test_a_bad_token_gets_the_same_answer_whether_or_not_the_node_id_exists(app, client):
    enrolled = factories.enrolled_node(client)
    spent = enrolled["token"]
    # Its credential used: a consumed token's retry is then refused (a never-used one is reissued).
    beat = client.post(
        "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=factories.bearer(enrolled["credential"])
    )
    assert beat.status_code == 200
    expired = factories.mint(client)
    factories.expire_enrollments(app, expired["id"])
    elsewhere = factories.mint(client)["token"]
    cases = {
        "unknown": factories.enroll_body("mfe_" + "x" * 43),
        "consumed": factories.enroll_body(spent),
        "expired": factories.enroll_body(expired["token"]),
        "other origin": factories.enroll_body(elsewhere, origin="http://elsewhere.example"),
    }
    for name, body in cases.items():
        answers = []
        for node_id in (enrolled["node_id"], factories.enroll_body("t")["node_id"]):
            response = client.post("/api/v1/agent/enroll", json={**body, "node_id": node_id})
            answers.append((response.status_code, response.get_json()))
        assert answers[0] == answers[1], name
        assert answers[0][1]["error"]["code"] != "NODE_ALREADY_ENROLLED", name


def test_a_valid_token_still_learns_the_node_is_enrolled_and_is_not_spent(app, client):
    enrolled = factories.enrolled_node(client)
    token = factories.mint(client)["token"]
    refused = client.post("/api/v1/agent/enroll", json=factories.enroll_body(token, node_id=enrolled["node_id"]))
    assert refused.status_code == 409 and refused.get_json()["error"]["code"] == "NODE_ALREADY_ENROLLED"
    assert client.post("/api/v1/agent/enroll", json=factories.enroll_body(token)).status_code == 201


# --------------------------------------------------------------------------- nosniff


def test_every_response_says_nosniff(client):
    responses = {
        "healthz": client.get("/healthz"),
        "api 401": client.get("/api/v1/hardware/nodes"),
        "api 404": client.get("/api/v1/nowhere"),
        "api 400": client.post("/api/v1/agent/enroll", data="{", content_type="application/json"),
        "console": client.get("/login"),
        "console 404": client.get("/nowhere"),
        "static": client.get("/static/console.css"),
    }
    for name, response in responses.items():
        assert response.headers.get("X-Content-Type-Options") == "nosniff", name
        response.close()


# --------------------------------------------------------------------------- E3, P5 Host header


# --------------------------------------------------------------------------- database file modes


def test_an_existing_world_readable_database_is_tightened_on_start(tmp_path, sqlite_template):
    path = tmp_path / "old.sqlite3"
    shutil.copyfile(sqlite_template, path)
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).touch()
        os.chmod(f"{path}{suffix}", 0o644)
    application = create_app(support.app_env(f"sqlite:///{path}", tmp_path))
    with application.app_context():
        db.engine.dispose()
    assert file_modes(path) == {"": "0o600", "-wal": "0o600", "-shm": "0o600"}
