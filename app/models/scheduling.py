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
    # O1: how long the sweep took, measured by the scheduler that ran it, for GET /metrics.
    # In the database, not in one process's memory, because sweeps run in their own process
    # and on whichever replica claimed the tick.
    last_duration_seconds: Mapped[float | None] = mapped_column(sa.Float)
    last_finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    duration_seconds_total: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    completed_runs: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
    # L1, J2: since when the control plane could hear again, after a time it could not (its database
    # was down or full, or no scheduler ran). Silence before it is not held against a node or a job
    # until every live agent has had time to come back (app.nodes.liveness.hearing_hold_seconds).
    heard_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
