"""Node credentials (I2, I5): stored as SHA-256, at most one active per node.

A credential an enrolment issued remembers that enrolment, and the moment it was first presented:
a lost enrol reply may be retried for a fresh one only while it was never used (E2, issue 14).
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat, utcnow


class Credential(db.Model):
    """A node's bearer credential; the secret itself is never stored."""

    __tablename__ = "credentials"
    __table_args__ = (
        # I4/I5: the database itself refuses a second active credential for one node.
        sa.Index(
            "uq_credentials_one_active_per_node",
            "node_id",
            unique=True,
            sqlite_where=sa.text("revoked_at IS NULL"),
            postgresql_where=sa.text("revoked_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    prefix: Mapped[str] = mapped_column(sa.String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_reason: Mapped[str | None] = mapped_column(sa.String(32))
    # The enrolment whose claim issued it; None for a rotated credential (I5), never reissued.
    enrollment_id: Mapped[str | None] = mapped_column(sa.ForeignKey("enrollments.id", ondelete="SET NULL"))
    # Set once, by the first authenticated agent call (app.nodes.publishing.authenticate), never again.
    first_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    @property
    def active(self) -> bool:
        """Whether this credential is still accepted."""
        return self.revoked_at is None

    def to_dict(self) -> dict[str, object]:
        """Metadata only: never the secret or its hash."""
        return {
            "id": self.id,
            "prefix": self.prefix,
            "created_at": isoformat(self.created_at),
            "active": self.active,
            "revoked_at": isoformat(self.revoked_at),
            "revoked_reason": self.revoked_reason,
        }
