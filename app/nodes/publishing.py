"""What an enrolled agent publishes: inventory and heartbeats with telemetry (A2, N4, L2)."""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from app import audit, tokens
from app.acceptance import checklist as acceptance
from app.config import current_settings
from app.db import begin_read_only, insert_ignoring_duplicates
from app.errors import DomainError
from app.extensions import db
from app.jobs import queue, runtime, storage
from app.models import (
    AuditEvent,
    Credential,
    Gpu,
    Node,
    NodeInventory,
    NodeLease,
    TelemetryRollup,
    TelemetrySample,
)
from app.models.telemetry import METRICS
from app.nodes import rate_limits
from app.nodes.compat import RUNTIME_WORKER, answer_for
from app.serving import deployments
from app.timeutil import isoformat, utcnow

logger = logging.getLogger("modelforge.publishing")


@dataclass(frozen=True)
class Publisher:
    """The node behind a presented credential."""

    node_id: str
    draining: bool = False  # S3: its heartbeats hear of no waiting job


# The heartbeat hot path runs prebuilt Core statements on the session's connection: the ORM's
# per-call statement construction cost more than the database work (bench/heartbeat.py).
_credentials = Credential.__table__
_nodes = Node.__table__
_leases = NodeLease.__table__
_AUTHENTICATE = (
    sa.select(
        _credentials.c.id.label("credential_id"),
        _credentials.c.token_hash,
        _credentials.c.revoked_at,
        _credentials.c.first_used_at,
        _nodes.c.id,
        _nodes.c.disabled,
        _nodes.c.draining,
    )
    .select_from(_credentials.join(_nodes, _nodes.c.id == _credentials.c.node_id))
    .where(_credentials.c.token_hash == sa.bindparam("digest"))
)
# A credential's first use, once in its life: after it, a retried enrol claim can no longer
# replace this credential (app.nodes.enrollment._reissue revokes only one whose first_used_at is NULL,
# with a conditional UPDATE on the same row, so of the two exactly one wins).
_MARK_FIRST_USE = (
    _credentials.update()
    .where(
        _credentials.c.id == sa.bindparam("credential_id"),
        _credentials.c.first_used_at.is_(None),
        _credentials.c.revoked_at.is_(None),
    )
    .values(first_used_at=sa.bindparam("now"))
)
_VERSION_COLUMNS = ("agent_version", "protocol_version", "compatibility", "last_seen_at")
_NOTE_VERSIONS = (
    _leases.update()
    .where(_leases.c.node_id == sa.bindparam("lease_node_id"))
    .values({name: sa.bindparam(name) for name in _VERSION_COLUMNS})
)
_BEAT_COLUMNS = (*_VERSION_COLUMNS, "last_heartbeat_at", "health_status", "health_detail")
# The common case: the node is online and stays so. The status condition is re-checked under
# the row lock, so a sweep that marked the node stale first makes this match nothing (L2).
# The rate condition (app.nodes.rate_limits) rides on the same UPDATE: a beat too soon after the last
# accepted one matches nothing either, and only then is the reason read.
# It returns what the reply needs (J1, J2), so the common case reads nothing else from the lease.
_HEARTBEAT_WHILE_ONLINE = (
    _leases.update()
    .where(
        _leases.c.node_id == sa.bindparam("lease_node_id"),
        _leases.c.status == "online",
        _leases.c.last_heartbeat_at <= sa.bindparam("accept_before"),
    )
    .values({name: sa.bindparam(name) for name in _BEAT_COLUMNS})
    .returning(_leases.c.capabilities, _leases.c.storage_roots_version, _leases.c.deployments_version)
)
_LEASE_STATUS_LOCKED = (
    sa.select(_leases.c.status, _leases.c.last_heartbeat_at)
    .where(_leases.c.node_id == sa.bindparam("lease_node_id"))
    .with_for_update()
)
_HEARTBEAT_BRINGING_ONLINE = (
    _leases.update()
    .where(_leases.c.node_id == sa.bindparam("lease_node_id"))
    .values({name: sa.bindparam(name) for name in _BEAT_COLUMNS} | {"status": "online"})
    .returning(_leases.c.capabilities, _leases.c.storage_roots_version, _leases.c.deployments_version)
)
_gpus = Gpu.__table__
_GPU_IDS = sa.select(_gpus.c.uuid, _gpus.c.id).where(_gpus.c.node_id == sa.bindparam("gpu_node_id"))
# A sample the agent sends twice (its reply was lost) is stored once: (gpu_id, sampled_at) is the key.
_INSERT_SAMPLES = insert_ignoring_duplicates(TelemetrySample.__table__)


