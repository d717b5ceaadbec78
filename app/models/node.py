"""Nodes, and their liveness lease kept apart from everything else they publish."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, utcnow


class Node(db.Model):
    """A compute node, identified by the UUID its agent created (I1)."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    display_name: Mapped[str] = mapped_column(sa.String(200))
    hostname: Mapped[str] = mapped_column(sa.String(255), index=True)
    role: Mapped[str | None] = mapped_column(sa.String(100))
    labels: Mapped[dict[str, str]] = mapped_column(sa.JSON, default=dict)
    production_eligible: Mapped[bool] = mapped_column(default=False)
    lab_eligible: Mapped[bool] = mapped_column(default=False)
    benchmark_eligible: Mapped[bool] = mapped_column(default=False)
    disabled: Mapped[bool] = mapped_column(default=False)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # S3: finishes what runs, takes no new job or deployment, until undrained.
    draining: Mapped[bool] = mapped_column(server_default=sa.false())
    draining_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    enrolled_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The last time (at most one write a minute) an agent reporting this node's GPUs presented a
    # credential this control plane does not know: after a restore, one re-enrolled or rotated
    # since the backup (app.api.auth.note_refused_credential; the secret itself is never kept).
    credential_refused_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class NodeLease(db.Model):
    """The liveness write: one small row per node, touched by every heartbeat.

    Like Kubernetes node leases, it is kept apart from inventory and telemetry so the hot
    path updates one narrow row and nothing else contends with it.
    """

    __tablename__ = "node_leases"
    # L3: the liveness sweep's conditional UPDATEs probe (status, last heartbeat) together.
    __table_args__ = (sa.Index("ix_node_leases_status_heartbeat", "status", "last_heartbeat_at"),)

    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(sa.String(16), default="pending")
    health_status: Mapped[str | None] = mapped_column(sa.String(16))
    health_detail: Mapped[str | None] = mapped_column(sa.String(1000))
    agent_version: Mapped[str | None] = mapped_column(sa.String(64))
    protocol_version: Mapped[int | None] = mapped_column()
    compatibility: Mapped[str | None] = mapped_column(sa.String(16))
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # J2: the job types the agent last advertised (its inventory), read on each heartbeat for
    # `jobs_waiting`; and a counter bumped whenever the node's storage roots change, which the
    # heartbeat reply hands the agent as an etag so it fetches the list only when it moved (J1).
    capabilities: Mapped[list[str]] = mapped_column(sa.JSON, default=list, server_default="[]")
    storage_roots_version: Mapped[int] = mapped_column(default=0, server_default="0")
    # S2: bumped with every change to the node's desired deployments (create, delete), and handed to
    # the agent as `deployments_etag` the same way.
    deployments_version: Mapped[int] = mapped_column(default=0, server_default="0")
    # W1: the runtime worker as the agent last reported it (inventory): its facts, or why none
    # answered, and the compatibility answer for its protocol; runtime.* capabilities are kept
    # only while that answer is COMPATIBLE.
    runtime_worker: Mapped[dict[str, object] | None] = mapped_column(sa.JSON)
    runtime_worker_problem: Mapped[str | None] = mapped_column(sa.String(500))
    worker_compatibility: Mapped[str | None] = mapped_column(sa.String(16))
