"""online → stale → offline (L1–L4): computed from the stored heartbeat time, swept set-wise."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from app import audit
from app.config import Settings
from app.extensions import db
from app.models import AuditEvent, Node, NodeLease, SweepTick
from app.nodes.compat import COMPATIBLE
from app.timeutil import UTCDateTime, isoformat, utcnow

ONLINE, STALE, OFFLINE, PENDING = "online", "stale", "offline", "pending"
LIVENESS_SWEEP = "liveness"
# The longest a live agent can take to reach the control plane once it hears again (A4): its
# longest backoff with jitter, after one request that ran to its timeout. The agent's numbers
# (BACKOFF_MAX_SECONDS and its ±20 % jitter, timeout=(5, 15)); tests/unit/test_liveness.py reads
# them off the agent, so the two cannot drift apart.
AGENT_LONGEST_BACKOFF_SECONDS = 16.0 * 1.2
AGENT_LONGEST_REQUEST_SECONDS = 5.0 + 15.0
_leases = NodeLease.__table__
_audit = AuditEvent.__table__


def status_of(
    last_heartbeat_at: datetime | None, now: datetime, settings: Settings, heard_since: datetime | None = None
) -> tuple[str, float | None]:
    """L1: status and heartbeat age from the stored time, so a stopped agent keeps ageing.

    `heard_since` (read it with `listening_since`): during a hold, a node last heard before the
    control plane could hear again is at most stale, never offline, as the sweep records it.
    The age stays the true one.
    """
    if last_heartbeat_at is None:
        return PENDING, None
    age = max((now - last_heartbeat_at).total_seconds(), 0.0)
    if age <= settings.node_stale_after_seconds:
        return ONLINE, age
    if age <= settings.node_offline_after_seconds or (heard_since is not None and last_heartbeat_at < heard_since):
        return STALE, age
    return OFFLINE, age


def hearing_hold_seconds(settings: Settings) -> float:
    """How long after the control plane could hear again silence from before is not judged (L1, J2).

    Every live agent has reported by then: its longest backoff and request, then one heartbeat or
    job progress interval, and one sweep interval for the sweep to see it.
    """
    interval = max(settings.heartbeat_interval_seconds, settings.job_progress_interval_seconds)
    return AGENT_LONGEST_BACKOFF_SECONDS + AGENT_LONGEST_REQUEST_SECONDS + interval + settings.sweep_interval_seconds


def heard_since(sweep: str, settings: Settings, now: datetime) -> datetime | None:
    """When the control plane could hear again, while that is within the hold; else None.

    The scheduler records it in the sweep's `sweep_ticks` row (so every worker and replica
    agrees) on its first run after it could not hear: after its database failed it, or when
    it starts after a gap in the sweep's ticks. A node or job last heard before that moment
    may be an agent still backing off from the outage, so it is judged only after the hold.
    """
    since = db.session.scalar(sa.select(SweepTick.heard_since).where(SweepTick.name == sweep))
    if since is None or now >= since + timedelta(seconds=hearing_hold_seconds(settings)):
        return None
    return since


def listening_since(settings: Settings, now: datetime) -> datetime | None:
    """The liveness hold's start while it lasts (heard_since), for readers to pass to status_of."""
    return heard_since(LIVENESS_SWEEP, settings, now)


def _transition(previous: str, new: str, cutoff: datetime, now: datetime, since: datetime | None = None) -> int:
    """Move leases from `previous` to `new` and audit each moved node, without a Python loop.

    PostgreSQL: one statement, `WITH moved AS (UPDATE … RETURNING node_id) INSERT … SELECT
    FROM moved`, so the events are exactly the rows this run changed. SQLite: INSERT … SELECT
    then the same UPDATE, inside one BEGIN IMMEDIATE transaction that no writer can enter.
    """
    matches = (_leases.c.status == previous, _leases.c.last_heartbeat_at <= cutoff)
    if since is not None:  # during a hold only nodes heard since the control plane came back
        matches = (*matches, _leases.c.last_heartbeat_at >= since)
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
    matches no row, so it changes nothing and audits nothing. Silence from before the control
    plane could hear again is held (`heard_since`): its own downtime is no node's outage.
    """
    now = now or utcnow()
    since = heard_since(LIVENESS_SWEEP, settings, now)
    offline_cutoff = now - timedelta(seconds=settings.node_offline_after_seconds)
    stale_cutoff = now - timedelta(seconds=settings.node_stale_after_seconds)
    offline = sum(_transition(previous, OFFLINE, offline_cutoff, now, since) for previous in (ONLINE, STALE))
    stale = _transition(ONLINE, STALE, stale_cutoff, now, since)
    db.session.commit()
    return {"stale": stale, "offline": offline}


def may_receive_work(node_id: str, settings: Settings, now: datetime | None = None) -> tuple[bool, str]:
    """L4: the one gate for handing work to a node — online, enabled, not draining (S3) and compatible."""
    row = db.session.execute(
        sa.select(Node.disabled, Node.draining, NodeLease.last_heartbeat_at, NodeLease.compatibility)
        .join(NodeLease, NodeLease.node_id == Node.id)
        .where(Node.id == node_id)
    ).one_or_none()
    if row is None:
        return False, "unknown node"
    if row.disabled:
        return False, "node is disabled"
    if row.draining:
        return False, "node is draining"
    now = now or utcnow()
    status, _ = status_of(row.last_heartbeat_at, now, settings, listening_since(settings, now))
    if status != ONLINE:
        return False, f"node is {status}"
    if row.compatibility != COMPATIBLE:
        return False, f"agent protocol is {row.compatibility or 'unknown'}"
    return True, "online, enabled, not draining and compatible"