# A GPU row's id never changes once it exists (rows go only with their node, or when an inventory
# evicts a long-gone GPU: record_inventory), so each worker keeps the (node, GPU UUID) → id pairs it
# has read, per database engine: a routine heartbeat then does no lookup at all. Only GPUs an
# inventory listed have rows (N4): nothing here inserts one.
_gpu_id_cache: weakref.WeakKeyDictionary[sa.Engine, dict[tuple[str, str], int]] = weakref.WeakKeyDictionary()
_GPU_ID_CACHE_LIMIT = 100_000
_PRESENT_GPU_IDS = _GPU_IDS.where(_gpus.c.present.is_(True))


def _gpu_ids(connection: sa.Connection, node_id: str, uuids: set[str]) -> dict[str, int]:
    """The integer keys of those of these GPUs the node's inventory lists; the others are left out."""
    cache = _gpu_id_cache.setdefault(connection.engine, {})
    cached = {uuid: cache.get((node_id, uuid)) for uuid in uuids}
    if None not in cached.values():
        return cached
    known = dict(connection.execute(_PRESENT_GPU_IDS, {"gpu_node_id": node_id}).all())
    if len(cache) > _GPU_ID_CACHE_LIMIT:
        cache.clear()
    cache.update({(node_id, uuid): gpu_id for uuid, gpu_id in known.items()})
    return {uuid: known[uuid] for uuid in uuids if uuid in known}


# Per worker: telemetry ignored per node since it was last logged, and when that was.
_ignored_samples: dict[str, tuple[int, float]] = {}
_IGNORED_LOG_SECONDS = 60.0


def _note_ignored(node_id: str, count: int, uuids: set[str]) -> None:
    """Say what was dropped, in one log line per node per minute per worker (never silently, never a flood)."""
    logged_count, logged_at = _ignored_samples.get(node_id, (0, 0.0))
    total, now = logged_count + count, time.monotonic()
    if now - logged_at < _IGNORED_LOG_SECONDS:
        _ignored_samples[node_id] = (total, logged_at)
        return
    if len(_ignored_samples) > _GPU_ID_CACHE_LIMIT:
        _ignored_samples.clear()
    _ignored_samples[node_id] = (0, now)
    logger.warning(
        "node %s: ignored %d telemetry sample(s) for GPU UUIDs its inventory does not list (e.g. %s); "
        "the next inventory that lists them lets their telemetry in",
        node_id,
        total,
        ", ".join(sorted(uuids)[:3])[:300],
    )


def sample_rows(connection: sa.Connection, node_id: str, samples: list[dict[str, object]]) -> list[dict[str, object]]:
    """N4, P5: the telemetry rows to store: samples of GPUs the node's inventory lists.

    A sample for any other UUID is ignored rather than refused: refusing would fail the whole
    heartbeat, and with it the liveness of a good agent whose GPU set changed since its last
    inventory (a GPU lost or added); ignoring keeps the node online and stores nothing invented.
    What was dropped is counted in the log (_note_ignored). No GPU row is ever created here, so a
    node's GPUs are the ones its inventories listed (at most MAX_GPU_ROWS: record_inventory).
    """
    gpu_ids = _gpu_ids(connection, node_id, {sample["gpu_uuid"] for sample in samples})
    rows = [
        {"gpu_id": gpu_ids[sample["gpu_uuid"]], "sampled_at": sample["sampled_at"]}
        | {metric: sample[metric] for metric in METRICS}
        for sample in samples
        if sample["gpu_uuid"] in gpu_ids
    ]
    if len(rows) < len(samples):
        unknown = {sample["gpu_uuid"] for sample in samples} - gpu_ids.keys()
        _note_ignored(node_id, len(samples) - len(rows), unknown)
    return rows


