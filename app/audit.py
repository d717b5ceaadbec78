"""Writing audit events (P4). Callers commit; details must never hold a secret."""

from __future__ import annotations

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
