"""Admin API for the audit trail (P4)."""

from __future__ import annotations

import re

from flask import request

from app import audit, rules
from app.api import json_response, operations, replies
from app.api.auth import admin_required
from app.api.validation import invalid

# P4: how many events a page holds, and the ids a page may start before; the document states both.
LIMIT = (1, 1000)
BEFORE_ID = (1, 2**62)


def _int_arg(name: str, default: int | None, minimum: int, maximum: int) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return default
    # As the document says: an integer, written in ASCII digits (int() would also take " 5", "+5",
    # "٥" and "1_000"); an empty value is not a number either.
    if re.fullmatch(r"-?[0-9]+", raw) is None:
        raise invalid(name, "must be a whole number")
    # P5: read through rules.whole_number, so 4,301 digits are out of range, not int()'s ValueError.
    value = rules.whole_number(raw, minimum, maximum)
    if value is None:
        raise invalid(name, f"must be between {minimum} and {maximum}")
    return value


@operations.get(
    "/admin/audit-events",
    "Audit events, newest first (P4)",
    query={
        "node_id": operations.TEXT,
        "action": operations.TEXT,
        "limit": {"type": "integer", "minimum": LIMIT[0], "maximum": LIMIT[1]},
        "before_id": {"type": "integer", "minimum": BEFORE_ID[0], "maximum": BEFORE_ID[1]},
    },
    replies={200: (replies.AuditEvents, "Events")},
    errors=(400, 401),
)
@admin_required
def list_audit_events():
    """Audit events newest first; filter by node_id and action; page with before_id."""
    limit = _int_arg("limit", 100, *LIMIT)
    before_id = _int_arg("before_id", None, *BEFORE_ID)
    found = audit.events(
        limit=limit, node_id=request.args.get("node_id"), action=request.args.get("action"), before_id=before_id
    )
    events = [event.to_dict() for event in found]
    return json_response({"audit_events": events})
