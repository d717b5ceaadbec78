"""J1: storage roots — where on a node artifacts may live, and what the agent observes of them."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from app import audit, rules
from app.errors import DomainError
from app.extensions import db
from app.models import Artifact, Job, NodeInventory, NodeLease, StorageRoot
from app.models.jobs import TERMINAL_STATES
from app.nodes import get as get_node
from app.timeutil import isoformat, utcnow

# J5: each root's use and the quarantine's, as the heartbeat last reported them, kept in the node's
# inventory facts under this key (a JSON column: no column, no migration of its own). The agent's
# inventory never sets it (app.api.bodies.InventoryFacts drops what it does not declare), and a new
# inventory keeps it (app.nodes.publishing.record_inventory).
USAGE_FACT = "storage_usage"


@dataclass(frozen=True)
class RootRequest:
    """What an operator registers."""

    name: str
    host_path: str
    container_path: str
    min_free_bytes: int


@dataclass(frozen=True)
class Observation:
    """What the agent saw of one root (the heartbeat's `storage_roots` items, field for field)."""

    id: str
    exists: bool
    writable: bool
    free_bytes: int | None
    total_bytes: int | None
    observed_at: datetime
    usage: dict[str, object] | None = None  # J5: app.api.bodies.RootUsage, when the agent measured it
    problem: str | None = None  # J1: why the agent cannot use the root, in its words


@dataclass(frozen=True)
class Registered:
    """A root just registered, and the artifact directory its container path was checked
    against (None: the node had not reported one, so the agent checks it when told of the root)."""

    root: StorageRoot
    checked_against: str | None


def _roots_changed(node_id: str) -> None:
    # The heartbeat reply hands this counter to the agent as an etag: it refetches the list (J1).
    db.session.execute(
        sa.update(NodeLease)
        .where(NodeLease.node_id == node_id)
        .values(storage_roots_version=NodeLease.storage_roots_version + 1)
    )


# N4: the inventory's `storage` facts name each data directory the agent uses; this one holds the roots.
ARTIFACT_DIR_FACT = "artifacts"


def reported_artifact_dir(node_id: str) -> str | None:
    """The artifact directory the node's agent last reported in its inventory, or None (no
    inventory yet, or one without it)."""
    facts = db.session.scalar(sa.select(NodeInventory.facts).where(NodeInventory.node_id == node_id))
    stored = facts.get("storage") if isinstance(facts, dict) else None
    artifacts = stored.get(ARTIFACT_DIR_FACT) if isinstance(stored, dict) else None
    path = artifacts.get("path") if isinstance(artifacts, dict) else None
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    return posixpath.normpath(path)


def container_path_problem(container_path: str, artifact_dir: str) -> str | None:
    """J1: why a container path cannot be a root of an agent with this artifact directory, or None.

    The rule the agent applies too (modelforge_node_agent.root_problem): an absolute path without
    empty, . or .. parts, the artifact directory itself or below it, compared as written: the
    agent never follows a symlink on the way, so what the path says is where the bytes go."""
    if problem := rules.absolute_path_problem(container_path):
        return problem
    base = posixpath.normpath(artifact_dir)
    path = container_path.rstrip("/") or "/"
    if posixpath.commonpath([path, base]) != base:
        return f"{path} is outside the node's artifact directory {base}: the agent reads and writes only below it."
    return None


def _refuse_outside(node_id: str, request: RootRequest) -> str | None:
    """The node's artifact directory once the container path is checked against it; None when the
    node never reported one. A path outside it is STORAGE_ROOT_OUTSIDE_ARTIFACT_DIR (400)."""
    artifact_dir = reported_artifact_dir(node_id)
    if artifact_dir is None:
        return None
    problem = container_path_problem(request.container_path, artifact_dir)
    if problem is not None:
        below = posixpath.join(artifact_dir, request.name)
        raise DomainError(
            "STORAGE_ROOT_OUTSIDE_ARTIFACT_DIR",
            problem,
            f"Write a container path below {artifact_dir}, e.g. {below}; if the files must stay where they are, "
            f"mount that directory at {below} in the agent's container and register that path.",
            field="container_path",
        )
    return artifact_dir


def create(node_id: str, request: RootRequest) -> Registered:
    """Register a root on a node; the name is unique per node, and the container path lies below the
    artifact directory the node reported (when it has reported one)."""
    get_node(node_id)
    checked_against = _refuse_outside(node_id, request)
    root = StorageRoot(node_id=node_id, **request.__dict__)
    db.session.add(root)
    try:
        db.session.flush()
    except IntegrityError:
        db.session.rollback()
        raise DomainError(
            "STORAGE_ROOT_EXISTS",
            f"This node already has a storage root named {request.name!r}.",
            "Pick another name, or delete the existing root first.",
        ) from None
    _roots_changed(node_id)
    audit.record(
        audit.OPERATOR,
        "storage_root.created",
        node_id,
        storage_root_id=root.id,
        name=root.name,
        host_path=root.host_path,
        container_path=root.container_path,
        min_free_bytes=root.min_free_bytes,
        checked_against=checked_against,
    )
    db.session.commit()
    return Registered(root, checked_against)


def for_node(node_id: str) -> list[StorageRoot]:
    """A node's roots by name."""
    return list(
        db.session.scalars(sa.select(StorageRoot).where(StorageRoot.node_id == node_id).order_by(StorageRoot.name))
    )


def get(root_id: str) -> StorageRoot:
    """The root with this id, or STORAGE_ROOT_NOT_FOUND."""
    root = db.session.get(StorageRoot, root_id)
    if root is None:
        raise DomainError(
            "STORAGE_ROOT_NOT_FOUND",
            f"No storage root has id {root_id!r}.",
            "List a node's roots with GET /api/v1/admin/nodes/{id}/storage-roots.",
        )
    return root


def delete(root_id: str) -> None:
    """Forget a root (its files stay on the node); refused while a job uses it."""
    root = get(root_id)
    # W2: a runtime job uses the root too, through the artifact it reads a model from.
    on_root = sa.select(Artifact.id).where(Artifact.storage_root_id == root_id)
    in_use = db.session.scalar(
        sa.select(sa.func.count())
        .select_from(Job)
        .where(
            sa.or_(Job.storage_root_id == root_id, Job.artifact_id.in_(on_root)),
            Job.state.not_in(list(TERMINAL_STATES)),
        )
    )
    if in_use:
        raise DomainError(
            "STORAGE_ROOT_IN_USE",
            f"{in_use} queued or running job(s) use this storage root.",
            "Cancel them or wait for them to finish, then delete the root.",
        )
    # Finished jobs keep their history; they simply no longer point at the root.
    db.session.execute(sa.update(Job).where(Job.storage_root_id == root_id).values(storage_root_id=None))
    node_id = root.node_id
    db.session.delete(root)
    _roots_changed(node_id)
    audit.record(audit.OPERATOR, "storage_root.deleted", node_id, storage_root_id=root_id, name=root.name)
    db.session.commit()


def agent_view(node_id: str) -> list[dict[str, object]]:
    """The roots as the agent is told them: where to look and how much room to keep."""
    return [
        {"id": root.id, "name": root.name, "container_path": root.container_path, "min_free_bytes": root.min_free_bytes}
        for root in for_node(node_id)
    ]


def record_observations(node_id: str, observations: list[Observation]) -> None:
    """J1: store what the agent saw of its roots (ids of other nodes' roots are ignored)."""
    for seen in observations:
        db.session.execute(
            sa.update(StorageRoot)
            .where(StorageRoot.id == seen.id, StorageRoot.node_id == node_id)
            .values(
                observed_exists=seen.exists,
                observed_writable=seen.writable,
                observed_free_bytes=seen.free_bytes,
                observed_total_bytes=seen.total_bytes,
                observed_at=seen.observed_at,
                observed_problem=seen.problem,
            )
        )


def unusable_reason(root: StorageRoot) -> str | None:
    """J1: why the agent's last report says the root cannot take a download, or None. A root it has
    not reported on yet is not refused here: the agent checks it again when it claims the job."""
    if root.observed_at is None:
        return None
    if root.observed_problem:
        return root.observed_problem
    if not root.observed_exists:
        return "missing"
    if not root.observed_writable:
        return "not writable"
    return None


def refuse_if_unusable(root: StorageRoot) -> None:
    """J1: STORAGE_ROOT_UNAVAILABLE (409) for a root the agent reports it cannot use, so no job is
    queued only to fail on it."""
    reason = unusable_reason(root)
    if reason is None:
        return
    raise DomainError(
        "STORAGE_ROOT_UNAVAILABLE",
        f"Storage root {root.name} ({root.container_path}) cannot take a download; the agent reported at "
        f"{root.observed_at:%Y-%m-%d %H:%M:%S} UTC: {reason}.",
        "Fix it on the node (create the directory or let the agent write to it), wait for the node page to "
        "show the root as exists and writable (the next heartbeat), then acquire again; or pick another root.",
        field="params.storage_root_id",
    )


def record_usage(node_id: str, observations: list[Observation], quarantine: dict[str, object] | None) -> None:
    """J5: keep what the agent measured of its roots (this node's only) and of its quarantine.

    Nothing is written when the heartbeat carries no measurement (an older agent, or none due), so
    an unknown figure stays unknown. The inventory row is locked first (PostgreSQL), before the
    heartbeat touches the lease, in the order an inventory takes them, so the two never deadlock
    and neither loses what the other wrote; with no inventory yet, the next report (a minute) finds one.
    """
    measured = {seen.id: seen.usage for seen in observations if seen.usage is not None}
    if not measured and quarantine is None:
        return
    connection = db.session.connection()
    row = connection.execute(
        sa.select(NodeInventory.facts).where(NodeInventory.node_id == node_id).with_for_update()
    ).first()
    if row is None:
        return
    own = set(
        db.session.scalars(
            sa.select(StorageRoot.id).where(StorageRoot.node_id == node_id, StorageRoot.id.in_(list(measured)))
        )
    )
    roots = {
        root_id: {key: value for key, value in usage.items() if key != "partial_jobs"}
        for root_id, usage in measured.items()
        if root_id in own
    }
    facts = dict(row.facts) if isinstance(row.facts, dict) else {}
    facts[USAGE_FACT] = {"roots": roots, "quarantine": quarantine, "reported_at": isoformat(utcnow())}
    connection.execute(sa.update(NodeInventory).where(NodeInventory.node_id == node_id).values(facts=facts))


def finished_partial_jobs(node_id: str, observations: list[Observation]) -> list[str]:
    """J5: of the jobs whose partial directories the agent reported, this node's that have ended
    (succeeded, failed, cancelled): no attempt resumes from them, so the agent removes them. A
    queued job keeps its directory for its next attempt; an id this node has no job of is left alone."""
    reported = sorted({job for seen in observations for job in (seen.usage or {}).get("partial_jobs", [])})
    if not reported:
        return []
    return sorted(
        db.session.scalars(
            sa.select(Job.id).where(Job.node_id == node_id, Job.id.in_(reported), Job.state.in_(list(TERMINAL_STATES)))
        )
    )


def usage_for_node(node_id: str) -> dict[str, object]:
    """J5: what the agent last measured, `{"roots": {root id: usage}, "quarantine": … or None}`;
    empty mappings when it never reported (an older agent): shown as unknown, never 0."""
    facts = db.session.scalar(sa.select(NodeInventory.facts).where(NodeInventory.node_id == node_id))
    stored = facts.get(USAGE_FACT) if isinstance(facts, dict) else None
    stored = stored if isinstance(stored, dict) else {}
    roots = stored.get("roots")
    quarantine = stored.get("quarantine")
    return {
        "roots": roots if isinstance(roots, dict) else {},
        "quarantine": quarantine if isinstance(quarantine, dict) else None,
    }
