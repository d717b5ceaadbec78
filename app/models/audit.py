"""Audit events (P4): who did what to which node, when — never a secret."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat, utcnow


class AuditEvent(db.Model):
    """One state change."""

    __tablename__ = "audit_events"
    __table_args__ = (sa.Index("ix_audit_node_id_id", "node_id", "id"),)

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(sa.String(100))
    action: Mapped[str] = mapped_column(sa.String(64), index=True)
    # No foreign key: the trail outlives what it describes.
    node_id: Mapped[str | None] = mapped_column(sa.String(36))
    details: Mapped[dict[str, object]] = mapped_column(sa.JSON, default=dict)

    def to_dict(self) -> dict[str, object]:
        """The event as the API shows it."""
        return {
            "id": self.id,
            "at": isoformat(self.at),
            "actor": self.actor,
            "action": self.action,
            "node_id": self.node_id,
            "details": self.details or {},
        }
