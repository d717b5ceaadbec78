"""Admin API for the audit trail (P4)."""

from __future__ import annotations

import sqlalchemy as sa
from flask import request

from app.api import bp, json_response
from app.api.auth import admin_required
from app.api.validation import invalid
from app.extensions import db
from app.models import AuditEvent


def _int_arg(name: str, default: int | None, minimum: int, maximum: int) -> int | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(name, "must be a whole number") from None
    if not minimum <= value <= maximum:
        raise invalid(name, f"must be between {minimum} and {maximum}")
    return value


@bp.get("/admin/audit-events")
@admin_required
def list_audit_events():
    """Audit events newest first; filter by node_id and action; page with before_id."""
    limit = _int_arg("limit", 100, 1, 1000)
    before_id = _int_arg("before_id", None, 1, 2**62)
    query = sa.select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if node_id := request.args.get("node_id"):
        query = query.where(AuditEvent.node_id == node_id)
    if action := request.args.get("action"):
        query = query.where(AuditEvent.action == action)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    events = [event.to_dict() for event in db.session.scalars(query)]
    return json_response({"audit_events": events})