def authenticate(secret: str, *, first_use: bool = True) -> Publisher:
    """Find the node for a bearer credential by its indexed hash — never a scan (P2, I5, I6).

    `first_use=False` writes nothing (a reader's check before a large body is read, issue 22): the
    request's own authentication after it records the first use.
    """
    row = db.session.connection().execute(_AUTHENTICATE, {"digest": tokens.digest(secret)}).one_or_none()
    # The index found the row; compare_digest keeps the final check constant-time.
    if row is None or not tokens.same_digest(row.token_hash, secret):
        raise DomainError(
            "CREDENTIAL_INVALID",
            "The node credential is not known to this control plane.",
            "Check /data/state/node-credential on the node, or re-enrol it with a new token.",
        )
    if first_use and row.revoked_at is None and row.first_used_at is None:
        row = _mark_first_use(row, secret)
    if row.revoked_at is not None:
        raise DomainError(
            "CREDENTIAL_REVOKED",
            "The node credential has been revoked.",
            "Install the rotated credential, or mint a new enrolment token and re-enrol the node.",
        )
    if row.disabled:
        raise DomainError(
            "NODE_DISABLED",
            "This node is disabled; its publications are refused.",
            "An operator can enable it in the console or with POST /api/v1/admin/nodes/{id}/enable.",
        )
    return Publisher(node_id=row.id, draining=row.draining)


def _mark_first_use(row: sa.Row, secret: str) -> sa.Row:
    """Record a credential's first use and commit it at once, whatever the request then does.

    Only a credential never used before gets here, so the heartbeat hot path writes nothing
    extra. Zero rows means a retried enrol claim revoked it meanwhile (or a concurrent first
    call marked it): read it again so the caller sees which.
    """
    connection = db.session.connection()
    marked = connection.execute(_MARK_FIRST_USE, {"credential_id": row.credential_id, "now": utcnow()}).rowcount
    if not marked:
        row = connection.execute(_AUTHENTICATE, {"digest": tokens.digest(secret)}).one()
    db.session.commit()
    return row


@dataclass
class Versions:
    """The versions an agent request carries (A1)."""

    agent_version: str
    protocol_version: int | None
    compatibility: str

    def columns(self, now: datetime) -> dict[str, object]:
        """The lease columns that remember what the agent last sent."""
        return {
            "agent_version": self.agent_version,
            "protocol_version": self.protocol_version,
            "compatibility": self.compatibility,
            "last_seen_at": now,
        }


# Issue 22, P3: a reading (telemetry sample, storage-root observation) dated further ahead of the
# control plane's clock than this is dropped, not stored (it would stay the "latest" one until the
# real time caught up), and never refuses the heartbeat that carries it: a node whose clock runs
# ahead stays online, and is told why its readings are missing (the reply, its health detail, the log).
MAX_CLOCK_AHEAD = timedelta(minutes=10)
# Cut the note's agent part so the whole fits the health_detail column (app/models/node.py).
_HEALTH_DETAIL_LENGTH = 1000


@dataclass(frozen=True)
class ClockWarning:
    """What the node's clock cost this heartbeat: readings dropped as dated ahead, or readings that
    came in older than the freshness window (a clock behind: stored, but never a fresh /metrics series)."""

    dropped_samples: int
    dropped_observations: int
    offset_seconds: float  # the furthest reading from now: positive ahead, negative behind

    @property
    def dropped(self) -> int:
        return self.dropped_samples + self.dropped_observations

    def message(self) -> str:
        minutes = abs(self.offset_seconds) / 60
        if self.dropped:
            return (
                f"dropped {self.dropped} reading(s) dated up to {minutes:.0f} min ahead of the control plane's "
                f"clock (more than {MAX_CLOCK_AHEAD.seconds // 60} min is not believed)"
            )
        return (
            f"telemetry dated {minutes:.0f} min behind the control plane's clock: stored, but too old for a "
            "fresh /metrics series"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "dropped_samples": self.dropped_samples,
            "dropped_observations": self.dropped_observations,
            "offset_seconds": round(self.offset_seconds, 3),
            "message": self.message() + ".",
            "next_step": "Check the node's clock (NTP, chrony or systemd-timesyncd); the liveness still counts.",
        }


