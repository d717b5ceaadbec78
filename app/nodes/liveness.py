"""online → stale → offline (L1–L4): computed from the stored heartbeat time, swept set-wise."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from app import audit
from app.config import Settings
from app.extensions import db
from app.models import AuditEvent, Node, NodeLease
from app.nodes.compat import COMPATIBLE
from app.timeutil import UTCDateTime, isoformat, utcnow

ONLINE, STALE, OFFLINE, PENDING = "online", "stale", "offline", "pending"
_leases = NodeLease.__table__
_audit = AuditEvent.__table__


def status_of(last_heartbeat_at: datetime | None, now: datetime, settings: Settings) -> tuple[str, float | None]:
    """L1: status and heartbeat age from the stored time, so a stopped agent keeps ageing."""
    if last_heartbeat_at is None:
        return PENDING, None
    age = max((now - last_heartbeat_at).total_seconds(), 0.0)
    if age <= settings.node_stale_after_seconds:
        return ONLINE, age
    if age <= settings.node_offline_after_seconds:
        return STALE, age
    return OFFLINE, age


def _transition(previous: str, new: str, cutoff: datetime, now: datetime) -> int:
    """Move leases from `previous` to `new` and audit each moved node, without a Python loop.

    PostgreSQL: one statement, `WITH moved AS (UPDATE … RETURNING node_id) INSERT … SELECT
    FROM moved`, so the events are exactly the rows this run changed. SQLite: INSERT … SELECT
    then the same UPDATE, inside one BEGIN IMMEDIATE transaction that no writer can enter.
    """
    matches = (_leases.c.status == previous, _leases.c.last_heartbeat_at <= cutoff)
    update = _leases.update().where(*matches).values(status=new)
    details = {"previous": previous, "swept_at": isoformat(now)}

    def events(node_id_column) -> sa.Select:
        return sa.select(
            sa.literal(now, UTCDateTime()),
            sa.literal(audit.SYSTEM),
            sa.literal(f"node.{new}"),
            node_id_column,
            sa.literal(details, sa.JSON()),
        )

    columns = ["at", "actor", "action", "node_id", "details"]
    connection = db.session.connection()
    if connection.dialect.name == "postgresql":
        moved = update.returning(_leases.c.node_id).cte("moved")
        inserted = _audit.insert().from_select(columns, events(moved.c.node_id)).returning(_audit.c.id)
        return len(connection.execute(inserted).all())
    audited = connection.execute(_audit.insert().from_select(columns, events(_leases.c.node_id).where(*matches)))
    connection.execute(update)
    return audited.rowcount


def sweep(settings: Settings, now: datetime | None = None) -> dict[str, int]:
    """Move silent nodes to stale and offline; audit each transition exactly once (L1, L3, P4).

    Set-based on the (status, last heartbeat) index: a duplicate run at the same moment
    matches no row, so it changes nothing and audits nothing.
    """
    now = now or utcnow()
    offline_cutoff = now - timedelta(seconds=settings.node_offline_after_seconds)
    stale_cutoff = now - timedelta(seconds=settings.node_stale_after_seconds)
    offline = sum(_transition(previous, OFFLINE, offline_cutoff, now) for previous in (ONLINE, STALE))
    stale = _transition(ONLINE, STALE, stale_cutoff, now)
    db.session.commit()
    return {"stale": stale, "offline": offline}


def may_receive_work(node_id: str, settings: Settings, now: datetime | None = None) -> tuple[bool, str]:
    """L4: the one gate for handing work to a node — online, enabled and compatible."""
    row = db.session.execute(
        sa.select(Node.disabled, NodeLease.last_heartbeat_at, NodeLease.compatibility)
        .join(NodeLease, NodeLease.node_id == Node.id)
        .where(Node.id == node_id)
    ).one_or_none()
    if row is None:
        return False, "unknown node"
    if row.disabled:
        return False, "node is disabled"
    status, _ = status_of(row.last_heartbeat_at, now or utcnow(), settings)
    if status != ONLINE:
        return False, f"node is {status}"
    if row.compatibility != COMPATIBLE:
        return False, f"agent protocol is {row.compatibility or 'unknown'}"
    return True, "online, enabled and compatible"
