"""The audit log page (C5, P4): filters by node, action and time; keyset pagination."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from flask import request

from app import audit
from app.console import bp, page_or_partial
from app.console.auth import login_required
from app.db import begin_read_only
from app.extensions import db
from app.models import Node

PAGE_SIZE = 50
# Each accepted format with its resolution: "until 14:05" means up to the end of that minute.
_TIME_FORMATS = (
    ("%Y-%m-%dT%H:%M", timedelta(minutes=1)),
    ("%Y-%m-%dT%H:%M:%S", timedelta(seconds=1)),
    ("%Y-%m-%d", timedelta(days=1)),
)
_PAGE_MARKER = re.compile(r"[0-9]{1,18}")
_FILTER_TEXT = re.compile(r"[A-Za-z0-9._:-]*")


def _time_arg(name: str, errors: dict[str, str]) -> tuple[datetime, timedelta] | None:
    """A `datetime-local` value read as UTC, with its resolution; a bad one is reported (P5)."""
    raw = (request.args.get(name) or "").strip()
    if not raw:
        return None
    for fmt, resolution in _TIME_FORMATS:
        try:
            return datetime.strptime(raw, fmt).replace(tzinfo=UTC), resolution
        except ValueError:
            continue
    errors[name] = "Use a date and time like 2026-11-30T14:05 (UTC)."
    return None


def _before_arg(errors: dict[str, str]) -> int | None:
    raw = (request.args.get("before") or "").strip()
    if not raw:
        return None
    if not _PAGE_MARKER.fullmatch(raw):
        errors["before"] = "Not a page marker."
        return None
    return int(raw)


def audit_page(errors: dict[str, str], **filters) -> dict[str, object]:
    """One page of events newest first (`?before=` pages back): `events`, `next_before`, `paged`.

    Shared by the audit log and the node page's Audit tab; a bad page marker lands in `errors`."""
    before = _before_arg(errors)
    events = audit.events(limit=PAGE_SIZE + 1, before_id=before, **filters)
    return {
        "events": events[:PAGE_SIZE],
        "next_before": events[PAGE_SIZE - 1].id if len(events) > PAGE_SIZE else None,
        "paged": before is not None,
    }


@bp.get("/audit")
@login_required
def audit_log():
    """Every state change, newest first (P4)."""
    begin_read_only()
    errors: dict[str, str] = {}
    filters = {
        "node": (request.args.get("node") or "").strip()[:36],
        "action": (request.args.get("action") or "").strip()[:64],
        "since": (request.args.get("since") or "").strip()[:19],
        "until": (request.args.get("until") or "").strip()[:19],
    }
    for name in ("node", "action"):
        # ids and dotted action names only: nothing else can match, and NUL must not reach the database
        if not _FILTER_TEXT.fullmatch(filters[name]):
            errors[name] = "Pick a value from the list."
            filters[name] = ""
    node_names = dict(db.session.execute(sa.select(Node.id, Node.display_name).order_by(Node.display_name)).all())
    if filters["node"] and filters["node"] not in node_names:
        # Like the jobs page: an id no node has is refused, never offered back as a choice.
        errors["node"] = "No node has this id; pick one from the list."
        filters["node"] = ""
    since, until = _time_arg("since", errors), _time_arg("until", errors)
    page = audit_page(
        errors,
        node_id=filters["node"],
        action=filters["action"],
        since=since[0] if since else None,
        until=until[0] + until[1] if until else None,  # the end of the minute or day it names
    )
    actions = audit.distinct_actions()
    return page_or_partial(
        "audit.html",
        "partials/_audit_table.html",
        **page,
        filters=filters,
        link_filters={name: value for name, value in filters.items() if value},
        errors=errors,
        node_names=node_names,
        actions=actions,
        active="audit",
    ), (400 if errors else 200)
