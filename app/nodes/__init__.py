"""The node lifecycle; this module reads nodes back and holds the operator's actions on them (I5, I6, L1).

The stages of a node's life are the modules beside it: `enrollment` (E1–E5), `publishing` and
`rate_limits` (A2, N4, L2), `compat` for the protocols its agent and worker speak (A1, W1),
`liveness` (L1–L4), `readiness` (R1), then what is kept of what it published, `retention` and
`telemetry_history` (N4, C3). No HTTP here: the API and the console call these modules.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from itertools import islice

import sqlalchemy as sa

from app import audit, tokens
from app.config import Settings
from app.errors import DomainError
from app.extensions import db
from app.models import Credential, Gpu, Node, NodeInventory, NodeLease, TelemetrySample
from app.models.telemetry import sample_dict
from app.nodes import liveness
from app.nodes.compat import compatibility, worker_compatibility
from app.timeutil import isoformat, utcnow


def get(node_id: str) -> Node:
    """The node with this id, or NODE_NOT_FOUND."""
    node = db.session.get(Node, node_id)
    if node is None:
        raise DomainError(
            "NODE_NOT_FOUND",
            f"No node has id {node_id!r}.",
            "List nodes with GET /api/v1/hardware/nodes.",
        )
    return node


def node_name(node: Node) -> str:
    """A node as a reason names it: its display name, with the hostname when that says more."""
    if node.display_name in (None, "", node.hostname):
        return node.hostname
    return f"{node.display_name} ({node.hostname})"


# P5: what the API and the console show of stored values, whatever a row holds — rows written before
# the inventory was declared field by field included (a 400-digit number, infinity, a lone
# surrogate, nesting 950 deep): bounded here, where every reader of a node passes, so neither the
# node page nor GET /api/v1/hardware/nodes can fail or emit anything but strict JSON.
MAX_SHOWN_DEPTH = 8
MAX_SHOWN_ITEMS = 1000
MAX_SHOWN_TEXT = 4000
MAX_SHOWN_INTEGER = 2**63


def printable(text: str) -> str:
    """Text that can be encoded: at most MAX_SHOWN_TEXT characters, a lone surrogate as U+FFFD."""
    text = text[:MAX_SHOWN_TEXT]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def shown(value: object, depth: int = 0) -> object:
    """A stored value as strict JSON can carry it; what cannot be shown is null (unknown, P3), never invented.

    Non-finite numbers and whole numbers beyond 2**63 become null, text is made encodable, and
    objects and lists deeper than MAX_SHOWN_DEPTH or longer than MAX_SHOWN_ITEMS are cut there.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -MAX_SHOWN_INTEGER <= value <= MAX_SHOWN_INTEGER else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        if depth >= MAX_SHOWN_DEPTH:
            return None
        return {printable(str(key)): shown(item, depth + 1) for key, item in islice(value.items(), MAX_SHOWN_ITEMS)}
    if isinstance(value, list | tuple):
        if depth >= MAX_SHOWN_DEPTH:
            return None
        return [shown(item, depth + 1) for item in islice(value, MAX_SHOWN_ITEMS)]
    return value


def _facts(stored: object) -> dict[str, object]:
    """An inventory's facts as an object; anything else an old row holds shows as no facts."""
    return stored if isinstance(stored, dict) else {}


def _latest_telemetry(node_ids: list[str]) -> dict[str, list[dict[str, object]]]:
    """The newest sample of each GPU of these nodes: one index probe per GPU, in one query."""
    if not node_ids:
        return {}
    newest = (
        sa.select(sa.func.max(TelemetrySample.sampled_at))
        .where(TelemetrySample.gpu_id == Gpu.id)
        .correlate(Gpu)
        .scalar_subquery()
    )
    rows = db.session.execute(
        sa.select(Gpu.node_id, Gpu.uuid, TelemetrySample)
        .join(TelemetrySample, sa.and_(TelemetrySample.gpu_id == Gpu.id, TelemetrySample.sampled_at == newest))
        .where(Gpu.node_id.in_(node_ids))
        .order_by(Gpu.node_id, Gpu.pci_bus_id, Gpu.uuid)
    )
    latest: dict[str, list[dict[str, object]]] = defaultdict(list)
    for node_id, gpu_uuid, sample in rows:
        latest[node_id].append(sample_dict(gpu_uuid, sample))
    return latest


