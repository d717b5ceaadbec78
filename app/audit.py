"""Writing audit events (P4). Callers commit; details must never hold a secret."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent
from app.timeutil import utcnow

OPERATOR = "operator"
SYSTEM = "system"


def agent_actor(node_id: str) -> str:
    """The actor name for something a node's agent did."""
    return f"agent:{node_id}"


def record(actor: str, action: str, node_id: str | None = None, **details: object) -> AuditEvent:
    """Add one audit event to the current transaction."""
    event = AuditEvent(at=utcnow(), actor=actor, action=action, node_id=node_id, details=details)
    db.session.add(event)
    return event


# A loose index scan: one index probe per distinct action (about twenty kinds) instead of reading
# every event, which SELECT DISTINCT does on SQLite and PostgreSQL alike as the log grows (C5).
_DISTINCT_ACTIONS = sa.text(
    """
    WITH RECURSIVE found(action) AS (
        SELECT MIN(action) FROM audit_events
        UNION ALL
        SELECT (SELECT MIN(action) FROM audit_events WHERE action > found.action)
        FROM found WHERE found.action IS NOT NULL
    )
    SELECT action FROM found WHERE action IS NOT NULL
    """
)


def events(
    *,
    limit: int,
    node_id: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before_id: int | None = None,
) -> list[AuditEvent]:
    """Events newest first, filtered; `before_id` pages back (keyset), `until` is exclusive."""
    query = sa.select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if node_id:
        query = query.where(AuditEvent.node_id == node_id)
    if action:
        query = query.where(AuditEvent.action == action)
    if since is not None:
        query = query.where(AuditEvent.at >= since)
    if until is not None:
        query = query.where(AuditEvent.at < until)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    return list(db.session.scalars(query))


def distinct_actions() -> list[str]:
    """Every action the log holds, in order, for the audit page's filter."""
    return list(db.session.scalars(_DISTINCT_ACTIONS))
