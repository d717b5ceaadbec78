"""Hardware → Nodes: the node list (C2, I4); the node page is app/console/node_page.py."""

from __future__ import annotations

from collections import Counter

import sqlalchemy as sa
from flask import redirect, request, url_for

from app import acceptance, nodes
from app.config import current_settings
from app.console import bp, page_or_partial
from app.console.auth import login_required
from app.db import begin_read_only
from app.extensions import db
from app.models import Credential, Node, NodeLease


@bp.get("/")
@login_required
def index():
    """The console opens on the node list."""
    return redirect(url_for("console.nodes_page"))


STATUS_FILTERS = ("online", "stale", "offline", "pending", "disabled")


def _matches(row: nodes.NodeSummary, status: str, needle: str) -> bool:
    if status and ("disabled" if row.disabled else row.status) != status:
        return False
    if needle:
        haystack = " ".join((row.display_name, row.hostname, row.id, *row.gpu_models)).casefold()
        return needle.casefold() in haystack
    return True


def credential_refusals(node_ids: list[str] | None = None) -> dict[str, object]:
    """Nodes whose agent presented an unknown credential since their last accepted heartbeat and
    since their current credential was made: after a restore, the agent exits 5 and stays down
    until the operator rotates or re-enrols (app.api.auth.note_refused_credential). Node → when."""
    query = (
        sa.select(Node.id, Node.credential_refused_at, NodeLease.last_heartbeat_at, sa.func.max(Credential.created_at))
        .outerjoin(NodeLease, NodeLease.node_id == Node.id)
        .outerjoin(Credential, sa.and_(Credential.node_id == Node.id, Credential.revoked_at.is_(None)))
        .where(Node.credential_refused_at.is_not(None))
        .group_by(Node.id, Node.credential_refused_at, NodeLease.last_heartbeat_at)
    )
    if node_ids is not None:
        query = query.where(Node.id.in_(node_ids))
    return {
        node_id: refused_at
        for node_id, refused_at, beat_at, issued_at in db.session.execute(query)
        if all(moment is None or refused_at > moment for moment in (beat_at, issued_at))
    }


@bp.get("/hardware/nodes")
@login_required
def nodes_page():
    """C2: one row per node; the table partial polls itself, keeping any filter."""
    begin_read_only()
    status = request.args.get("status", "")
    needle = request.args.get("q", "").strip()[:200]
    error = None
    if status and status not in STATUS_FILTERS:
        # 400 with the list unfiltered by status, and the words say exactly what is shown.
        shown_now = f"showing nodes of any status that match {needle!r}" if needle else "showing every node"
        error, status = f"Unknown status {status[:40]!r}; {shown_now}.", ""
    rows = nodes.summaries(current_settings())
    counts = Counter("disabled" if row.disabled else row.status for row in rows)
    duplicates = sorted({row.hostname for row in rows if row.suspected_duplicate_hostname})
    shown = [row for row in rows if _matches(row, status, needle)] if status or needle else rows
    filters = {name: value for name, value in (("status", status), ("q", needle)) if value}
    return page_or_partial(
        "nodes.html",
        "partials/_nodes_table.html",
        rows=shown,
        total=len(rows),
        counts=counts,
        duplicate_hostnames=duplicates,
        filters=filters,
        statuses=STATUS_FILTERS,
        error=error,
        # V1: every shown node's verdict in one batch, never one checklist per row.
        validated=acceptance.verdicts([row.id for row in shown]),
        refused_credentials=credential_refusals(),
        active="nodes",
    ), (400 if error else 200)
