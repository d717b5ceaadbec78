"""Operator console sessions (C1): a server-side record that sign-out ends."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, utcnow


class OperatorSession(db.Model):
    """One signed-in browser; the cookie holds the session id, the table only its SHA-256 (P2)."""

    __tablename__ = "operator_sessions"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    # The one indexed lookup each console request makes.
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    # For display only; never used to decide anything.
    remote_addr: Mapped[str | None] = mapped_column(sa.String(64))
    user_agent: Mapped[str | None] = mapped_column(sa.String(200))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