def _dated(
    samples: list[dict[str, object]], observations: list[storage.Observation], now: datetime, fresh: timedelta
) -> tuple[list[dict[str, object]], list[storage.Observation], ClockWarning | None]:
    """The readings the control plane can date, and what the node's clock cost (None: nothing)."""
    latest = now + MAX_CLOCK_AHEAD
    kept = [sample for sample in samples if sample["sampled_at"] <= latest]
    seen = [observation for observation in observations if observation.observed_at <= latest]
    if len(kept) < len(samples) or len(seen) < len(observations):
        ahead = max([sample["sampled_at"] for sample in samples] + [each.observed_at for each in observations])
        warning = ClockWarning(len(samples) - len(kept), len(observations) - len(seen), (ahead - now).total_seconds())
        return kept, seen, warning
    newest = max((sample["sampled_at"] for sample in samples), default=None)
    if newest is not None and newest < now - fresh:
        return kept, seen, ClockWarning(0, 0, (newest - now).total_seconds())
    return kept, seen, None


def _with_note(detail: str | None, warning: ClockWarning) -> str:
    """The agent's health detail with the control plane's word on the dropped readings (shown on the node)."""
    note = f"control plane: {warning.message()}; check the node's clock"
    if not detail:
        return note
    room = _HEALTH_DETAIL_LENGTH - len(note) - 3
    return f"{detail[:room]} · {note}"


def _note_clock(node_id: str, warning: ClockWarning) -> None:
    """One log line per node per minute per worker, with the count since the last one (as _note_ignored)."""
    key = f"clock:{node_id}"
    logged_count, logged_at = _ignored_samples.get(key, (0, 0.0))
    total, now = logged_count + warning.dropped, time.monotonic()
    if now - logged_at < _IGNORED_LOG_SECONDS:
        _ignored_samples[key] = (total, logged_at)
        return
    _ignored_samples[key] = (0, now)
    logger.warning(
        "node %s: %s (%d dropped since the last such line); its clock needs checking", node_id, warning.message(), total
    )


@dataclass(frozen=True)
class BeatReply:
    """What a heartbeat's reply tells the agent beyond liveness (J1, J2)."""

    jobs_waiting: int
    storage_roots_etag: str
    storage_roots: list[dict[str, object]] | None  # only when the agent's copy is out of date
    deployments_etag: str = "0"
    deployments: list[dict[str, object]] | None = None  # S2: likewise
    clock_warning: ClockWarning | None = None  # issue 22: readings the node's clock cost
    finished_partial_jobs: list[str] = ()  # J5: reported partial directories whose jobs have ended


