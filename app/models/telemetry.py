"""Measured per-GPU telemetry (N4): what NVML read, never invented (P3).

Raw samples are the bulk of the database, so they are kept narrow: an integer GPU key and
epoch milliseconds, clustered on (gpu_id, sampled_at) — on SQLite a WITHOUT ROWID table, so
the primary key is the table and no second copy of it exists. Retention folds samples older
than the raw window into 5-minute rollups (app/nodes/retention.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import isoformat

METRICS = ("utilization_gpu_percent", "memory_used_bytes", "temperature_c", "power_w")


class EpochMillis(sa.types.TypeDecorator):
    """An aware UTC datetime stored as integer milliseconds since the epoch."""

    impl = sa.BigInteger
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if isinstance(value, int):
            return value
        return int(value.timestamp() * 1000)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return datetime.fromtimestamp(value / 1000, UTC)


class TelemetrySample(db.Model):
    """One GPU sample; a metric NVML could not read stays NULL."""

    __tablename__ = "telemetry_samples"
    __table_args__ = (
        # Retention deletes by time. Samples arrive in time order, so on PostgreSQL a BRIN
        # index (a few pages) does what a B-tree would at a fraction of the size.
        sa.Index("ix_telemetry_samples_sampled_at", "sampled_at", postgresql_using="brin"),
        {"sqlite_with_rowid": False},
    )

    gpu_id: Mapped[int] = mapped_column(sa.ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True)
    sampled_at: Mapped[datetime] = mapped_column(EpochMillis, primary_key=True)
    utilization_gpu_percent: Mapped[float | None] = mapped_column(sa.Float)
    memory_used_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    temperature_c: Mapped[float | None] = mapped_column(sa.Float)
    power_w: Mapped[float | None] = mapped_column(sa.Float)


class TelemetryRollup(db.Model):
    """Sums, counts and maxima of one GPU's samples in one 5-minute bucket.

    Sums and counts (not averages) so that two partial rollups of one bucket — a late sample
    folded after its bucket was — still combine exactly.
    """

    __tablename__ = "telemetry_rollups"
    __table_args__ = (
        sa.Index("ix_telemetry_rollups_gpu_bucket", "gpu_id", "bucket_start"),
        sa.Index("ix_telemetry_rollups_bucket", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    gpu_id: Mapped[int] = mapped_column(sa.ForeignKey("gpus.id", ondelete="CASCADE"))
    bucket_start: Mapped[datetime] = mapped_column(EpochMillis)
    samples: Mapped[int] = mapped_column()
    utilization_sum: Mapped[float | None] = mapped_column(sa.Float)
    utilization_count: Mapped[int] = mapped_column(default=0)
    utilization_max: Mapped[float | None] = mapped_column(sa.Float)
    memory_used_sum: Mapped[float | None] = mapped_column(sa.Float)
    memory_used_count: Mapped[int] = mapped_column(default=0)
    memory_used_max: Mapped[int | None] = mapped_column(sa.BigInteger)
    temperature_sum: Mapped[float | None] = mapped_column(sa.Float)
    temperature_count: Mapped[int] = mapped_column(default=0)
    temperature_max: Mapped[float | None] = mapped_column(sa.Float)
    power_sum: Mapped[float | None] = mapped_column(sa.Float)
    power_count: Mapped[int] = mapped_column(default=0)
    power_max: Mapped[float | None] = mapped_column(sa.Float)


def sample_dict(gpu_uuid: str, row) -> dict[str, object]:
    """A stored sample in the wire format."""
    return {
        "gpu_uuid": gpu_uuid,
        "sampled_at": isoformat(row.sampled_at),
        **{metric: getattr(row, metric) for metric in METRICS},
    }
