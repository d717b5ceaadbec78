"""Per-node publication rates (A2, L2, P5): a node that publishes faster than its interval allows
gets 429 NODE_RATE_LIMITED with Retry-After, and nothing it sent is stored.

The rule, for heartbeats and inventories alike: a publication is accepted when at least half the
heartbeat interval has passed since that node's last ACCEPTED one of the same kind. A good agent
beats once per interval, each beat sent one interval after the last was sent (so even after a
slow reply the beats stay about an interval apart), a request that failed was rolled back
(nothing committed, so a backoff retry never counts), and a node can publish at most twice its
interval's worth: the 1,457 beats in 5 s of issue 15 become 10. One exception: the first
heartbeat after an accepted inventory is accepted however soon, because an agent that (re)starts
publishes inventory then heartbeat, and a restart may come moments after its last beat;
inventories being limited too, this at most doubles a hostile node's beats again. The state is the row itself
(`node_leases.last_heartbeat_at`, `node_inventories.received_at`), so every gunicorn worker and
every replica sees the same limit; the heartbeat's check is one more condition on the UPDATE it
runs anyway, and the reason (and the inventory's time) is read only when that matches nothing.

Job claims and progress reports are bounded the same way (issue 22 item 6: 1,500 progress writes in
41 s, all 200), each by the cadence the agent is told: a claim comes at most once per heartbeat
turn, so one is accepted when it is the node's first contact since its last accepted heartbeat, or
half a heartbeat interval after its last claim (`node_leases.last_seen_at`, which the heartbeat sets
to its own time and a claim to the claim's); a progress report renews its job's lease, so one is
accepted when half the progress interval the claim named has passed since the lease was last
renewed (`jobs.lease_expires_at` minus the lease). The agent waits what Retry-After says and goes
on with the job (agent/modelforge_node_agent.py); a complete or fail report is never limited.

Where the agent and the server measure from (issue 22 item 16): the server measures from the
moment it accepted the last publication of the kind, the agent schedules each heartbeat one
interval after it sent the previous one (not after its publish turn began, which an inventory or
a worker probe can delay by seconds), so a slow first start no longer shortens the gap.

The limit is on unless MODELFORGE_NODE_RATE_LIMIT is off (app.config; on by default).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from app.config import Settings, current_settings
from app.errors import DomainError
from app.models import Job, JobState, NodeInventory, NodeLease

# The fraction of the heartbeat interval that must pass between two accepted publications.
SPACING = 0.5

_inventories = NodeInventory.__table__
# Claim the inventory slot: matches only when the last accepted inventory is old enough, and, on
# PostgreSQL, holds the row so a concurrent inventory from the same node waits and then matches
# nothing. The inventory itself rewrites received_at with its own time.
_CLAIM_INVENTORY = (
    _inventories.update()
    .where(
        _inventories.c.node_id == sa.bindparam("inventory_node_id"),
        _inventories.c.received_at <= sa.bindparam("accept_before"),
    )
    .values(received_at=sa.bindparam("now"))
)
_LAST_INVENTORY = sa.select(_inventories.c.received_at).where(
    _inventories.c.node_id == sa.bindparam("inventory_node_id")
)
_INVENTORY_SINCE = sa.select(sa.literal(1)).where(
    _inventories.c.node_id == sa.bindparam("inventory_node_id"),
    _inventories.c.received_at > sa.bindparam("since"),
)


class NodeRateLimited(DomainError):
    """A publication sent sooner than the node's interval allows; `retry_after` is whole seconds."""

    def __init__(self, kind: str, retry_after: int, cadence: str = "heartbeat", interval: float | None = None) -> None:
        if interval is None:
            interval = current_settings().heartbeat_interval_seconds
        super().__init__(
            "NODE_RATE_LIMITED",
            f"This {kind} came less than {SPACING * interval:g}s after the node's last accepted one; "
            "it was not stored.",
            f"Wait {retry_after}s (Retry-After) and send it again; an agent sends one per "
            f"{cadence} interval ({interval:g}s).",
            retry_after_seconds=retry_after,
        )
        self.retry_after = retry_after


# With the limit off (MODELFORGE_NODE_RATE_LIMIT), every earlier publication is old enough.
_UNLIMITED = datetime(9999, 1, 1, tzinfo=UTC)


def spacing() -> timedelta:
    """The least time between two accepted publications of one kind from one node."""
    return timedelta(seconds=current_settings().heartbeat_interval_seconds * SPACING)