def _shared_hostnames(among: set[str] | None = None) -> set[str]:
    """I4: hostnames held by more than one node ID (optionally only these; the column is indexed)."""
    query = sa.select(Node.hostname).group_by(Node.hostname).having(sa.func.count() > 1)
    if among is not None:
        query = query.where(Node.hostname.in_(among))
    return set(db.session.scalars(query))


def runtime_worker(lease: NodeLease | None) -> dict[str, object] | None:
    """W1: the runtime worker as last reported, why none answered, and its compatibility; None if never told."""
    if lease is None or (lease.runtime_worker is None and lease.runtime_worker_problem is None):
        return None
    reported = lease.runtime_worker if isinstance(lease.runtime_worker, dict) else None
    return shown(
        {
            "reported": reported,
            "problem": lease.runtime_worker_problem,
            "compatibility": (
                worker_compatibility(reported.get("protocol_version"), lease.worker_compatibility) if reported else None
            ),
        }
    )


def describe(node_ids: list[str] | None, settings: Settings) -> list[dict[str, object]]:
    """Nodes in the wire format, in a fixed number of queries however many there are."""
    query = (
        sa.select(Node, NodeLease, NodeInventory, Credential)
        .outerjoin(NodeLease, NodeLease.node_id == Node.id)
        .outerjoin(NodeInventory, NodeInventory.node_id == Node.id)
        .outerjoin(Credential, sa.and_(Credential.node_id == Node.id, Credential.revoked_at.is_(None)))
        .order_by(Node.display_name, Node.id)
    )
    if node_ids is not None:
        query = query.where(Node.id.in_(node_ids))
    rows = db.session.execute(query).all()
    ids = [node.id for node, *_ in rows]
    gpus: dict[str, list[Gpu]] = defaultdict(list)
    if ids:
        for gpu in db.session.scalars(sa.select(Gpu).where(Gpu.node_id.in_(ids)).order_by(Gpu.pci_bus_id, Gpu.uuid)):
            gpus[gpu.node_id].append(gpu)
    telemetry = _latest_telemetry(ids)
    shared = _shared_hostnames({node.hostname for node, *_ in rows})
    now = utcnow()
    since = liveness.listening_since(settings, now)
    described = []
    for node, lease, inventory, credential in rows:
        status, age = liveness.status_of(lease.last_heartbeat_at if lease else None, now, settings, since)
        described.append(
            shown(
                {
                    "id": node.id,
                    "display_name": node.display_name,
                    "hostname": node.hostname,
                    "status": status,
                    "disabled": node.disabled,
                    "draining": node.draining,
                    "draining_since": isoformat(node.draining_at),
                    "last_heartbeat_at": isoformat(lease.last_heartbeat_at if lease else None),
                    "heartbeat_age_seconds": None if age is None else round(age, 3),
                    "agent_version": lease.agent_version if lease else None,
                    "protocol_version": lease.protocol_version if lease else None,
                    "compatibility": (
                        compatibility(lease.protocol_version, lease.compatibility)
                        if lease and lease.compatibility
                        else None
                    ),
                    "health": (
                        {"status": lease.health_status, "detail": lease.health_detail}
                        if lease and lease.health_status
                        else None
                    ),
                    "inventory": (
                        {**_facts(inventory.facts), "received_at": isoformat(inventory.received_at)}
                        if inventory
                        else None
                    ),
                    "gpus": [gpu.to_dict() for gpu in gpus[node.id]],
                    # J2: the job types the agent advertised in its last inventory.
                    "capabilities": list(lease.capabilities or []) if lease else [],
                    "runtime_worker": runtime_worker(lease),
                    "telemetry": telemetry.get(node.id, []),
                    "eligibility": {
                        "production_eligible": node.production_eligible,
                        "lab_eligible": node.lab_eligible,
                        "benchmark_eligible": node.benchmark_eligible,
                    },
                    "role": node.role,
                    "labels": node.labels or {},
                    "credential": credential.to_dict() if credential else None,
                    # I4: another node ID with this hostname suggests a non-durable state volume.
                    "suspected_duplicate_hostname": node.hostname in shared,
                    "enrolled_at": isoformat(node.enrolled_at),
                }
            )
        )
    return described


