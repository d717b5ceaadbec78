"""J2: typed jobs under fenced leases.

A claim is one conditional UPDATE whose row count decides the winner (as E2), and a partial
unique index keeps one running job per node; the attempt number fences every report, so a report
from an attempt that lost its lease changes nothing (`409 JOB_LEASE_LOST`); the lease sweep
requeues a job whose agent went silent, exactly once per tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from app import audit
from app.config import Settings, current_settings
from app.errors import DomainError
from app.extensions import db
from app.jobs import artifacts, runtime, storage
from app.models import Artifact, Job, JobState, NodeLease
from app.models.jobs import TERMINAL_STATES
from app.nodes import get as get_node
from app.nodes import liveness, refuse_if_draining
from app.timeutil import isoformat, utcnow

ACQUIRE = "artifact.acquire.v1"
BENCHMARK = runtime.BENCHMARK
GENERATE = runtime.GENERATE
DELETE = artifacts.DELETE
# J2: every job type, in one place (the API, the OpenAPI document and the console read it).
TYPES = (ACQUIRE, *runtime.TYPES, DELETE)
# Error codes that are worth another attempt (J2); everything else fails at once.
RETRY_BACKOFF_SECONDS = (0, 5, 30, 120)
PAGE_SIZE = 50
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS = 10


@dataclass(frozen=True)
class Report:
    """Who is reporting on a job: the node behind the credential, and the attempt it runs (fence)."""

    node_id: str
    job_id: str
    attempt: int


def _not_found(job_id: str) -> DomainError:
    return DomainError("JOB_NOT_FOUND", f"No job has id “{job_id[:100]}”.", "List jobs with GET /api/v1/admin/jobs.")


def get(job_id: str) -> Job:
    """The job with this id, or JOB_NOT_FOUND."""
    job = db.session.get(Job, job_id)
    if job is None:
        raise _not_found(job_id)
    return job


def _artifact_on(node_id: str, artifact_id: str) -> Artifact:
    """W2: the artifact a runtime job runs a model of, which must lie on the job's own node."""
    artifact = artifacts.get(artifact_id)
    if artifact.node_id != node_id:
        raise DomainError(
            "ARTIFACT_NOT_ON_NODE",
            f"Artifact {artifact_id} ({artifact.repo_id}) lies on another node; a runtime job reads it from its "
            "own node's disk.",
            "Pick one of this node's artifacts (GET /api/v1/admin/nodes/{id}/artifacts), or acquire the model "
            "onto this node first.",
        )
    return artifact


def request_delete(artifact_id: str) -> Job:
    """J5: DELETE …/artifacts/{id}: its delete job, the one already queued or running, else a new one."""
    artifact = artifacts.get(artifact_id)
    pending = artifacts.deleting([artifact.id])
    if pending:
        return db.session.get(Job, pending[artifact.id])
    return create(DELETE, artifact.node_id, {"artifact_id": artifact.id})