def accept_before(now: datetime) -> datetime:
    """A publication is accepted when the node's last accepted one is at or before this moment."""
    if not current_settings().node_rate_limit:
        return _UNLIMITED
    return now - spacing()


def refusal(kind: str, last: datetime, now: datetime) -> NodeRateLimited:
    """The 429 for a publication that came too soon after `last`: retry when the spacing has passed."""
    wait = (last + spacing() - now).total_seconds()
    return NodeRateLimited(kind, max(1, math.ceil(wait)))


def admit_inventory(connection: sa.Connection, node_id: str, now: datetime) -> None:
    """Raise NodeRateLimited unless this node's last accepted inventory is old enough (or none)."""
    if not current_settings().node_rate_limit:
        return
    claimed = connection.execute(
        _CLAIM_INVENTORY, {"inventory_node_id": node_id, "accept_before": accept_before(now), "now": now}
    )
    if claimed.rowcount:
        return
    last = connection.execute(_LAST_INVENTORY, {"inventory_node_id": node_id}).scalar()
    if last is not None and last > accept_before(now):
        raise refusal("inventory", last, now)


def inventory_since(connection: sa.Connection, node_id: str, moment: datetime) -> bool:
    """Whether the node had an inventory accepted after `moment` (its last accepted heartbeat)."""
    found = connection.execute(_INVENTORY_SINCE, {"inventory_node_id": node_id, "since": moment}).first()
    return found is not None


_leases = NodeLease.__table__
# A claim's slot: free when the node's last contact was its accepted heartbeat (the heartbeat writes
# both columns with one time) or was long enough ago; a claim takes it by stamping its own time.
_CLAIM_SLOT = (
    _leases.update()
    .where(
        _leases.c.node_id == sa.bindparam("lease_node_id"),
        sa.or_(
            _leases.c.last_seen_at.is_(None),
            _leases.c.last_seen_at == _leases.c.last_heartbeat_at,
            _leases.c.last_seen_at <= sa.bindparam("accept_before"),
        ),
    )
    .values(last_seen_at=sa.bindparam("now"))
)
_LAST_CONTACT = sa.select(_leases.c.last_seen_at).where(_leases.c.node_id == sa.bindparam("lease_node_id"))


def admit_claim(connection: sa.Connection, node_id: str, now: datetime) -> None:
    """Raise NodeRateLimited for a claim too soon after this node's last one with no heartbeat between."""
    if not current_settings().node_rate_limit:
        return
    params = {"lease_node_id": node_id, "accept_before": accept_before(now), "now": now}
    if connection.execute(_CLAIM_SLOT, params).rowcount:
        return
    last = connection.execute(_LAST_CONTACT, {"lease_node_id": node_id}).scalar()
    if last is not None and last > params["accept_before"]:
        raise refusal("job claim", last, now)


_jobs = Job.__table__
_running_attempt = (
    _jobs.c.id == sa.bindparam("job_id"),
    _jobs.c.node_id == sa.bindparam("job_node_id"),
    _jobs.c.attempt == sa.bindparam("job_attempt"),
    _jobs.c.state == JobState.RUNNING,
)
# A progress report's slot: the lease was last renewed (claim or progress) at least the spacing ago.
# Only the reporting attempt's row matches, so a fenced-out report takes nothing (its 409 follows).
_PROGRESS_SLOT = (
    _jobs.update()
    .where(*_running_attempt, _jobs.c.lease_expires_at <= sa.bindparam("renewed_before"))
    .values(lease_expires_at=sa.bindparam("lease"))
)
_LEASE_OF = sa.select(_jobs.c.lease_expires_at).where(*_running_attempt)


def admit_progress(
    connection: sa.Connection, job_id: str, node_id: str, attempt: int, now: datetime, settings: Settings
) -> None:
    """Raise NodeRateLimited for a progress report sooner than half the progress interval after the
    attempt's lease was last renewed; a report the fence refuses is left to the fence (409)."""
    if not settings.node_rate_limit:
        return
    interval = settings.job_progress_interval_seconds
    lease = timedelta(seconds=settings.job_lease_seconds)
    renewed_before = now + lease - timedelta(seconds=interval * SPACING)
    params = {"job_id": job_id, "job_node_id": node_id, "job_attempt": attempt}
    if connection.execute(_PROGRESS_SLOT, {**params, "renewed_before": renewed_before, "lease": now + lease}).rowcount:
        return
    expires = connection.execute(_LEASE_OF, params).scalar()
    if expires is not None and expires > renewed_before:
        wait = (expires - renewed_before).total_seconds()
        raise NodeRateLimited("progress report", max(1, math.ceil(wait)), "progress", interval)
