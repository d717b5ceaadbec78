"""Client API keys (S1, P2): mint, list, revoke, and authenticate a client of the serving API.

A key is `mfk_` and 256 random bits, shown once in the reply that mints it; the table keeps its
SHA-256 digest (the index a request is found by) and a visible prefix. The operator key, node
credentials and enrolment tokens live elsewhere and are never client keys: `authenticate` finds
only what `mint` stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from app import audit, tokens
from app.db import READ_ONLY
from app.errors import DomainError
from app.extensions import db
from app.models import ApiKey
from app.timeutil import utcnow

# S1: an optional expiry, from a minute to five years; none means the key lasts until revoked.
MIN_EXPIRY_SECONDS = 60
MAX_EXPIRY_SECONDS = 5 * 365 * 86_400
# A busy client must not write a row per request: last use is recorded at this resolution.
LAST_USED_RESOLUTION = timedelta(minutes=1)

ACTIVE, EXPIRED, REVOKED = "active", "expired", "revoked"


@dataclass(frozen=True)
class Client:
    """Who a serving request comes from: the key's id and name, never its secret."""

    api_key_id: str
    name: str


def mint(name: str, expires_in_seconds: int | None = None, actor: str = audit.OPERATOR) -> tuple[ApiKey, str]:
    """Mint a key; return the row and the key, which exists nowhere else."""
    issued = tokens.issue(tokens.API_KEY_PREFIX)
    now = utcnow()
    key = ApiKey(
        name=name,
        key_hash=issued.digest,
        prefix=issued.visible_prefix,
        created_at=now,
        expires_at=None if expires_in_seconds is None else now + timedelta(seconds=expires_in_seconds),
    )
    db.session.add(key)
    db.session.flush()
    audit.record(
        actor,
        "api_key.minted",
        api_key_id=key.id,
        name=key.name,
        prefix=key.prefix,
        expires_at=key.expires_at.isoformat() if key.expires_at else None,
    )
    db.session.commit()
    return key, issued.secret


def get(api_key_id: str) -> ApiKey:
    """The key with this id, or API_KEY_NOT_FOUND."""
    key = db.session.get(ApiKey, api_key_id)
    if key is None:
        raise DomainError(
            "API_KEY_NOT_FOUND",
            f"No API key has id {api_key_id!r}.",
            "List API keys with GET /api/v1/admin/api-keys.",
        )
    return key


def list_all() -> list[ApiKey]:
    """Every key, newest first (revoked and expired ones too: their last use is history)."""
    return list(db.session.scalars(sa.select(ApiKey).order_by(ApiKey.created_at.desc(), ApiKey.id)))


def revoke(api_key_id: str, actor: str = audit.OPERATOR) -> ApiKey:
    """Revoke a key; its next request is refused. Revoking it again changes nothing and says so in 200."""
    revoked = db.session.execute(
        sa.update(ApiKey)
        .where(ApiKey.id == api_key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
        .returning(ApiKey.name, ApiKey.prefix)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    if revoked is None:
        db.session.rollback()
        return get(api_key_id)  # already revoked, or API_KEY_NOT_FOUND
    audit.record(actor, "api_key.revoked", api_key_id=api_key_id, name=revoked.name, prefix=revoked.prefix)
    db.session.commit()
    db.session.expire_all()
    return get(api_key_id)


def state(key: ApiKey, now: datetime | None = None) -> str:
    """Whether a key is accepted now: active, or why not (revoked wins over expired)."""
    if key.revoked_at is not None:
        return REVOKED
    if key.expires_at is not None and key.expires_at <= (now or utcnow()):
        return EXPIRED
    return ACTIVE


_columns = ApiKey.__table__.c
_FIND = sa.select(
    _columns.id, _columns.name, _columns.key_hash, _columns.expires_at, _columns.revoked_at, _columns.last_used_at
).where(_columns.key_hash == sa.bindparam("digest"))
_NOTE_USE = (
    ApiKey.__table__.update()
    .where(
        _columns.id == sa.bindparam("api_key_id"),
        sa.or_(_columns.last_used_at.is_(None), _columns.last_used_at < sa.bindparam("due")),
    )
    .values(last_used_at=sa.bindparam("now"))
)


def invalid(why: str) -> DomainError:
    return DomainError(
        "API_KEY_INVALID",
        f"The API key {why}.",
        "Send a client key as `Authorization: Bearer mfk_…`; an operator mints one in Console → API keys "
        "or with POST /api/v1/admin/api-keys.",
    )


def authenticate(secret: str) -> Client:
    """The client behind a presented key (S1): an indexed digest lookup, then a constant-time compare.

    Refused with API_KEY_INVALID (401) when unknown, revoked or expired; anything without the
    `mfk_` prefix (the operator key, a node credential, an enrolment token) is unknown by rule,
    before any query. The lookup runs on its own reader connection and the last-use write, at most
    once per LAST_USED_RESOLUTION per key, in its own short transaction: a request's transaction
    starts as the request wants it, and a busy client costs no write per request.
    """
    if not secret.startswith(tokens.API_KEY_PREFIX):
        raise invalid("is not a client key (mfk_…)")
    now = utcnow()
    with db.engine.connect().execution_options(**{READ_ONLY: True}) as connection:
        row = connection.execute(_FIND, {"digest": tokens.digest(secret)}).one_or_none()
    # The index found the row; compare_digest keeps the final check constant-time.
    if row is None or not tokens.same_digest(row.key_hash, secret):
        raise invalid("is not known to this control plane")
    if row.revoked_at is not None:
        raise invalid("has been revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise invalid("has expired")
    due = now - LAST_USED_RESOLUTION
    # Never while the caller's own transaction is open: on SQLite it may hold the write lock.
    if (row.last_used_at is None or row.last_used_at < due) and not db.session().in_transaction():
        with db.engine.begin() as connection:
            connection.execute(_NOTE_USE, {"api_key_id": row.id, "due": due, "now": now})
    return Client(api_key_id=row.id, name=row.name)