def record_heartbeat(
    publisher: Publisher,
    versions: Versions,
    health_status: str,
    health_detail: str | None,
    samples: list[dict[str, object]],
    observations: list[storage.Observation] = (),
    roots_etag: str | None = None,
    deployments_etag: str | None = None,
    quarantine_usage: dict[str, object] | None = None,
) -> BeatReply:
    """L2: one narrow lease UPDATE (liveness) and one batch INSERT (telemetry), one commit.

    Only a node that was not online (first heartbeat, or back from stale/offline) takes the
    slow path: lock the lease, read what it was, bring it online and audit the transition. A beat
    sooner than app.nodes.rate_limits allows takes it too, and is refused there with 429 (A2, P5).
    """
    now = utcnow()
    fresh = timedelta(seconds=current_settings().node_stale_after_seconds)
    samples, observations, clock = _dated(samples, list(observations), now, fresh)
    if clock is not None and clock.dropped:
        health_detail = _with_note(health_detail, clock)
        _note_clock(publisher.node_id, clock)
    connection = db.session.connection()
    # J5: before the lease, as an inventory orders its locks (storage.record_usage); only a beat that
    # carries a measurement (at most one a minute) writes anything here.
    storage.record_usage(publisher.node_id, observations, quarantine_usage)
    beat = {
        "lease_node_id": publisher.node_id,
        "accept_before": rate_limits.accept_before(now),
        **versions.columns(now),
        "last_heartbeat_at": now,
        "health_status": health_status,
        "health_detail": health_detail,
    }
    lease = connection.execute(_HEARTBEAT_WHILE_ONLINE, beat).first()
    if lease is not None:
        if connection.dialect.name == "postgresql":
            # A routine heartbeat and its samples are superseded seconds later: a crash may lose the last fraction
            # of a second of them, which beats waiting for a WAL flush on every one. Transitions
            # (audited, below), enrolment and credential changes keep full durability.
            connection.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
    else:
        locked = connection.execute(_LEASE_STATUS_LOCKED, {"lease_node_id": publisher.node_id}).first()
        previous, last_beat = (None, None) if locked is None else locked
        if previous == "online" and last_beat is not None and last_beat > beat["accept_before"]:
            # Too soon, unless an inventory was accepted since: an agent (re)starting publishes
            # inventory then heartbeat, and its first beat is let through (app.nodes.rate_limits).
            if not rate_limits.inventory_since(connection, publisher.node_id, last_beat):
                raise rate_limits.refusal("heartbeat", last_beat, now)  # rolled back: nothing stored
        lease = connection.execute(_HEARTBEAT_BRINGING_ONLINE, beat).first()
        if previous != "online":
            action = "node.online" if previous in (None, "pending") else "node.returned"
            audit.record(audit.agent_actor(publisher.node_id), action, publisher.node_id, previous=previous)
    if samples and (rows := sample_rows(connection, publisher.node_id, samples)):
        connection.execute(_INSERT_SAMPLES[connection.dialect.name], rows)
    if observations:
        storage.record_observations(publisher.node_id, observations)
    finished = storage.finished_partial_jobs(publisher.node_id, observations)
    # J1: the root list travels only when the agent's copy is out of date; version 0 means the
    # node never had one, which needs no query.
    etag = str(lease.storage_roots_version)
    roots = None
    if roots_etag != etag:
        roots = storage.agent_view(publisher.node_id) if lease.storage_roots_version else []
    # S2: the deployments list the same way, by its own counter.
    served_etag = str(lease.deployments_version)
    served = None
    if deployments_etag != served_etag:
        served = deployments.agent_view(publisher.node_id) if lease.deployments_version else []
    # J2: on SQLite the count is asked after the commit, as a reader, so it never holds the writers'
    # lock another node's heartbeat waits for; PostgreSQL has no such lock, and a second
    # transaction there would only cost a round trip, so it is asked in this one.
    sqlite = connection.dialect.name == "sqlite"
    waiting = 0
    counted = lease.capabilities and not publisher.draining  # S3: a draining node claims nothing new
    if counted and not sqlite:
        waiting = queue.jobs_waiting(publisher.node_id, lease.capabilities)
    db.session.commit()
    if counted and sqlite:
        begin_read_only()
        waiting = queue.jobs_waiting(publisher.node_id, lease.capabilities)
    return BeatReply(
        jobs_waiting=waiting,
        storage_roots_etag=etag,
        storage_roots=roots,
        deployments_etag=served_etag,
        deployments=served,
        clock_warning=clock,
        finished_partial_jobs=finished,
    )


def note_versions(node_id: str, versions: Versions) -> None:
    """Remember what an agent last sent, even when refused, so the console can show it (A1)."""
    db.session.connection().execute(_NOTE_VERSIONS, {"lease_node_id": node_id, **versions.columns(utcnow())})
    db.session.commit()


