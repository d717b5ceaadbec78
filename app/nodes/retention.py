"""Telemetry retention: raw samples for a bounded window, 5-minute rollups for longer (N4, L3)."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from app.config import Settings
from app.extensions import db
from app.models import TelemetryRollup, TelemetrySample
from app.timeutil import utcnow

BUCKET_MS = 5 * 60 * 1000
_samples = TelemetrySample.__table__
_rollups = TelemetryRollup.__table__


# Each metric's column prefix in a rollup row: <prefix>_sum, <prefix>_count, <prefix>_max.
ROLLUP_PREFIXES = {
    "utilization_gpu_percent": "utilization",
    "memory_used_bytes": "memory_used",
    "temperature_c": "temperature",
    "power_w": "power",
}


def epoch_ms(moment: datetime) -> int:
    """A moment as the sampled_at and bucket_start columns store it (EpochMillis)."""
    return int(moment.timestamp() * 1000)


def _folded_columns():
    """sum, count and max of each metric over one GPU-bucket group."""
    columns = []
    for metric, prefix in ROLLUP_PREFIXES.items():
        column = _samples.c[metric]
        columns += [
            (f"{prefix}_sum", sa.func.sum(column)),
            (f"{prefix}_count", sa.func.count(column)),
            (f"{prefix}_max", sa.func.max(column)),
        ]
    return columns


def sweep(settings: Settings, now: datetime | None = None) -> dict[str, int]:
    """Fold raw samples older than the raw window into rollups, delete them, prune old rollups.

    All set-based on the indexed sampled_at/bucket_start columns; the cutoff is aligned to a
    bucket boundary so a bucket is folded whole.
    """
    now = now or utcnow()
    raw_cutoff = epoch_ms(now - timedelta(seconds=settings.telemetry_raw_retention_seconds))
    raw_cutoff -= raw_cutoff % BUCKET_MS
    rollup_cutoff = epoch_ms(now - timedelta(seconds=settings.telemetry_rollup_retention_seconds))
    sampled_at = sa.type_coerce(_samples.c.sampled_at, sa.BigInteger)
    # Integer division in both SQLite and PostgreSQL (the operands are integers).
    bucket = (sampled_at.op("/")(BUCKET_MS) * BUCKET_MS).label("bucket_start")
    folded = _folded_columns()
    select = (
        sa.select(
            _samples.c.gpu_id, bucket, sa.func.count().label("samples"), *(expr.label(name) for name, expr in folded)
        )
        .where(sampled_at < raw_cutoff)
        .group_by(_samples.c.gpu_id, bucket)
    )
    connection = db.session.connection()
    columns = ["gpu_id", "bucket_start", "samples", *(name for name, _ in folded)]
    rolled = connection.execute(_rollups.insert().from_select(columns, select)).rowcount
    deleted = connection.execute(_samples.delete().where(sampled_at < raw_cutoff)).rowcount
    pruned = connection.execute(
        _rollups.delete().where(sa.type_coerce(_rollups.c.bucket_start, sa.BigInteger) < rollup_cutoff)
    ).rowcount
    db.session.commit()
    return {"rollups_written": max(rolled, 0), "samples_deleted": deleted, "rollups_pruned": pruned}
