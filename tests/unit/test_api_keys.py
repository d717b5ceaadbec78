"""Client API keys through the admin API and `authenticate`: minted once, hashed, revoked, expired (S1, P2)."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app import tokens
from app.errors import DomainError
from app.extensions import db
from app.models import ApiKey, AuditEvent
from app.serving import api_keys
from app.timeutil import utcnow
from tests.support import ADMIN, OPERATOR_KEY, assert_no_secrets, factories
from tests.support.bodies import WRONG_API_KEYS

API_KEYS = "/api/v1/admin/api-keys"
LISTED_FIELDS = {"id", "name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at"}


def mint(client, **body) -> dict:
    response = client.post(API_KEYS, json={"name": "open-webui", **body}, headers=ADMIN)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def listed(client) -> list[dict]:
    response = client.get(API_KEYS, headers=ADMIN)
    assert response.status_code == 200
    return response.get_json()["api_keys"]


def authenticate(app, secret: str) -> api_keys.Client:
    """`authenticate` as the serving API will call it: at the start of a request, no transaction open."""
    with app.app_context():
        return api_keys.authenticate(secret)


def refusal(app, secret: str) -> DomainError:
    with pytest.raises(DomainError) as refused:
        authenticate(app, secret)
    assert refused.value.code == "API_KEY_INVALID"
    return refused.value


def snapshot(app) -> tuple[list, list]:
    """Every key row and every audit event, to show a refusal changed nothing."""
    with app.app_context():
        keys = [tuple(row) for row in db.session.execute(sa.text("SELECT * FROM api_keys ORDER BY id"))]
        events = [event.to_dict() for event in db.session.scalars(sa.select(AuditEvent).order_by(AuditEvent.id))]
    return keys, events


def stored_key(app, api_key_id: str) -> ApiKey:
    with app.app_context():
        key = db.session.get(ApiKey, api_key_id)
        db.session.expunge(key)
        return key


def set_column(app, api_key_id: str, **values) -> None:
    """Move a key's moment (expiry, last use) as time passing would."""
    with app.app_context():
        db.session.execute(sa.update(ApiKey).where(ApiKey.id == api_key_id).values(**values))
        db.session.commit()


def events(app, action: str) -> list[AuditEvent]:
    with app.app_context():
        return list(db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == action)))


def test_mint_answers_the_key_once_and_the_database_keeps_only_its_digest(app, client):
    response = client.post(API_KEYS, json={"name": "open-webui", "expires_in_seconds": 3600}, headers=ADMIN)
    assert response.status_code == 201
    assert response.headers["Cache-Control"] == "no-store"
    minted = response.get_json()
    assert set(minted) == {"id", "name", "key", "created_at", "expires_at"}
    key = minted["key"]
    assert key.startswith("mfk_") and len(key) == 4 + 43  # 256 bits, url-safe base64
    assert minted["name"] == "open-webui"
    uuid.UUID(minted["id"])

    with app.app_context():
        rows = json.dumps([list(row) for row in db.session.execute(sa.text("SELECT * FROM api_keys"))], default=str)
    assert key not in rows and key[10:] not in rows
    assert hashlib.sha256(key.encode()).hexdigest() in rows

    (item,) = listed(client)
    assert set(item) == LISTED_FIELDS
    assert item["prefix"] == key[: len(tokens.API_KEY_PREFIX) + tokens.VISIBLE_CHARS]
    assert (item["last_used_at"], item["revoked_at"]) == (None, None)
    assert item["expires_at"] == minted["expires_at"] and item["created_at"] == minted["created_at"]
    assert key not in json.dumps(item) and hashlib.sha256(key.encode()).hexdigest() not in json.dumps(item)


def test_a_key_minted_without_expiry_lasts_until_revoked(app, client):
    minted = mint(client, expires_in_seconds=None)
    assert minted["expires_at"] is None
    assert mint(client)["expires_at"] is None
    set_column(app, minted["id"], created_at=utcnow() - timedelta(days=3650))
    assert authenticate(app, minted["key"]).api_key_id == minted["id"]


def test_keys_are_listed_newest_first(app, client):
    first, second = mint(client, name="first"), mint(client, name="second")
    set_column(app, first["id"], created_at=utcnow() - timedelta(hours=1))
    assert [item["id"] for item in listed(client)] == [second["id"], first["id"]]


@pytest.mark.parametrize(("body", "field"), WRONG_API_KEYS)
def test_a_bad_body_is_a_400_naming_the_field_and_mints_nothing(app, client, body, field):
    before = snapshot(app)
    response = client.post(API_KEYS, json=body, headers=ADMIN)
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "VALIDATION_FAILED" and error["field"] == field
    assert error["message"].startswith(field) and error["next_step"]
    assert snapshot(app) == before


