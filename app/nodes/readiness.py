"""Is this exact node ready? Connection, inventory, protocol, health, telemetry (R1).

Each check is pass / pending / fail with a next step a homelab admin can act on. Connecting
is never enough on its own: every check must pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

import sqlalchemy as sa

from app import rules
from app.config import Settings
from app.extensions import db
from app.models import Enrollment, EnrollmentState, Gpu, Node, NodeInventory, NodeLease, TelemetrySample
from app.nodes import liveness
from app.nodes.compat import COMPATIBLE, compatibility
from app.timeutil import isoformat, utcnow

PASS, PENDING, FAIL = "pass", "pending", "fail"
# The agent re-sends inventory at least hourly; two missed hours means it stopped.
INVENTORY_MAX_AGE_SECONDS = 2 * 3600
LOGS_HINT = "check `docker compose logs node-agent` on the node"


@dataclass
class Check:
    """One readiness check."""

    name: str
    status: str
    detail: str
    next_step: str


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max((now - moment).total_seconds(), 0.0)


def _connection(node: Node, lease: NodeLease | None, now: datetime, settings: Settings) -> Check:
    since = liveness.listening_since(settings, now)
    status, age = liveness.status_of(lease.last_heartbeat_at if lease else None, now, settings, since)
    if node.disabled:
        return Check("connection", FAIL, "The node is disabled; its publications are refused.", "Enable the node.")
    if status == liveness.PENDING:
        return Check(
            "connection",
            PENDING,
            "No heartbeat yet.",
            f"{LOGS_HINT} for `ConnectError` and check that MODELFORGE_AGENT_CONTROL_PLANE_URL is reachable "
            "from the node.",
        )
    if status == liveness.ONLINE:
        return Check("connection", PASS, f"Last heartbeat {age:.0f}s ago.", "None.")
    return Check(
        "connection",
        FAIL,
        f"The node is {status}: last heartbeat {age:.0f}s ago.",
        f"Check that the agent container is running and {LOGS_HINT} for the failing request.",
    )


def _inventory(inventory: NodeInventory | None, now: datetime) -> Check:
    if inventory is None:
        return Check(
            "inventory",
            PENDING,
            "No inventory received yet.",
            f"The agent sends it right after enrolling; {LOGS_HINT} for `/api/v1/agent/inventory`.",
        )
    age = _age(inventory.received_at, now)
    if age > INVENTORY_MAX_AGE_SECONDS:
        return Check(
            "inventory",
            FAIL,
            f"The last inventory is {age / 3600:.1f} h old.",
            f"The agent re-sends it at least hourly; {LOGS_HINT}.",
        )
    return Check("inventory", PASS, f"Inventory received {age:.0f}s ago.", "None.")


def _protocol(lease: NodeLease | None) -> Check:
    if lease is None or lease.compatibility is None:
        return Check("protocol", PENDING, "The agent has not reported its protocol yet.", "Wait for the agent.")
    if lease.compatibility == COMPATIBLE:
        return Check(
            "protocol", PASS, f"Agent {lease.agent_version} speaks protocol {lease.protocol_version}.", "None."
        )
    answer = compatibility(lease.protocol_version, lease.compatibility)
    return Check("protocol", FAIL, f"Protocol answer {answer['answer']}.", str(answer["action"]))


def _directory_fixes(inventory: NodeInventory | None) -> list[str]:
    """R1: for each data directory the agent cannot use, the fix: create it, or point its variable
    elsewhere. Read from the inventory's storage facts (`problem`; an older agent's `unknown_reason`)."""
    facts = inventory.facts if inventory is not None and isinstance(inventory.facts, dict) else {}
    storage = facts.get("storage")
    fixes = []
    for name, variable in rules.AGENT_DATA_DIR_VARIABLES.items():
        seen = storage.get(name) if isinstance(storage, dict) else None
        if not isinstance(seen, dict) or not (seen.get("problem") or seen.get("unknown_reason")):
            continue
        path = seen.get("path")
        fixes.append(
            f"create the {name} directory (`mkdir -p {path}`) writable by the agent's user, or set {variable} "
            "to one that is"
            if isinstance(path, str) and path
            else f"set {variable} to a directory the agent can write to"
        )
    return fixes


def _health(lease: NodeLease | None, inventory: NodeInventory | None, connection: Check) -> Check:
    if lease is None or lease.health_status is None:
        return Check("agent_health", PENDING, "No health report yet.", "Wait for the first heartbeat.")
    if connection.status == FAIL:
        # P3: a stopped agent's last report is history, not its health now.
        return Check(
            "agent_health",
            PENDING,
            f"Not current: the agent last reported {lease.health_status} "
            f"({lease.health_detail or 'no detail'}) with its last heartbeat.",
            "Fix the connection first; its next heartbeat reports health again.",
        )
    if lease.health_status == "ok":
        return Check("agent_health", PASS, lease.health_detail or "ok", "None.")
    preflight = "`python3 -m modelforge_node_agent --preflight` checks the NVIDIA readings and every data directory"
    fixes = _directory_fixes(inventory)
    if fixes:
        # A bare-metal agent left at the /data/* defaults: say which directory, not just "run a check".
        fixed = "; ".join(fixes)
        next_step = f"{fixed[0].upper()}{fixed[1:]}; then restart the agent ({preflight} first)."
    else:
        next_step = f"Run {preflight} on the node; check nvidia-smi for a failing reading."
    return Check(
        "agent_health",
        FAIL,
        f"The agent reports {lease.health_status}: {lease.health_detail or 'no detail'}.",
        next_step,
    )


def _telemetry(gpu_ids: list[int], now: datetime, settings: Settings, connection: Check) -> Check | None:
    if not gpu_ids:
        return None  # R1: telemetry age is checked for GPU nodes only
    newest = db.session.scalar(
        sa.select(sa.func.max(TelemetrySample.sampled_at)).where(TelemetrySample.gpu_id.in_(gpu_ids))
    )
    if newest is None:
        return Check(
            "telemetry",
            PENDING,
            "No GPU telemetry yet.",
            "The agent sends it with each heartbeat; check MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia and the "
            "NVIDIA device reservation.",
        )
    age = _age(newest, now)
    if age > settings.node_stale_after_seconds and connection.status == FAIL:
        # Old samples from a node that stopped sending heartbeats say nothing of its driver.
        return Check(
            "telemetry",
            FAIL,
            f"No current GPU telemetry: the newest sample is {age:.0f}s old, sent with the last heartbeat.",
            "Fix the connection first; telemetry comes with every heartbeat.",
        )
    if age > settings.node_stale_after_seconds:
        return Check(
            "telemetry",
            FAIL,
            f"The newest GPU sample is {age:.0f}s old.",
            "Run `nvidia-smi` on the node; if it hangs or errors, the driver needs attention.",
        )
    return Check("telemetry", PASS, f"Newest GPU sample {age:.0f}s old.", "None.")


def for_node(node_id: str, settings: Settings) -> dict[str, object] | None:
    """Readiness of one node, or None if there is no such node."""
    node = db.session.get(Node, node_id)
    if node is None:
        return None
    now = utcnow()
    lease = db.session.get(NodeLease, node_id)
    gpu_ids = list(db.session.scalars(sa.select(Gpu.id).where(Gpu.node_id == node_id, Gpu.present.is_(True))))
    inventory = db.session.get(NodeInventory, node_id)
    connection = _connection(node, lease, now, settings)
    checks = [
        connection,
        _inventory(inventory, now),
        _protocol(lease),
        _health(lease, inventory, connection),
    ]
    telemetry = _telemetry(gpu_ids, now, settings, connection)
    if telemetry is not None:
        checks.append(telemetry)
    return {
        "node_id": node_id,
        "ready": all(check.status == PASS for check in checks),
        "checked_at": isoformat(now),
        "checks": [asdict(check) for check in checks],
    }


def for_enrollment(enrollment: Enrollment, settings: Settings) -> dict[str, object]:
    """Readiness of the exact node that consumed this enrolment (R1, C4)."""
    if enrollment.state == EnrollmentState.CONSUMED and enrollment.node_id:
        return {"enrollment_id": enrollment.id, **for_node(enrollment.node_id, settings)}
    now = utcnow()
    expired = enrollment.state == EnrollmentState.EXPIRED or (
        enrollment.state == EnrollmentState.PENDING and enrollment.expires_at <= now
    )
    if expired or enrollment.state == EnrollmentState.REVOKED:
        state = "expired" if expired else "revoked"
        check = Check(
            "connection", FAIL, f"The token was {state} before any node used it.", "Mint a new token and start again."
        )
    else:
        check = Check(
            "connection",
            PENDING,
            f"No node has used this token yet (it expires at {isoformat(enrollment.expires_at)}).",
            f"Start the agent on the node with the generated settings, then {LOGS_HINT} for `enrolled as node`.",
        )
    return {
        "enrollment_id": enrollment.id,
        "node_id": None,
        "ready": False,
        "checked_at": isoformat(now),
        "checks": [asdict(check)],
    }


def token_dead(readiness: dict[str, object]) -> bool:
    """R2: whether a `for_enrollment` answer says no node used the token and none ever can.

    That is its one connection check failing before any node used the token (expired or revoked):
    nothing the wizard waits for can happen any more, so it stops polling.
    """
    checks = readiness["checks"]
    return readiness["node_id"] is None and bool(checks) and checks[0]["status"] == FAIL