@dataclass(frozen=True)
class NodeSummary:
    """One row of the console's node list (C2); the console puts it in words (app/console/formatting.py)."""

    id: str
    display_name: str
    hostname: str
    status: str
    heartbeat_age_seconds: float | None
    last_heartbeat_at: datetime | None
    disabled: bool
    draining: bool
    agent_version: str | None
    protocol_version: int | None
    compatibility: str | None
    gpu_models: dict[str, int]
    production_eligible: bool
    lab_eligible: bool
    benchmark_eligible: bool
    suspected_duplicate_hostname: bool
    # R1: the agent's own health from its last heartbeat (ok|degraded|failing), None before one.
    health_status: str | None = None
    health_detail: str | None = None

    @property
    def gpu_count(self) -> int:
        """How many present GPUs the node reported."""
        return sum(self.gpu_models.values())


def summaries(settings: Settings) -> list[NodeSummary]:
    """Every node for the list page in three queries, without inventory documents or telemetry."""
    rows = db.session.execute(
        sa.select(
            Node.id,
            Node.display_name,
            Node.hostname,
            Node.disabled,
            Node.draining,
            Node.production_eligible,
            Node.lab_eligible,
            Node.benchmark_eligible,
            NodeLease.last_heartbeat_at,
            NodeLease.agent_version,
            NodeLease.protocol_version,
            NodeLease.compatibility,
            NodeLease.health_status,
            NodeLease.health_detail,
        )
        .outerjoin(NodeLease, NodeLease.node_id == Node.id)
        .order_by(Node.display_name, Node.id)
    ).all()
    models: dict[str, dict[str, int]] = defaultdict(dict)
    for node_id, name, count in db.session.execute(
        sa.select(Gpu.node_id, Gpu.name, sa.func.count()).where(Gpu.present.is_(True)).group_by(Gpu.node_id, Gpu.name)
    ):
        models[node_id][printable(name) if name else "unknown model"] = count
    shared = _shared_hostnames()
    now = utcnow()
    since = liveness.listening_since(settings, now)
    result = []
    for row in rows:
        status, age = liveness.status_of(row.last_heartbeat_at, now, settings, since)
        result.append(
            NodeSummary(
                id=row.id,
                display_name=printable(row.display_name),
                hostname=printable(row.hostname),
                status=status,
                heartbeat_age_seconds=age,
                last_heartbeat_at=row.last_heartbeat_at,
                disabled=row.disabled,
                draining=row.draining,
                agent_version=row.agent_version,
                protocol_version=row.protocol_version,
                compatibility=row.compatibility,
                gpu_models=models.get(row.id, {}),
                production_eligible=row.production_eligible,
                lab_eligible=row.lab_eligible,
                benchmark_eligible=row.benchmark_eligible,
                suspected_duplicate_hostname=row.hostname in shared,
                health_status=row.health_status,
                health_detail=printable(row.health_detail) if row.health_detail else None,
            )
        )
    return result


def credentials(node_id: str) -> list[Credential]:
    """Every credential this node has held, newest first (metadata only)."""
    return list(
        db.session.scalars(sa.select(Credential).where(Credential.node_id == node_id).order_by(Credential.id.desc()))
    )


def _lock(node_id: str) -> Node:
    """The node, locked until commit (PostgreSQL), so two credential changes queue up (I5)."""
    node = db.session.scalar(sa.select(Node).where(Node.id == node_id).with_for_update())
    if node is None:
        get(node_id)  # raises NODE_NOT_FOUND
    return node