@pytest.mark.parametrize(
    ("data", "content_type", "status"),
    [("[]", "application/json", 400), ("{", "application/json", 400), ("name=x", "text/plain", 415)],
)
def test_a_body_that_is_not_a_json_object_is_a_clear_4xx(app, client, data, content_type, status):
    before = snapshot(app)
    response = client.post(API_KEYS, data=data, content_type=content_type, headers=ADMIN)
    assert response.status_code == status and response.get_json()["error"]["code"]
    assert snapshot(app) == before


def test_the_name_is_stored_without_outer_spaces(client):
    assert mint(client, name="  laptop  ")["name"] == "laptop"
    assert mint(client, name="x" * 200)["name"] == "x" * 200


@pytest.mark.parametrize("headers", [{}, {"X-ModelForge-Admin-Token": "wrong" * 10}])
def test_every_key_route_needs_the_operator_key(app, client, headers):
    existing = mint(client)
    before = snapshot(app)
    for method, path in (("POST", API_KEYS), ("GET", API_KEYS), ("DELETE", f"{API_KEYS}/{existing['id']}")):
        response = client.open(path, method=method, json={"name": "x"}, headers=headers)
        assert response.status_code == 401, (method, path)
        assert response.get_json()["error"]["code"] in {"ADMIN_TOKEN_REQUIRED", "ADMIN_TOKEN_INVALID"}
    assert snapshot(app) == before


def test_a_client_key_is_not_an_operator_key(client):
    key = mint(client)["key"]
    response = client.get(API_KEYS, headers={"X-ModelForge-Admin-Token": key})
    assert response.status_code == 401 and response.get_json()["error"]["code"] == "ADMIN_TOKEN_INVALID"


def test_a_minted_key_authenticates_as_its_client(app, client):
    minted = mint(client)
    assert authenticate(app, minted["key"]) == api_keys.Client(api_key_id=minted["id"], name="open-webui")


def test_revoking_refuses_the_key_on_its_next_request_and_again_changes_nothing(app, client):
    minted, other = mint(client), mint(client, name="other")
    assert authenticate(app, minted["key"])

    response = client.delete(f"{API_KEYS}/{minted['id']}", headers=ADMIN)
    assert response.status_code == 200
    revoked = response.get_json()
    assert set(revoked) == LISTED_FIELDS and revoked["id"] == minted["id"] and revoked["revoked_at"]
    assert "revoked" in refusal(app, minted["key"]).message
    assert authenticate(app, other["key"]).api_key_id == other["id"]  # only that key

    before = snapshot(app)
    again = client.delete(f"{API_KEYS}/{minted['id']}", headers=ADMIN)
    assert again.status_code == 200 and again.get_json() == revoked
    assert snapshot(app) == before
    (event,) = events(app, "api_key.revoked")
    assert event.actor == "operator"
    assert event.details == {"api_key_id": minted["id"], "name": "open-webui", "prefix": revoked["prefix"]}
    assert {item["id"]: item["revoked_at"] for item in listed(client)} == {
        minted["id"]: revoked["revoked_at"],
        other["id"]: None,
    }


@pytest.mark.parametrize("api_key_id", ["00000000-0000-4000-8000-0000000000aa", "not-a-uuid", "%00", "x" * 300])
def test_revoking_an_unknown_key_is_a_404_in_the_one_error_shape(app, client, api_key_id):
    mint(client)
    before = snapshot(app)
    response = client.delete(f"{API_KEYS}/{api_key_id}", headers=ADMIN)
    assert response.status_code == 404
    error = response.get_json()["error"]
    assert error["code"] == "API_KEY_NOT_FOUND" and error["message"] and error["next_step"]
    assert snapshot(app) == before


def test_an_expired_key_is_refused_and_listed_with_its_expiry(app, client):
    minted = mint(client, expires_in_seconds=api_keys.MIN_EXPIRY_SECONDS)
    assert authenticate(app, minted["key"])
    set_column(app, minted["id"], expires_at=utcnow() - timedelta(seconds=1))
    assert "expired" in refusal(app, minted["key"]).message
    with app.app_context():
        assert api_keys.state(db.session.get(ApiKey, minted["id"])) == api_keys.EXPIRED


@pytest.mark.parametrize(
    "presented",
    ["", "mfk_", "mfk_" + "A" * 43, "Bearer mfk_x", OPERATOR_KEY, "mfk_" + OPERATOR_KEY],
)
def test_anything_but_a_minted_key_is_refused_and_changes_nothing(app, client, presented):
    mint(client)
    before = snapshot(app)
    refused = refusal(app, presented)
    assert refused.next_step and (len(presented) < 8 or presented not in refused.message)
    assert snapshot(app) == before


def test_a_secret_without_the_client_key_prefix_is_refused_before_any_query(app, client, caplog):
    node = factories.enrolled_node(client)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    for secret in (OPERATOR_KEY, node["credential"], node["token"]):
        refusal(app, secret)
    assert "SELECT" not in caplog.text