def create(job_type: str, node_id: str, params: dict[str, object], max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Job:
    """Queue a job for a node (J2); an acquire job names a root, a runtime job an artifact, of that very node.
    A draining node takes none (S3)."""
    job = add(job_type, node_id, params, max_attempts)
    db.session.commit()
    return job


def add(job_type: str, node_id: str, params: dict[str, object], max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Job:
    """`create`'s checks and row, audited, left to the caller to commit: a fan-out queues its jobs
    in one transaction, all or none (S3)."""
    refuse_if_draining(get_node(node_id))
    root_id = artifact_id = None
    if job_type == ACQUIRE:
        root = storage.get(str(params["storage_root_id"]))
        if root.node_id != node_id:
            raise DomainError(
                "STORAGE_ROOT_NOT_ON_NODE",
                "That storage root belongs to another node.",
                "Pick one of this node's roots (GET /api/v1/admin/nodes/{id}/storage-roots).",
            )
        storage.refuse_if_unusable(root)
        root_id = root.id
    elif runtime.is_runtime(job_type):
        artifact = _artifact_on(node_id, str(params["artifact_id"]))
        artifacts.refuse_if_deleting(artifact)
        artifact_id = artifact.id
    elif job_type == DELETE:
        artifact = _artifact_on(node_id, str(params["artifact_id"]))
        artifacts.refuse_if_in_use(artifact)
        artifact_id = artifact.id
    job = Job(
        type=job_type,
        node_id=node_id,
        storage_root_id=root_id,
        artifact_id=artifact_id,
        params=params,
        max_attempts=max_attempts,
    )
    db.session.add(job)
    db.session.flush()
    audit.record(audit.OPERATOR, "job.created", node_id, job_id=job.id, type=job_type)
    return job


def list_jobs(
    node_id: str | None = None,
    job_type: str | None = None,
    state: str | None = None,
    before: Job | None = None,
    limit: int = PAGE_SIZE,
) -> list[Job]:
    """Jobs newest first, filtered, keyset-paged on (created_at, id)."""
    query = sa.select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    if node_id is not None:
        query = query.where(Job.node_id == node_id)
    if job_type is not None:
        query = query.where(Job.type == job_type)
    if state is not None:
        query = query.where(Job.state == state)
    if before is not None:
        query = query.where(
            sa.or_(Job.created_at < before.created_at, sa.and_(Job.created_at == before.created_at, Job.id < before.id))
        )
    return list(db.session.scalars(query))


def _finish(job: Job, state: str, *, error: dict | None = None, result: dict | None = None) -> None:
    job.state = state
    job.error = error
    job.result = result
    job.finished_at = utcnow()
    job.lease_expires_at = None


def cancel(job_id: str) -> Job:
    """J2: a queued job is cancelled at once; a running one is told so on its next progress report."""
    job = get(job_id)
    if job.state in TERMINAL_STATES:
        raise DomainError(
            "JOB_FINISHED", f"The job is already {job.state}.", "Nothing to cancel; retry it if you want it again."
        )
    if job.state == JobState.QUEUED:
        _finish(job, JobState.CANCELLED, error=_error("JOB_CANCELLED", "Cancelled by the operator before it ran."))
        audit.record(audit.OPERATOR, "job.cancelled", job.node_id, job_id=job.id, attempt=job.attempt)
    else:
        job.cancel_requested = True
        audit.record(audit.OPERATOR, "job.cancel_requested", job.node_id, job_id=job.id, attempt=job.attempt)
    db.session.commit()
    return job


def retry(job_id: str) -> Job:
    """J2: a failed or cancelled job goes back to the queue as a new attempt."""
    job = get(job_id)
    if job.state not in (JobState.FAILED, JobState.CANCELLED):
        raise DomainError(
            "JOB_NOT_RETRYABLE",
            f"Only a failed or cancelled job can be retried; this one is {job.state}.",
            "Wait for it to finish, or cancel it first.",
        )
    job.state = JobState.QUEUED
    job.max_attempts = max(job.max_attempts, job.attempt + 1)
    job.cancel_requested = False
    job.not_before = None
    job.finished_at = None
    job.progress = None
    audit.record(audit.OPERATOR, "job.retried", job.node_id, job_id=job.id, attempt=job.attempt + 1, by="operator")
    db.session.commit()
    return job


def _error(code: str, message: str, next_step: str | None = None) -> dict[str, str]:
    return {"code": code, "message": message, "next_step": next_step or _NEXT_STEPS.get(code, "See the job's node.")}


_NEXT_STEPS = {
    "STORAGE_CAPACITY_GUARD": "Free space on the root, lower its min_free_bytes, or pick a larger root; then retry.",
    "STORAGE_ROOT_UNAVAILABLE": "Check the root exists below the agent's artifact volume and is writable.",
    "HUB_REPO_NOT_FOUND": "Check the repository id (owner/name) and its type.",
    "HUB_REVISION_NOT_FOUND": "Check the branch, tag or commit.",
    "HUB_AUTH_REQUIRED": "Accept the model's terms on the Hub and give the agent MODELFORGE_HF_TOKEN(_FILE).",
    "HUB_UNAVAILABLE": "The Hub or the node's network failed; retry later.",
    "ARTIFACT_VERIFICATION_FAILED": "The node keeps the bad files in its quarantine directory with reason.json.",
    "JOB_LEASE_LOST": "The agent stopped reporting (killed or offline); check the node.",
    "JOB_CANCELLED": "Retry it if you want it again.",
    "ARTIFACT_PATH_UNSAFE": "The Hub listed a path outside the download, or a symlink was found; nothing written.",
    "HUB_TREE_INVALID": (
        "The Hub's file list could not be trusted: an entry without a usable size or hash, a page from "
        "another host, or more pages or entries than the agent accepts; check the repository and HF_ENDPOINT."
    ),
    "JOB_PARAMS_INVALID": "Fix the job's parameters and create it again.",
    "JOB_TYPE_UNSUPPORTED": "Upgrade the node agent, or send this job to a node that advertises its type.",
    "AGENT_INTERNAL_ERROR": "The agent hit an unexpected error; its log says where. The job is retried.",
    "RUNTIME_WORKER_UNAVAILABLE": "Start the runtime worker container on the node and check that it shares the "
    "socket volume with the agent (MODELFORGE_AGENT_WORKER_SOCKET); the job is retried.",
    "MODEL_LOAD_FAILED": "The file is not a GGUF model llama.cpp can load (or it is truncated); pick another "
    "model_file, or acquire the model again.",
    "MODEL_FILE_INVALID": "Name a regular file inside the artifact (model_file is relative to it, no ..); list "
    "the artifact's files on the node.",
    "ARTIFACT_NOT_FOUND": "Acquire the model onto the node first; its artifacts are listed on the node page.",
    "ARTIFACT_NOT_ON_NODE": "Pick one of this node's artifacts, or acquire the model onto this node first.",
    "WORKER_BUSY": "The runtime worker is running another job; this one is retried when it is free.",
    "RUNTIME_ENGINE_CRASHED": "llama.cpp died running this model (the message names the signal); the worker "
    "kept serving. The file is likely malformed: pick another model_file, or acquire the model again.",
}


# Asked on every heartbeat of an agent that can run jobs: a prebuilt Core statement (no per-call
# query construction), one probe of ix_jobs_node_state.
_jobs = Job.__table__
_JOBS_WAITING = (
    sa.select(sa.func.count())
    .select_from(_jobs)
    .where(
        _jobs.c.node_id == sa.bindparam("node_id"),
        _jobs.c.state == JobState.QUEUED.value,
        _jobs.c.type.in_(sa.bindparam("types", expanding=True)),
        sa.or_(_jobs.c.not_before.is_(None), _jobs.c.not_before <= sa.bindparam("now", type_=Job.not_before.type)),
    )
)


def jobs_waiting(node_id: str, capabilities: list[str]) -> int:
    """Queued jobs for this node of an advertised type (the heartbeat reply carries it)."""
    if not capabilities:
        return 0
    parameters = {"node_id": node_id, "types": list(capabilities), "now": utcnow()}
    return db.session.connection().execute(_JOBS_WAITING, parameters).scalar_one()


def _agent_view(job: Job) -> dict[str, object]:
    """The job as its agent gets it: the storage root resolved into the params (J1)."""
    params = dict(job.params)
    if job.storage_root_id is not None:
        root = storage.get(job.storage_root_id)
        params |= {"container_path": root.container_path, "min_free_bytes": root.min_free_bytes}
    if job.artifact_id is not None:
        # W2: where the artifact lies as the agent sees it; the agent makes the worker's model_path of it.
        artifact = db.session.get(Artifact, job.artifact_id)
        if artifact is not None:
            params["container_path"] = artifact.container_path
    return {
        "id": job.id,
        "type": job.type,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "params": params,
        "lease_expires_at": isoformat(job.lease_expires_at),
    }


def claim(node_id: str, capabilities: list[str], settings: Settings) -> dict[str, object] | None:
    """J2: hand the node its oldest waiting job of an advertised type, or the one it already runs.

    One conditional UPDATE decides: it only moves a row that is still queued, and the partial
    unique index admits one running job per node, so two claims (two workers, a retried request)
    can never both win. L4: nothing for a node that is not online, enabled, compatible and not
    draining (S3); a running job is handed back all the same, so a draining node finishes it.
    """
    current = db.session.scalar(sa.select(Job).where(Job.node_id == node_id, Job.state == JobState.RUNNING))
    if current is not None:
        return _agent_view(current)  # a lost reply is harmless: the same job, the same attempt
    allowed, _ = liveness.may_receive_work(node_id, settings)
    if allowed and any(runtime.is_runtime(kind) for kind in capabilities):
        # W1: a claim may name runtime.* types its inventory did not; the lease's worker answer decides.
        worker_answer = db.session.scalar(sa.select(NodeLease.worker_compatibility).where(NodeLease.node_id == node_id))
        capabilities = runtime.runnable(capabilities, worker_answer)
    if not allowed or not capabilities:
        return None
    now = utcnow()
    candidate = (
        sa.select(Job.id)
        .where(
            Job.node_id == node_id,
            Job.state == JobState.QUEUED,
            Job.type.in_(capabilities),
            sa.or_(Job.not_before.is_(None), Job.not_before <= now),
        )
        .order_by(Job.created_at, Job.id)
        .limit(1)
    )
    job_id = db.session.scalar(candidate)
    if job_id is None:
        return None
    try:
        won = db.session.execute(
            sa.update(Job)
            .where(Job.id == job_id, Job.state == JobState.QUEUED)
            .values(
                state=JobState.RUNNING,
                attempt=Job.attempt + 1,
                lease_expires_at=now + timedelta(seconds=settings.job_lease_seconds),
                started_at=sa.func.coalesce(Job.started_at, now),
                error=None,
            )
            .execution_options(synchronize_session=False)
        ).rowcount
    except IntegrityError:  # another claim for this node won the one running slot
        db.session.rollback()
        return None
    if won != 1:
        db.session.rollback()
        return None
    job = db.session.get(Job, job_id, populate_existing=True)
    audit.record(audit.agent_actor(node_id), "job.started", node_id, job_id=job.id, attempt=job.attempt)
    db.session.commit()
    return _agent_view(job)


def _fenced(report: Report) -> sa.Update:
    """An UPDATE that touches the job only for the running attempt of the reporting node (J2 fence)."""
    return (
        sa.update(Job)
        .where(
            Job.id == report.job_id,
            Job.node_id == report.node_id,
            Job.attempt == report.attempt,
            Job.state == JobState.RUNNING,
        )
        .execution_options(synchronize_session=False)
    )


def running(report: Report) -> Job:
    """The job this report is about, if the reporting node still runs it at this attempt (J2 fence)."""
    job = db.session.get(Job, report.job_id)
    if job is None or job.node_id != report.node_id or job.attempt != report.attempt or job.state != JobState.RUNNING:
        raise _lease_lost(report)
    return job


def _lease_lost(report: Report) -> DomainError:
    return DomainError(
        "JOB_LEASE_LOST",
        f"Attempt {report.attempt} of job {report.job_id} no longer holds its lease; nothing was changed.",
        "Stop this attempt; the job was requeued or has finished.",
    )


def progress(report: Report, done: dict[str, object], settings: Settings) -> dict[str, object]:
    """Record progress and renew the lease; the reply says whether the operator cancelled it."""
    now = utcnow()
    lease = now + timedelta(seconds=settings.job_lease_seconds)
    updated = db.session.execute(
        _fenced(report)
        .values(progress={**done, "updated_at": isoformat(now)}, lease_expires_at=lease)
        .returning(Job.cancel_requested)
    ).first()
    if updated is None:
        db.session.rollback()
        raise _lease_lost(report)
    db.session.commit()
    return {"lease_expires_at": isoformat(lease), "cancel_requested": bool(updated.cancel_requested)}


def complete(report: Report, result: dict[str, object]) -> Job:
    """The attempt succeeded: record the artifact it left and finish the job (J3)."""
    job = running(report)
    stored = dict(result)
    if job.type == ACQUIRE:
        artifact = artifacts.record(job, result)
        stored.pop("models", None)  # kept once, with the artifact
        stored |= {"artifact_id": artifact.id, "host_path": artifact.host_path}
    elif job.artifact_id is not None and (artifact := db.session.get(Artifact, job.artifact_id)) is not None:
        # W2, J5: results are kept per node and model; the model's name outlives its artifact row.
        stored |= {"artifact_id": artifact.id, "repo_id": artifact.repo_id, "commit": artifact.commit}
        if job.type == DELETE:
            artifacts.forget(artifact, job)
    now = utcnow()
    finished = db.session.execute(
        _fenced(report).values(
            state=JobState.SUCCEEDED, result=stored, error=None, finished_at=now, lease_expires_at=None
        )
    ).rowcount
    if finished != 1:
        db.session.rollback()
        raise _lease_lost(report)
    audit.record(audit.agent_actor(report.node_id), "job.succeeded", report.node_id, job_id=job.id, attempt=job.attempt)
    db.session.commit()
    return db.session.get(Job, report.job_id, populate_existing=True)


def fail(report: Report, code: str, message: str, retryable: bool) -> Job:
    """The attempt failed: retry with backoff while attempts remain and the class allows it, else fail."""
    job = running(report)
    actor = audit.agent_actor(report.node_id)
    error = _error(code, message)
    if code == "JOB_CANCELLED" or job.cancel_requested:
        values = _terminal(JobState.CANCELLED, _error("JOB_CANCELLED", "Cancelled by the operator while it ran."))
        action = "job.cancelled"
    elif retryable and job.attempt < job.max_attempts:
        values = _requeue(job.attempt, error)
        action = "job.retried"
    else:
        values = _terminal(JobState.FAILED, error)
        action = "job.failed"
    if db.session.execute(_fenced(report).values(**values)).rowcount != 1:
        db.session.rollback()
        raise _lease_lost(report)
    audit.record(actor, action, report.node_id, job_id=job.id, attempt=job.attempt, code=values["error"]["code"])
    db.session.commit()
    return db.session.get(Job, report.job_id, populate_existing=True)


def _terminal(state: str, error: dict[str, str]) -> dict[str, object]:
    return {"state": state, "error": error, "finished_at": utcnow(), "lease_expires_at": None}


def _requeue(attempt: int, error: dict[str, str]) -> dict[str, object]:
    delay = RETRY_BACKOFF_SECONDS[min(attempt, len(RETRY_BACKOFF_SECONDS) - 1)]
    return {
        "state": JobState.QUEUED,
        "error": error,
        "lease_expires_at": None,
        "not_before": utcnow() + timedelta(seconds=delay),
    }


LEASE_SWEEP = "job-leases"


def sweep_expired_leases(now: datetime | None = None, settings: Settings | None = None) -> dict[str, int]:
    """J2: a running job whose lease ran out goes back to the queue (next attempt) or fails.

    Each transition is a conditional UPDATE on (id, attempt, state, lease): a second sweep of the
    same tick, or a report that renewed the lease a moment earlier, makes it match nothing. A lease
    last renewed before the control plane could hear again is held (liveness.heard_since): its agent
    may only have been unable to reach a dead control plane, and requeueing it would run it twice.
    """
    now = now or utcnow()
    settings = settings or current_settings()
    expired_now = sa.and_(Job.state == JobState.RUNNING, Job.lease_expires_at < now)
    since = liveness.heard_since(LEASE_SWEEP, settings, now)
    if since is not None:  # a lease is renewed job_lease_seconds before it expires: since the return, or held
        renewed_since = since + timedelta(seconds=settings.job_lease_seconds)
        expired_now = sa.and_(expired_now, Job.lease_expires_at >= renewed_since)
    expired = db.session.execute(
        sa.select(Job.id, Job.node_id, Job.attempt, Job.max_attempts, Job.cancel_requested).where(expired_now)
    ).all()
    counts = {"requeued": 0, "failed": 0, "cancelled": 0}
    for job_id, node_id, attempt, max_attempts, cancel_requested in expired:
        lost = _error("JOB_LEASE_LOST", f"Attempt {attempt} stopped reporting; its lease ran out.")
        if cancel_requested:
            values, action, outcome = (
                _terminal(JobState.CANCELLED, _error("JOB_CANCELLED", "Cancelled by the operator.")),
                "job.cancelled",
                "cancelled",
            )
        elif attempt < max_attempts:
            values, action, outcome = {**_requeue(0, lost), "not_before": None}, "job.retried", "requeued"
        else:
            values, action, outcome = _terminal(JobState.FAILED, lost), "job.failed", "failed"
        moved = db.session.execute(
            sa.update(Job)
            .where(Job.id == job_id, Job.attempt == attempt, Job.state == JobState.RUNNING, Job.lease_expires_at < now)
            .values(**values)
            .execution_options(synchronize_session=False)
        ).rowcount
        if moved == 1:
            audit.record(audit.SYSTEM, action, node_id, job_id=job_id, attempt=attempt, code=values["error"]["code"])
            counts[outcome] += 1
    db.session.commit()
    return counts
