"""A node's measured GPU telemetry over a window, as chartable series (C3, P3).

Missing data stays missing (P3): a metric NVML could not read, or a stretch of time with no
samples, is a None point, a gap for the chart, never a zero and never an interpolation.

Raw samples come back as they are (the last hour). With a bucket (the last day, 5 minutes),
raw samples are averaged per bucket in SQL and merged with the retention rollups
(app/nodes/retention.py), whose sums and counts combine with the raw ones exactly. Either way the
number of queries is fixed however many GPUs the node has.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from app.extensions import db
from app.models import Gpu, TelemetryRollup, TelemetrySample
from app.models.telemetry import METRICS
from app.nodes.retention import BUCKET_MS, ROLLUP_PREFIXES, epoch_ms

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Point = tuple[datetime, float | None]


@dataclass(frozen=True)
class Series:
    """One metric of one GPU over a window, time-ordered; a None value is a gap."""

    metric: str
    points: list[Point]


def history(
    node_id: str,
    window: timedelta,
    now: datetime,
    *,
    bucket: timedelta | None = None,
    max_gap: timedelta | None = None,
) -> dict[str, dict[str, Series]]:
    """gpu_uuid -> metric -> Series for this node's GPUs over [now - window, now].

    Without `bucket`, the raw samples in the window; `max_gap`, if given, puts a None between
    two consecutive samples further apart than that (the agent was away: a gap, not a line).
    With `bucket` (a whole number of 5-minute rollup buckets), one point per bucket at its
    start — the average of the raw samples and rollups in it — for the whole buckets that
    start in the window; an empty stretch of buckets is one None point.
    GPUs come in (pci_bus_id, uuid) order, metrics in METRICS order.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if window <= timedelta(0):
        raise ValueError("window must be positive")
    bucket_ms = None
    if bucket is not None:
        bucket_ms = _millis(bucket)
        # A rollup cannot be split across buckets without inventing how its samples fell (P3).
        if bucket_ms <= 0 or bucket_ms % BUCKET_MS:
            raise ValueError(f"bucket must be a positive multiple of {BUCKET_MS // 60_000} minutes")
    gpus = db.session.execute(
        sa.select(Gpu.id, Gpu.uuid).where(Gpu.node_id == node_id).order_by(Gpu.pci_bus_id, Gpu.uuid)
    ).all()
    if not gpus:
        return {}
    gpu_ids = [gpu_id for gpu_id, _ in gpus]
    start_ms, end_ms = epoch_ms(now - window), epoch_ms(now)
    if bucket_ms is None:
        by_gpu = _raw_series(gpu_ids, start_ms, end_ms, max_gap)
    else:
        by_gpu = _bucketed_series(gpu_ids, start_ms, end_ms, bucket_ms)
    return {
        uuid: {metric: Series(metric, by_gpu.get(gpu_id, {}).get(metric, [])) for metric in METRICS}
        for gpu_id, uuid in gpus
    }


def _millis(span: timedelta) -> int:
    """A timedelta in whole milliseconds, exactly (no float round trip)."""
    return span // timedelta(milliseconds=1)


def _moment(epoch_ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=epoch_ms)


def _raw_series(
    gpu_ids: list[int], start_ms: int, end_ms: int, max_gap: timedelta | None
) -> dict[int, dict[str, list[Point]]]:
    """The raw samples of these GPUs in [start, end], in one query on the (gpu_id, sampled_at) key."""
    sampled_at = sa.type_coerce(TelemetrySample.sampled_at, sa.BigInteger)
    rows = db.session.execute(
        sa.select(TelemetrySample.gpu_id, TelemetrySample.sampled_at, *(getattr(TelemetrySample, m) for m in METRICS))
        .where(TelemetrySample.gpu_id.in_(gpu_ids), sampled_at >= start_ms, sampled_at <= end_ms)
        .order_by(TelemetrySample.gpu_id, TelemetrySample.sampled_at)
    )
    series: dict[int, dict[str, list[Point]]] = defaultdict(lambda: defaultdict(list))
    previous: dict[int, datetime] = {}
    for gpu_id, moment, *values in rows:
        last = previous.get(gpu_id)
        away = max_gap is not None and last is not None and moment - last > max_gap
        previous[gpu_id] = moment
        for metric, value in zip(METRICS, values, strict=True):
            points = series[gpu_id][metric]
            if away and points[-1][1] is not None:
                points.append((last + max_gap, None))
            points.append((moment, None if value is None else float(value)))
    return series


