"""What nodes do: storage roots, typed jobs under fenced leases, and the artifacts they leave (J1–J3)."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat, utcnow


def _uuid() -> str:
    return str(uuid.uuid4())


class StorageRoot(db.Model):
    """J1: a named place on a node where artifacts live; host and container paths are separate facts."""

    __tablename__ = "storage_roots"
    __table_args__ = (sa.UniqueConstraint("node_id", "name", name="uq_storage_roots_node_name"),)

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=_uuid)
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(100))
    host_path: Mapped[str] = mapped_column(sa.String(1000))
    container_path: Mapped[str] = mapped_column(sa.String(1000))
    min_free_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # What the agent last observed of it (null until it reports).
    observed_exists: Mapped[bool | None] = mapped_column()
    observed_writable: Mapped[bool | None] = mapped_column()
    observed_free_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    observed_total_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    observed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Why the agent refuses it ("parent not writable", "is a symlink"…); null while it can use it.
    observed_problem: Mapped[str | None] = mapped_column(sa.String(500))

    def to_dict(self) -> dict[str, object]:
        """The root as the API shows it."""
        observed = None
        if self.observed_at is not None:
            observed = {
                "exists": self.observed_exists,
                "writable": self.observed_writable,
                "free_bytes": self.observed_free_bytes,
                "total_bytes": self.observed_total_bytes,
                "observed_at": isoformat(self.observed_at),
                "problem": self.observed_problem,
            }
        return {
            "id": self.id,
            "node_id": self.node_id,
            "name": self.name,
            "host_path": self.host_path,
            "container_path": self.container_path,
            "min_free_bytes": self.min_free_bytes,
            "created_at": isoformat(self.created_at),
            "observed": observed,
        }


class JobState(enum.StrEnum):
    """J2: queued → running → succeeded | failed | cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Job(db.Model):
    """J2: one typed piece of work for one node, claimed under a lease fenced by its attempt number."""

    __tablename__ = "jobs"
    __table_args__ = (
        sa.Index("ix_jobs_node_state", "node_id", "state"),
        sa.Index("ix_jobs_state_lease", "state", "lease_expires_at"),
        sa.Index("ix_jobs_created", "created_at", "id"),
        # J2: one running job per node, held by the database itself, not by timing.
        sa.Index(
            "uq_jobs_one_running_per_node",
            "node_id",
            unique=True,
            sqlite_where=sa.text("state = 'running'"),
            postgresql_where=sa.text("state = 'running'"),
        ),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=_uuid)
    type: Mapped[str] = mapped_column(sa.String(64))
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"))
    storage_root_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("storage_roots.id", ondelete="RESTRICT"), index=True
    )
    # W2: the artifact a runtime job runs a model of; history outlives it (SET NULL). The cycle with
    # artifacts.job_id is broken by use_alter, so the tables still sort for create and truncate.
    artifact_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("artifacts.id", ondelete="SET NULL", use_alter=True, name="fk_jobs_artifact_id_artifacts"),
        index=True,
    )
    params: Mapped[dict[str, object]] = mapped_column(sa.JSON)
    state: Mapped[str] = mapped_column(sa.String(16), default=JobState.QUEUED)
    attempt: Mapped[int] = mapped_column(default=0)
    max_attempts: Mapped[int] = mapped_column(default=3)
    progress: Mapped[dict[str, object] | None] = mapped_column(sa.JSON)
    result: Mapped[dict[str, object] | None] = mapped_column(sa.JSON)
    error: Mapped[dict[str, object] | None] = mapped_column(sa.JSON)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A retried job waits this long before it may be claimed again (backoff, J2).
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    def to_dict(self) -> dict[str, object]:
        """The job as the API shows it."""
        return {
            "id": self.id,
            "type": self.type,
            "node_id": self.node_id,
            "state": self.state,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "params": self.params,
            "progress": self.progress,
            "result": self.result,
            "error": self.error,
            "cancel_requested": self.cancel_requested,
            "lease_expires_at": isoformat(self.lease_expires_at),
            "created_at": isoformat(self.created_at),
            "started_at": isoformat(self.started_at),
            "finished_at": isoformat(self.finished_at),
        }


class Artifact(db.Model):
    """J3: a repository revision acquired and verified on one node, at one commit."""

    __tablename__ = "artifacts"
    __table_args__ = (
        sa.UniqueConstraint("storage_root_id", "repo_type", "repo_id", "commit", name="uq_artifacts_place"),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=_uuid)
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    storage_root_id: Mapped[str] = mapped_column(sa.ForeignKey("storage_roots.id", ondelete="CASCADE"))
    repo_id: Mapped[str] = mapped_column(sa.String(200))
    repo_type: Mapped[str] = mapped_column(sa.String(16))
    revision: Mapped[str] = mapped_column(sa.String(200))
    commit: Mapped[str] = mapped_column(sa.String(40))
    container_path: Mapped[str] = mapped_column(sa.String(2000))
    host_path: Mapped[str] = mapped_column(sa.String(2000))
    files: Mapped[int] = mapped_column()
    total_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    verified_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # S3: each GGUF file's header facts (or `problem`), by path, as the acquire job read them on the node.
    models: Mapped[dict[str, dict[str, object]] | None] = mapped_column(sa.JSON)
    job_id: Mapped[str | None] = mapped_column(sa.ForeignKey("jobs.id", ondelete="SET NULL"))

    def to_dict(self) -> dict[str, object]:
        """The artifact as the API shows it."""
        return {
            "id": self.id,
            "node_id": self.node_id,
            "repo_id": self.repo_id,
            "repo_type": self.repo_type,
            "revision": self.revision,
            "commit": self.commit,
            "storage_root_id": self.storage_root_id,
            "container_path": self.container_path,
            "host_path": self.host_path,
            "files": self.files,
            "total_bytes": self.total_bytes,
            "verified_at": isoformat(self.verified_at),
            "job_id": self.job_id,
            "models": self.models,
        }