def test_node_credentials_and_enrolment_tokens_are_not_client_keys(app, client):
    node = factories.enrolled_node(client)
    unused = factories.mint(client)["token"]
    mint(client)
    for secret in (node["credential"], node["token"], unused):
        refusal(app, secret)
        # Not even as a digest someone copied into the table: only the prefix mint gives is a key.
        refusal(app, tokens.API_KEY_PREFIX + secret[len(tokens.API_KEY_PREFIX) :])


def test_the_operator_key_is_refused_even_when_it_has_the_client_key_prefix(database_url, tmp_path):
    from app import create_app
    from tests.support import app_env

    operator_key = tokens.API_KEY_PREFIX + "o" * 43
    application = create_app(app_env(database_url, tmp_path, MODELFORGE_OPERATOR_API_KEY=operator_key))
    try:
        client = application.test_client()
        assert client.get(API_KEYS, headers={"X-ModelForge-Admin-Token": operator_key}).status_code == 200
        refusal(application, operator_key)
    finally:
        with application.app_context():
            db.session.remove()
            db.engine.dispose()


def test_the_final_check_is_the_constant_time_digest_compare(app, client, monkeypatch):
    minted = mint(client)
    compared = []
    real = tokens.same_digest

    def recording(stored_digest, presented_secret):
        compared.append((stored_digest, presented_secret))
        return real(stored_digest, presented_secret)

    monkeypatch.setattr(tokens, "same_digest", recording)
    authenticate(app, minted["key"])
    assert compared == [(hashlib.sha256(minted["key"].encode()).hexdigest(), minted["key"])]


def test_last_use_is_recorded_at_most_once_a_minute_per_key(app, client):
    minted, idle = mint(client), mint(client, name="idle")
    authenticate(app, minted["key"])
    first = stored_key(app, minted["id"]).last_used_at
    assert first is not None and utcnow() - first < timedelta(minutes=1)
    for _ in range(5):
        authenticate(app, minted["key"])
    assert stored_key(app, minted["id"]).last_used_at == first  # a busy client writes nothing more
    assert stored_key(app, idle["id"]).last_used_at is None

    earlier = first - api_keys.LAST_USED_RESOLUTION
    set_column(app, minted["id"], last_used_at=earlier)
    authenticate(app, minted["key"])
    assert stored_key(app, minted["id"]).last_used_at > first
    (item,) = [item for item in listed(client) if item["id"] == minted["id"]]
    assert item["last_used_at"] is not None


def test_a_refused_key_records_no_use(app, client):
    minted = mint(client)
    client.delete(f"{API_KEYS}/{minted['id']}", headers=ADMIN)
    refusal(app, minted["key"])
    assert stored_key(app, minted["id"]).last_used_at is None


def test_minting_and_revoking_are_audited_without_the_key(app, client):
    minted = mint(client, name="ci runner", expires_in_seconds=86_400)
    client.delete(f"{API_KEYS}/{minted['id']}", headers=ADMIN)
    (event,) = events(app, "api_key.minted")
    assert event.actor == "operator" and event.node_id is None
    prefix = minted["key"][: len(tokens.API_KEY_PREFIX) + tokens.VISIBLE_CHARS]
    assert event.details["api_key_id"] == minted["id"] and event.details["prefix"] == prefix
    assert event.details["name"] == "ci runner" and event.details["expires_at"]
    with app.app_context():
        trail = json.dumps([event.to_dict() for event in db.session.scalars(sa.select(AuditEvent))])
    assert minted["key"] not in trail and minted["key"][len(prefix) :] not in trail
    assert hashlib.sha256(minted["key"].encode()).hexdigest() not in trail
    audit_reply = client.get("/api/v1/admin/audit-events", headers=ADMIN).get_data(as_text=True)
    assert "api_key.minted" in audit_reply and "api_key.revoked" in audit_reply
    assert minted["key"] not in audit_reply


def test_no_key_reaches_the_log_not_even_the_sql_log(app, client, caplog):
    # SQLAlchemy's engine log at INFO writes every statement with its parameters: the digest, never the key.
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    minted = mint(client)
    listed(client)
    authenticate(app, minted["key"])
    refusal(app, minted["key"][:-1] + ("A" if minted["key"][-1] != "A" else "B"))
    client.delete(f"{API_KEYS}/{minted['id']}", headers=ADMIN)
    refusal(app, minted["key"])
    client.post(API_KEYS, json={"name": "x", "key": minted["key"]}, headers=ADMIN)  # echoed nowhere
    assert hashlib.sha256(minted["key"].encode()).hexdigest() in caplog.text, "the SQL log was not captured"
    assert_no_secrets(caplog.text, minted["key"])