def _bucketed_series(
    gpu_ids: list[int], start_ms: int, end_ms: int, bucket_ms: int
) -> dict[int, dict[str, list[Point]]]:
    """Per-bucket averages of raw samples and rollups: two grouped queries, one point per bucket."""
    first = -(-start_ms // bucket_ms)  # the first bucket that starts inside the window
    last = end_ms // bucket_ms  # the bucket in progress at `now`
    moments = [_moment(index * bucket_ms) for index in range(first, last + 1)]
    # (gpu_id, metric) -> per-bucket sums and counts, raw and rollup parts added together.
    sums = {(gpu_id, metric): [0.0] * len(moments) for gpu_id in gpu_ids for metric in METRICS}
    counts = {(gpu_id, metric): [0] * len(moments) for gpu_id in gpu_ids for metric in METRICS}
    grouped = (
        _raw_buckets(gpu_ids, first * bucket_ms, end_ms, bucket_ms),
        _rollup_buckets(gpu_ids, first * bucket_ms, end_ms, bucket_ms),
    )
    for rows in grouped:
        for gpu_id, index, *sums_counts in rows:
            for position, metric in enumerate(METRICS):
                count = sums_counts[2 * position + 1]
                if count:
                    # float(): PostgreSQL sums BIGINT as NUMERIC (a Decimal).
                    sums[gpu_id, metric][index - first] += float(sums_counts[2 * position])
                    counts[gpu_id, metric][index - first] += int(count)
    series: dict[int, dict[str, list[Point]]] = {gpu_id: {} for gpu_id in gpu_ids}
    for (gpu_id, metric), bucket_sums in sums.items():
        points: list[Point] = []
        for moment, total, count in zip(moments, bucket_sums, counts[gpu_id, metric], strict=True):
            # Consecutive empty buckets collapse into the first one: one gap, small output.
            if count:
                points.append((moment, total / count))
            elif not points or points[-1][1] is not None:
                points.append((moment, None))
        series[gpu_id][metric] = points
    return series


def _bucket_index(column, bucket_ms: int):
    """epoch-ms column // bucket: integer division on SQLite and PostgreSQL (both operands BIGINT).

    The divisor is rendered inline so the SELECT and GROUP BY expressions are the same text.
    """
    divisor = sa.literal(bucket_ms, sa.BigInteger, literal_execute=True)
    return (sa.type_coerce(column, sa.BigInteger) // divisor).label("bucket_index")


def _raw_buckets(gpu_ids: list[int], start_ms: int, end_ms: int, bucket_ms: int):
    """(gpu_id, bucket index, sum, count per metric) of raw samples, grouped in SQL."""
    sampled_at = sa.type_coerce(TelemetrySample.sampled_at, sa.BigInteger)
    index = _bucket_index(TelemetrySample.sampled_at, bucket_ms)
    aggregates = []
    for metric in METRICS:
        column = getattr(TelemetrySample, metric)
        aggregates += [sa.func.sum(column), sa.func.count(column)]
    return db.session.execute(
        sa.select(TelemetrySample.gpu_id, index, *aggregates)
        .where(TelemetrySample.gpu_id.in_(gpu_ids), sampled_at >= start_ms, sampled_at <= end_ms)
        .group_by(TelemetrySample.gpu_id, index)
    )


def _rollup_buckets(gpu_ids: list[int], start_ms: int, end_ms: int, bucket_ms: int):
    """(gpu_id, bucket index, sum, count per metric) of rollups; several rollups of one bucket add up."""
    bucket_start = sa.type_coerce(TelemetryRollup.bucket_start, sa.BigInteger)
    index = _bucket_index(TelemetryRollup.bucket_start, bucket_ms)
    aggregates = []
    for metric in METRICS:
        prefix = ROLLUP_PREFIXES[metric]
        aggregates += [
            sa.func.sum(getattr(TelemetryRollup, f"{prefix}_sum")),
            sa.func.sum(getattr(TelemetryRollup, f"{prefix}_count")),
        ]
    return db.session.execute(
        sa.select(TelemetryRollup.gpu_id, index, *aggregates)
        .where(TelemetryRollup.gpu_id.in_(gpu_ids), bucket_start >= start_ms, bucket_start <= end_ms)
        .group_by(TelemetryRollup.gpu_id, index)
    )
