"""One-time enrolment tokens (E1–E5)."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat, utcnow


class EnrollmentState(enum.StrEnum):
    """Where an enrolment token is in its life."""

    PENDING = "pending"
    CONSUMED = "consumed"
    REVOKED = "revoked"
    EXPIRED = "expired"


class Enrollment(db.Model):
    """A single-use enrolment token, stored only as its SHA-256 hash (P2)."""

    __tablename__ = "enrollments"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    token_prefix: Mapped[str] = mapped_column(sa.String(16))
    display_name: Mapped[str] = mapped_column(sa.String(200))
    role: Mapped[str | None] = mapped_column(sa.String(100))
    labels: Mapped[dict[str, str]] = mapped_column(sa.JSON, default=dict)
    production_eligible: Mapped[bool] = mapped_column(default=False)
    lab_eligible: Mapped[bool] = mapped_column(default=False)
    benchmark_eligible: Mapped[bool] = mapped_column(default=False)
    api_origin: Mapped[str] = mapped_column(sa.String(300))
    state: Mapped[str] = mapped_column(sa.String(16), default=EnrollmentState.PENDING, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    node_id: Mapped[str | None] = mapped_column(sa.ForeignKey("nodes.id", ondelete="SET NULL"))
    # Console only (C4, D5): the agent image the wizard's commands start and check, so every step
    # of the wizard gives the same commands. Not part of the API's view of an enrolment.
    agent_image: Mapped[dict | None] = mapped_column(sa.JSON)

    def to_dict(self) -> dict[str, object]:
        """The enrolment as the API shows it: never the token."""
        data: dict[str, object] = {
            "id": self.id,
            "display_name": self.display_name,
            "state": self.state,
            "token_prefix": self.token_prefix,
            "created_at": isoformat(self.created_at),
            "expires_at": isoformat(self.expires_at),
            "api_origin": self.api_origin,
            "role": self.role,
            "labels": self.labels or {},
            "production_eligible": self.production_eligible,
            "lab_eligible": self.lab_eligible,
            "benchmark_eligible": self.benchmark_eligible,
            "revoked_at": isoformat(self.revoked_at),
        }
        if self.state == EnrollmentState.CONSUMED:
            data["node_id"] = self.node_id
            data["consumed_at"] = isoformat(self.consumed_at)
        return data