@dataclass(frozen=True)
class WorkerReport:
    """W1: the runtime worker as the agent found it: its facts, or why none answered."""

    facts: dict[str, object] | None = None
    problem: str | None = None

    @property
    def answer(self) -> str | None:
        """The compatibility answer for the worker's protocol; None while no worker answers."""
        return None if self.facts is None else answer_for(self.facts.get("protocol_version"), RUNTIME_WORKER)

    @property
    def version(self) -> str | None:
        """The worker's version, or None while no worker answers."""
        return None if self.facts is None else self.facts.get("worker_version")


_LEASE_WORKER = sa.select(_leases.c.runtime_worker, _leases.c.worker_compatibility).where(
    _leases.c.node_id == sa.bindparam("lease_node_id")
)


def _note_worker_change(node_id: str, worker: WorkerReport) -> None:
    """W1, P4: audit the worker appearing, going, or changing version or answer — once, not every inventory."""
    before = db.session.connection().execute(_LEASE_WORKER, {"lease_node_id": node_id}).one_or_none()
    reported = before.runtime_worker if before is not None and isinstance(before.runtime_worker, dict) else {}
    old = (reported.get("worker_version"), before.worker_compatibility if before is not None else None)
    new = (worker.version, worker.answer)
    if old != new:
        audit.record(
            audit.agent_actor(node_id),
            "node.runtime_worker_changed",
            node_id,
            old_version=old[0],
            new_version=new[0],
            old_answer=old[1],
            new_answer=new[1],
            problem=worker.problem,
        )


# P4, P5: a node whose hostname or GPU set keeps changing writes one change event per kind per
# window, not one per inventory — an agent flipping them (1,000 events in 3.6 s) would otherwise push
# every operator event off the audit page's first page.
CHANGE_AUDIT_WINDOW = timedelta(minutes=10)


def _audit_change(node_id: str, action: str, now: datetime, **details: object) -> None:
    """Audit a change, or fold it into this node's event of the same kind from the last window.

    The folded event keeps its time, its place in the log and the first change's details as
    written; it gains `changes` (how many in all), `last_at` and `last` (the latest change's
    details). Once the window has passed the next change is a new event, so the operator sees every
    kind of change at least once per window, with how many there were — and the log's first page
    keeps the operator's own events. Changes are read only when one happened: no cost otherwise.
    """
    recent = db.session.scalar(
        sa.select(AuditEvent)
        .where(
            AuditEvent.node_id == node_id,
            AuditEvent.action == action,
            AuditEvent.at >= now - CHANGE_AUDIT_WINDOW,
        )
        .order_by(AuditEvent.id.desc())
        .limit(1)
    )
    if recent is None:
        audit.record(audit.agent_actor(node_id), action, node_id, **details)
        return
    folded = dict(recent.details or {})
    changes = folded.get("changes")
    folded.update(changes=(changes if isinstance(changes, int) else 1) + 1, last_at=isoformat(now), last=details)
    recent.details = folded  # a new dict: the JSON column sees the change


# N4, P5: a node keeps rows for the GPUs its inventory lists (at most MAX_GPUS) and remembers a few
# that went (shown as missing, their telemetry kept); the longest gone beyond this are forgotten with
# their telemetry, so an agent reporting new UUIDs in every inventory cannot grow its rows forever.
MAX_GONE_GPUS = 64


def _forget_gone_gpus(node_id: str, gone: list[Gpu]) -> None:
    """Delete the GPUs gone longest beyond MAX_GONE_GPUS (their samples go by the foreign key)."""
    if len(gone) <= MAX_GONE_GPUS:
        return
    oldest = sorted(gone, key=lambda gpu: (gpu.last_seen_at, gpu.id))[: len(gone) - MAX_GONE_GPUS]
    ids = [gpu.id for gpu in oldest]
    for gpu in oldest:
        db.session.expunge(gpu)
    for table in (TelemetrySample.__table__, TelemetryRollup.__table__):
        db.session.execute(table.delete().where(table.c.gpu_id.in_(ids)))
    db.session.execute(_gpus.delete().where(_gpus.c.id.in_(ids)))
    cache = _gpu_id_cache.get(db.session.connection().engine, {})
    for gpu in oldest:
        cache.pop((node_id, gpu.uuid), None)