def _active_credential(node_id: str) -> Credential | None:
    return db.session.scalar(
        sa.select(Credential).where(Credential.node_id == node_id, Credential.revoked_at.is_(None))
    )


def rotate_credential(node_id: str, actor: str = audit.OPERATOR) -> tuple[Credential, str]:
    """I5: replace the active credential; the new secret is returned once."""
    _lock(node_id)
    now = utcnow()
    old = _active_credential(node_id)
    if old is not None:
        old.revoked_at = now
        old.revoked_reason = "rotated"
        # The partial unique index allows one active credential: retire the old one first.
        db.session.flush()
    issued = tokens.issue(tokens.NODE_CREDENTIAL_PREFIX)
    new = Credential(node_id=node_id, token_hash=issued.digest, prefix=issued.visible_prefix, created_at=now)
    db.session.add(new)
    db.session.flush()
    audit.record(
        actor,
        "credential.rotated",
        node_id,
        old_credential_id=old.id if old else None,
        new_credential_id=new.id,
        new_credential_prefix=new.prefix,
    )
    db.session.commit()
    return new, issued.secret


def revoke_credential(node_id: str, actor: str = audit.OPERATOR) -> Credential:
    """I5: leave the node with no active credential."""
    _lock(node_id)
    credential = _active_credential(node_id)
    if credential is None:
        db.session.rollback()
        raise DomainError(
            "NO_ACTIVE_CREDENTIAL",
            f"Node {node_id} has no active credential.",
            "Nothing to revoke. To let the node back in, mint an enrolment token and re-enrol it.",
        )
    credential.revoked_at = utcnow()
    credential.revoked_reason = "revoked"
    audit.record(actor, "credential.revoked", node_id, credential_id=credential.id)
    db.session.commit()
    return credential


def set_draining(node_id: str, draining: bool, actor: str = audit.OPERATOR) -> Node:
    """S3: drain (the running job finishes; no new job or deployment) or undrain; audited on change."""
    node = get(node_id)
    if node.draining != draining:
        node.draining = draining
        node.draining_at = utcnow() if draining else None
        audit.record(actor, "node.draining" if draining else "node.undrained", node_id)
    db.session.commit()
    return node


# S3: the flags an operator sets at will; production_eligible is set through acceptance (V1) only.
OPERATOR_FLAGS = ("lab_eligible", "benchmark_eligible")


def set_eligibility(node_id: str, flags: dict[str, bool], actor: str = audit.OPERATOR) -> Node:
    """S3: set lab_eligible and/or benchmark_eligible (scheduler metadata, no runtime is started);
    audited once with what changed."""
    node = get(node_id)
    changed = {
        flag: {"old": getattr(node, flag), "new": value}
        for flag, value in flags.items()
        if getattr(node, flag) != value
    }
    for flag, change in changed.items():
        setattr(node, flag, change["new"])
    if changed:
        audit.record(actor, "node.eligibility", node_id, **changed)
    db.session.commit()
    return node


def refuse_if_draining(node: Node) -> None:
    """S3: a draining node takes no new job or deployment: 409 NODE_DRAINING, saying what to do."""
    if node.draining:
        raise DomainError(
            "NODE_DRAINING",
            f"Node {node.display_name} is draining: it finishes what runs and takes no new job or deployment.",
            "Choose another node, or undrain this one (POST /api/v1/admin/nodes/{id}/undrain, or Undrain on its page).",
            field="node_id",
        )


def set_disabled(node_id: str, disabled: bool, actor: str = audit.OPERATOR) -> Node:
    """I6: disable (ineligible, publications refused) or enable a node; audited on change."""
    node = get(node_id)
    if node.disabled != disabled:
        node.disabled = disabled
        node.disabled_at = utcnow() if disabled else None
        audit.record(actor, "node.disabled" if disabled else "node.enabled", node_id)
    db.session.commit()
    return node
