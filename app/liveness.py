"""online → stale → offline (L1–L4): computed from the stored heartbeat time, swept set-wise."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from app import audit
from app.compat import COMPATIBLE
from app.config import Settings
from app.extensions import db
from app.models import AuditEvent, Node, NodeLease
from app.timeutil import isoformat, utcnow

ONLINE, STALE, OFFLINE, PENDING = "online", "stale", "offline", "pending"
_leases = NodeLease.__table__


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


def _transition(previous: str, new: str, cutoff: datetime) -> list[str]:
    """One conditional UPDATE … RETURNING: only rows this run changed come back."""
    statement = (
        _leases.update()
        .where(_leases.c.status == previous, _leases.c.last_heartbeat_at <= cutoff)
        .values(status=new)
        .returning(_leases.c.node_id)
    )
    return list(db.session.connection().execute(statement).scalars())


def sweep(settings: Settings, now: datetime | None = None) -> dict[str, int]:
    """Move silent nodes to stale and offline; audit each transition exactly once (L1, L3, P4).

    Set-based on the indexed status and heartbeat columns: a duplicate run at the same moment
    matches no row, so it changes nothing and audits nothing.
    """
    now = now or utcnow()
    offline_cutoff = now - timedelta(seconds=settings.node_offline_after_seconds)
    stale_cutoff = now - timedelta(seconds=settings.node_stale_after_seconds)
    moved: list[tuple[str, str, str]] = []
    for previous in (ONLINE, STALE):
        moved += [(node_id, previous, OFFLINE) for node_id in _transition(previous, OFFLINE, offline_cutoff)]
    moved += [(node_id, ONLINE, STALE) for node_id in _transition(ONLINE, STALE, stale_cutoff)]
    if moved:
        db.session.execute(
            sa.insert(AuditEvent),
            [
                {
                    "at": now,
                    "actor": audit.SYSTEM,
                    "action": f"node.{new}",
                    "node_id": node_id,
                    "details": {"previous": previous, "swept_at": isoformat(now)},
                }
                for node_id, previous, new in moved
            ],
        )
    db.session.commit()
    return {"stale": sum(new == STALE for *_, new in moved), "offline": sum(new == OFFLINE for *_, new in moved)}


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
