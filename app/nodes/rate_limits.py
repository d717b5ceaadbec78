"""Per-node publication rates (A2, L2, P5): a node that publishes faster than its interval allows
gets 429 NODE_RATE_LIMITED with Retry-After, and nothing it sent is stored.

The rule, for heartbeats and inventories alike: a publication is accepted when at least half the
heartbeat interval has passed since that node's last ACCEPTED one of the same kind. A good agent
beats once per interval (drift-free, so even its catch-up after a slow reply stays about an
interval apart), a request that failed was rolled back (nothing committed, so a backoff retry
never counts), and a node can publish at most twice its interval's worth: the 1,457 beats in
5 s of issue 15 become 10. One exception: the first heartbeat after an accepted inventory is
accepted however soon, because an agent that (re)starts publishes inventory then heartbeat, and
a restart may come moments after its last beat; inventories being limited too, this at most
doubles a hostile node's beats again. The state is the row itself
(`node_leases.last_heartbeat_at`, `node_inventories.received_at`), so every gunicorn worker and
every replica sees the same limit; the heartbeat's check is one more condition on the UPDATE it
runs anyway, and the reason (and the inventory's time) is read only when that matches nothing.

The limit is on unless MODELFORGE_NODE_RATE_LIMIT is off (app.config; on by default).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from app.config import current_settings
from app.errors import DomainError
from app.models import NodeInventory

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

    def __init__(self, kind: str, retry_after: int) -> None:
        interval = current_settings().heartbeat_interval_seconds
        super().__init__(
            "NODE_RATE_LIMITED",
            f"This {kind} came less than {SPACING * interval:g}s after the node's last accepted one; "
            "it was not stored.",
            f"Wait {retry_after}s (Retry-After) and send it again; an agent publishes once per "
            f"heartbeat interval ({interval}s).",
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