def record_inventory(
    publisher: Publisher,
    versions: Versions,
    facts: dict[str, object],
    gpus: list[dict[str, object]],
    capabilities: list[str] = (),
    worker: WorkerReport = WorkerReport(),
) -> dict[str, int]:
    """N4: store the latest inventory, upsert GPUs by UUID, and audit what changed.

    W1: the runtime worker's facts and answer go on the lease, and runtime.* capabilities are kept
    only while that answer is COMPATIBLE, so neither `jobs_waiting` nor a claim ever offers them
    otherwise — with no extra work on the heartbeat's path.
    """
    now = utcnow()
    node_id = publisher.node_id
    # V1: the node row locked (PostgreSQL) and read afresh before anything else, as every acceptance
    # write does (app.acceptance.checklist.lock_node): a concurrent "mark eligible" commits first and
    # this inventory's contradiction then sees and clears it, and two evidence writes never race.
    # Inventories are rare (start, GPU change); the heartbeat's path takes no such lock.
    node = acceptance.lock_node(node_id)
    # J5: locked (PostgreSQL) so a heartbeat's measurement (storage.record_usage) is never lost to it.
    inventory = db.session.get(NodeInventory, node_id, with_for_update=True)
    previous_facts = inventory.facts if inventory is not None else None
    if isinstance(previous_facts, dict) and storage.USAGE_FACT in previous_facts:
        # J5: the roots' use comes with the heartbeat, not the inventory: a new inventory keeps it.
        facts = {**facts, storage.USAGE_FACT: previous_facts[storage.USAGE_FACT]}
    if inventory is None:
        db.session.add(NodeInventory(node_id=node_id, facts=facts, received_at=now))
    else:
        inventory.facts = facts
        inventory.received_at = now

    hostname = facts.get("hostname")
    if isinstance(hostname, str) and hostname and hostname != node.hostname:
        _audit_change(node_id, "node.hostname_changed", now, old=node.hostname, new=hostname)
        node.hostname = hostname

    known = {gpu.uuid: gpu for gpu in db.session.scalars(sa.select(Gpu).where(Gpu.node_id == node_id))}
    reported = {gpu["uuid"]: gpu for gpu in gpus}
    added = sorted(set(reported) - {uuid for uuid, gpu in known.items() if gpu.present})
    removed = sorted(uuid for uuid, gpu in known.items() if gpu.present and uuid not in reported)
    present_before = sorted(uuid for uuid, gpu in known.items() if gpu.present)
    for uuid, fields in reported.items():
        gpu = known.get(uuid)
        if gpu is None:
            gpu = Gpu(node_id=node_id, uuid=uuid, first_seen_at=now)
            db.session.add(gpu)
        for name in ("name", "memory_total_bytes", "driver_version", "cuda_driver_version", "pci_bus_id"):
            setattr(gpu, name, fields.get(name))
        gpu.present = True
        gpu.last_seen_at = now
    for uuid in removed:
        known[uuid].present = False
    if added or removed:
        _audit_change(node_id, "node.gpus_changed", now, added=added, removed=removed)
    _forget_gone_gpus(node_id, [gpu for uuid, gpu in known.items() if uuid not in reported])

    _note_worker_change(node_id, worker)
    # J2: what it can run, read by every heartbeat for `jobs_waiting`; one UPDATE with the versions.
    db.session.connection().execute(
        _NOTE_VERSIONS.values(
            capabilities=sorted(set(runtime.runnable(capabilities, worker.answer))),
            runtime_worker=worker.facts,
            runtime_worker_problem=worker.problem,
            worker_compatibility=worker.answer,
        ),
        {"lease_node_id": node_id, **versions.columns(now)},
    )
    # V1: restart identity, the control plane's read-back, and a contradiction clearing production_eligible.
    acceptance.after_inventory(node, previous_facts, facts, present_before, sorted(reported))
    db.session.commit()
    return {"gpus": len(reported), "gpus_added": len(added), "gpus_removed": len(removed)}
