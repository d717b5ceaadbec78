"""Admin API for the audit trail (P4)."""

from __future__ import annotations

import re

from flask import request

from app import audit
from app.api import bp, json_response
from app.api.auth import admin_required
from app.api.validation import invalid


def _int_arg(name: str, default: int | None, minimum: int, maximum: int) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return default
    # As the document says: an integer, written in ASCII digits (int() would also take " 5", "+5",
    # "٥" and "1_000"); an empty value is not a number either.
    if re.fullmatch(r"-?[0-9]+", raw) is None:
        raise invalid(name, "must be a whole number")
    value = int(raw)
    if not minimum <= value <= maximum:
        raise invalid(name, f"must be between {minimum} and {maximum}")
    return value


@bp.get("/admin/audit-events")
@admin_required
def list_audit_events():
    """Audit events newest first; filter by node_id and action; page with before_id."""
    limit = _int_arg("limit", 100, 1, 1000)
    before_id = _int_arg("before_id", None, 1, 2**62)
    found = audit.events(
        limit=limit, node_id=request.args.get("node_id"), action=request.args.get("action"), before_id=before_id
    )
    events = [event.to_dict() for event in found]
    return json_response({"audit_events": events})
