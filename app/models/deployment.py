"""Deployments (S2): an acquired GGUF artifact kept loaded on one node under a name clients use."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.rules import MAX_DEPLOYMENT_NAME_LENGTH, MAX_PATH_LENGTH
from app.timeutil import UTCDateTime, isoformat, utcnow


class DeploymentState(enum.StrEnum):
    """S2: where a deployment is."""

    PENDING = "pending"  # created; the node has not taken it yet
    LOADING = "loading"
    READY = "ready"
    UNLOADED = "unloaded"  # idle for idle_unload_seconds: its memory freed; the next request loads it
    FAILED = "failed"
    STOPPING = "stopping"  # deleted; waiting for the node to confirm
    STOPPED = "stopped"


class Deployment(db.Model):
    """S2: one model file of one artifact, served by the node placement chose (S3), which holds it."""

    __tablename__ = "deployments"
    __table_args__ = (
        # S2: a name is what clients send as `model`, so at most one deployment that is not stopped holds it.
        sa.Index(
            "uq_deployments_live_name",
            "name",
            unique=True,
            sqlite_where=sa.text("state != 'stopped'"),
            postgresql_where=sa.text("state != 'stopped'"),
        ),
        sa.Index("ix_deployments_node_state", "node_id", "state"),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    name: Mapped[str] = mapped_column(sa.String(MAX_DEPLOYMENT_NAME_LENGTH))
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"))
    artifact_id: Mapped[str] = mapped_column(sa.ForeignKey("artifacts.id", ondelete="CASCADE"), index=True)
    model_file: Mapped[str] = mapped_column(sa.String(MAX_PATH_LENGTH))
    tier: Mapped[str] = mapped_column(sa.String(16), default="lab")
    # None: the model's own context length (the worker caps it at 8192).
    context_length: Mapped[int | None] = mapped_column()
    n_gpu_layers: Mapped[int | None] = mapped_column()  # None: every layer on the GPU
    idle_unload_seconds: Mapped[int] = mapped_column(default=900)  # 0 keeps it loaded
    state: Mapped[str] = mapped_column(sa.String(16), default=DeploymentState.PENDING)
    error_code: Mapped[str | None] = mapped_column(sa.String(64))
    error_message: Mapped[str | None] = mapped_column(sa.String(1000))
    error_next_step: Mapped[str | None] = mapped_column(sa.String(500))
    # As the node reported them: load_seconds, memory_bytes, context_length.
    measured: Mapped[dict[str, object] | None] = mapped_column(sa.JSON)
    # What the control plane saw of its requests (serving.deployments.note_served): requests and
    # generated_tokens since it was created, time_to_first_token_seconds and tokens_per_second of
    # the last one answered.
    served: Mapped[dict[str, object] | None] = mapped_column(sa.JSON)
    # {"node_id", "why"}: which node and why it was chosen (S3 will add the estimate).
    placement: Mapped[dict[str, object]] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_request_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    def error(self) -> dict[str, str | None] | None:
        """Why it failed, in the API's error style, or None."""
        if self.error_code is None:
            return None
        return {"code": self.error_code, "message": self.error_message, "next_step": self.error_next_step}

    def to_dict(self) -> dict[str, object]:
        """The deployment as the admin API shows it."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "node_id": self.node_id,
            "artifact_id": self.artifact_id,
            "model_file": self.model_file,
            "tier": self.tier,
            "context_length": self.context_length,
            "n_gpu_layers": self.n_gpu_layers,
            "idle_unload_seconds": self.idle_unload_seconds,
            "placement": self.placement,
            "error": self.error(),
            "created_at": isoformat(self.created_at),
            "ready_at": isoformat(self.ready_at),
            "last_request_at": isoformat(self.last_request_at),
            "measured": {**(self.measured or {}), **(self.served or {})} or None,
        }
