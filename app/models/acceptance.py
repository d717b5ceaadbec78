"""Acceptance evidence per node (V1): stored observations, and uploaded screenshots' metadata."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat


class AcceptanceEvidence(db.Model):
    """One checklist item's stored observation for one node: the latest one wins.

    Only items that cannot be read back later are stored here (the pasted container status, the
    captured node API output, the restart identity comparison); the others are derived when asked
    from what the control plane already keeps (inventory, audit trail, jobs, screenshots).
    """

    __tablename__ = "acceptance_evidence"
    __table_args__ = (sa.UniqueConstraint("node_id", "item", name="uq_acceptance_evidence_node_item"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    item: Mapped[str] = mapped_column(sa.String(32))
    state: Mapped[str] = mapped_column(sa.String(16))
    observed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    source: Mapped[str] = mapped_column(sa.String(100))
    detail: Mapped[str] = mapped_column(sa.String(1000))
    evidence: Mapped[dict[str, object]] = mapped_column(sa.JSON, default=dict)


class AcceptanceScreenshot(db.Model):
    """An uploaded UI screenshot: the file lives under the instance path, the row holds its metadata."""

    __tablename__ = "acceptance_screenshots"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(sa.String(200))
    content_type: Mapped[str] = mapped_column(sa.String(32))
    size_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    width: Mapped[int] = mapped_column()
    height: Mapped[int] = mapped_column()
    uploaded_at: Mapped[datetime] = mapped_column(UTCDateTime)
    uploaded_by: Mapped[str] = mapped_column(sa.String(100))

    def to_dict(self) -> dict[str, object]:
        """The screenshot's metadata as the API shows it."""
        return {
            "id": self.id,
            "filename": self.filename,
            "content_type": self.content_type,
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "width": self.width,
            "height": self.height,
            "uploaded_at": isoformat(self.uploaded_at),
        }
