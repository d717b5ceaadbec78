"""Periodic work that must run exactly once per tick across workers and replicas (L3)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime


class SweepTick(db.Model):
    """The last tick of one sweep that some scheduler claimed, and how many runs it has had."""

    __tablename__ = "sweep_ticks"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    last_tick: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    holder: Mapped[str | None] = mapped_column(sa.String(200))
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    runs: Mapped[int] = mapped_column(sa.BigInteger, default=0)
