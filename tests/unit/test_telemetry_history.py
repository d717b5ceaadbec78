"""A node's telemetry as chart series: raw for the hour, 5-minute buckets for the day (C3, N4, P3)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import Gpu, Node, TelemetryRollup, TelemetrySample
from app.models.telemetry import METRICS
from app.nodes.telemetry_history import Series, history

NOW = datetime(2026, 3, 10, 12, 2, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
FIVE_MINUTES = timedelta(minutes=5)
TODAY = datetime(2026, 3, 10, tzinfo=UTC)
YESTERDAY = TODAY - DAY
# The day window starts at 12:02:30 yesterday; its first whole bucket is yesterday 12:05.
FIRST_BUCKET = YESTERDAY + timedelta(hours=12, minutes=5)


def at(hours: int, minutes: int = 0, seconds: float = 0, day: datetime = TODAY) -> datetime:
    return day + timedelta(hours=hours, minutes=minutes, seconds=seconds)


@pytest.fixture
def ctx(app):
    with app.app_context():
        yield
        db.session.rollback()


def add_node(gpus: list[tuple[str, str | None]]) -> tuple[str, dict[str, int]]:
    """A node with GPUs given as (uuid, pci_bus_id); returns its id and {uuid: gpu id}."""
    node = Node(id=str(uuid.uuid4()), display_name="GPU Node", hostname="gpu-node-1")
    db.session.add(node)
    db.session.flush()  # no relationship orders the inserts: the node first, for the foreign key
    rows = [
        Gpu(node_id=node.id, uuid=gpu_uuid, name="RTX", pci_bus_id=bus, first_seen_at=NOW, last_seen_at=NOW)
        for gpu_uuid, bus in gpus
    ]
    db.session.add_all(rows)
    db.session.commit()
    return node.id, {row.uuid: row.id for row in rows}


def sample(gpu_id: int, moment: datetime, util=None, memory=None, temperature=None, power=None) -> TelemetrySample:
    return TelemetrySample(
        gpu_id=gpu_id,
        sampled_at=moment,
        utilization_gpu_percent=util,
        memory_used_bytes=memory,
        temperature_c=temperature,
        power_w=power,
    )


def rollup(gpu_id: int, bucket_start: datetime, **metrics: tuple[float | None, int]) -> TelemetryRollup:
    """A rollup row; each metric given as prefix=(sum, count), absent ones empty."""
    columns: dict[str, object] = {}
    for prefix in ("utilization", "memory_used", "temperature", "power"):
        total, count = metrics.get(prefix, (None, 0))
        columns[f"{prefix}_sum"] = total
        columns[f"{prefix}_count"] = count
    samples = max(count for _, count in metrics.values()) if metrics else 0
    return TelemetryRollup(gpu_id=gpu_id, bucket_start=bucket_start, samples=samples, **columns)


def values(series: Series) -> list[tuple[datetime, float | None]]:
    return list(series.points)


def test_raw_hour_returns_the_samples_in_the_window_as_they_are(ctx):
    node_id, gpus = add_node([("GPU-z", "00000000:01:00.0"), ("GPU-a", "00000000:02:00.0")])
    other_node, other_gpus = add_node([("GPU-other", "00000000:01:00.0")])
    gpu = gpus["GPU-z"]
    db.session.add_all(
        [
            sample(gpu, at(11, 0), util=1, memory=1, temperature=1, power=1),  # before the window
            sample(gpu, at(11, 2, 30), util=10, memory=2**30, temperature=40, power=100.5),  # exactly at its start
            sample(gpu, at(11, 30), util=20, memory=None, temperature=41, power=None),  # NotSupported stays None
            sample(gpu, at(12, 2, 30), util=30, memory=2**31, temperature=42, power=102),  # exactly now
            sample(gpu, at(12, 2, 45), util=99, memory=9, temperature=99, power=999),  # after now
            sample(other_gpus["GPU-other"], at(11, 30), util=55, memory=5, temperature=55, power=55),
        ]
    )
    db.session.commit()

    result = history(node_id, HOUR, NOW)

    assert list(result) == ["GPU-z", "GPU-a"]  # pci_bus_id first, then uuid
    assert all(list(by_metric) == list(METRICS) for by_metric in result.values())
    series = result["GPU-z"]
    assert series["utilization_gpu_percent"] == Series(
        "utilization_gpu_percent", [(at(11, 2, 30), 10.0), (at(11, 30), 20.0), (at(12, 2, 30), 30.0)]
    )
    assert values(series["memory_used_bytes"]) == [
        (at(11, 2, 30), float(2**30)),
        (at(11, 30), None),
        (at(12, 2, 30), float(2**31)),
    ]
    assert values(series["power_w"]) == [(at(11, 2, 30), 100.5), (at(11, 30), None), (at(12, 2, 30), 102.0)]
    assert all(series.points == [] for series in result["GPU-a"].values())
    assert list(history(other_node, HOUR, NOW)) == ["GPU-other"]
    assert history(str(uuid.uuid4()), HOUR, NOW) == {}


def test_raw_hour_breaks_the_line_where_samples_stop_for_longer_than_max_gap(ctx):
    node_id, gpus = add_node([("GPU-0", "00000000:01:00.0")])
    gpu = gpus["GPU-0"]
    db.session.add_all(
        [
            sample(gpu, at(11, 30), util=10, memory=None),
            sample(gpu, at(11, 30, 15), util=11, memory=None),
            sample(gpu, at(11, 40), util=12, memory=5),  # the agent was away for 9:45
            sample(gpu, at(11, 40, 15), util=13, memory=6),
        ]
    )
    db.session.commit()

    series = history(node_id, HOUR, NOW, max_gap=timedelta(seconds=60))["GPU-0"]

    assert values(series["utilization_gpu_percent"]) == [
        (at(11, 30), 10.0),
        (at(11, 30, 15), 11.0),
        (at(11, 31, 15), None),
        (at(11, 40), 12.0),
        (at(11, 40, 15), 13.0),
    ]
    # Already a gap before the absence: no second None.
    assert values(series["memory_used_bytes"]) == [
        (at(11, 30), None),
        (at(11, 30, 15), None),
        (at(11, 40), 5.0),
        (at(11, 40, 15), 6.0),
    ]
    # Without max_gap the samples come back as they are.
    assert len(history(node_id, HOUR, NOW)["GPU-0"]["utilization_gpu_percent"].points) == 4


def test_day_buckets_average_raw_samples_and_rollups_exactly_and_leave_gaps(ctx):
    node_id, gpus = add_node([("GPU-z", "00000000:01:00.0"), ("GPU-a", "00000000:02:00.0")])
    _, other_gpus = add_node([("GPU-other", "00000000:01:00.0")])
    gpu = gpus["GPU-z"]
    db.session.add_all(
        [
            # Older than the raw window: only a rollup. util 500/10, memory 1e10/10, power 1000/10.
            rollup(gpu, at(8, 0), utilization=(500.0, 10), memory_used=(1e10, 10), power=(1000.0, 10)),
            # The 11:00 bucket: three raw samples, and two rollups of the same bucket (a late sample folded).
            sample(gpu, at(11, 0), util=10, memory=1000, power=100),
            sample(gpu, at(11, 1), util=20, memory=None, power=110),
            sample(gpu, at(11, 4, 59.999), util=30, memory=3000, power=120),
            rollup(gpu, at(11, 0), utilization=(90.0, 3), memory_used=(6000.0, 2), power=(330.0, 3)),
            rollup(gpu, at(11, 0), utilization=(40.0, 2)),
            # 11:05 empty; 11:10 one raw sample; 11:15 .. 11:55 empty; 12:00 the sample at `now`.
            sample(gpu, at(11, 10), util=5, memory=7, power=50),
            sample(gpu, at(12, 2, 30), util=99, memory=2**33, power=300),
            # Outside: the partial bucket where the window starts, the future, and another node's GPU.
            sample(gpu, at(12, 3, day=YESTERDAY), util=77, memory=77, power=77),
            rollup(gpu, at(12, 0, day=YESTERDAY), utilization=(770.0, 10)),
            sample(gpu, at(12, 2, 31), util=66, memory=66, power=66),
            rollup(gpu, at(12, 5), utilization=(660.0, 10)),
            sample(other_gpus["GPU-other"], at(11, 0), util=88, memory=88, power=88),
            rollup(other_gpus["GPU-other"], at(11, 0), utilization=(880.0, 10)),
        ]
    )
    db.session.commit()

    result = history(node_id, DAY, NOW, bucket=FIVE_MINUTES)

    assert list(result) == ["GPU-z", "GPU-a"]
    series = result["GPU-z"]
    # 11:00: (10 + 20 + 30 + 90 + 40) / (3 + 3 + 2) = 190 / 8.
    assert values(series["utilization_gpu_percent"]) == [
        (FIRST_BUCKET, None),
        (at(8, 0), 50.0),
        (at(8, 5), None),
        (at(11, 0), 23.75),
        (at(11, 5), None),
        (at(11, 10), 5.0),
        (at(11, 15), None),
        (at(12, 0), 99.0),
    ]
    # 11:00: the NULL sample is not a zero: (1000 + 3000 + 6000) / (2 + 2).
    assert values(series["memory_used_bytes"]) == [
        (FIRST_BUCKET, None),
        (at(8, 0), 1e9),
        (at(8, 5), None),
        (at(11, 0), 2500.0),
        (at(11, 5), None),
        (at(11, 10), 7.0),
        (at(11, 15), None),
        (at(12, 0), float(2**33)),
    ]
    # 11:00: (100 + 110 + 120 + 330) / (3 + 3).
    assert values(series["power_w"])[3] == (at(11, 0), 110.0)
    # Never read (NotSupported) anywhere in the day: one gap, no zeros.
    assert values(series["temperature_c"]) == [(FIRST_BUCKET, None)]
    assert all(values(series) == [(FIRST_BUCKET, None)] for series in result["GPU-a"].values())


def test_day_buckets_of_a_longer_bucket_combine_whole_rollups(ctx):
    node_id, gpus = add_node([("GPU-0", None)])
    gpu = gpus["GPU-0"]
    db.session.add_all(
        [
            rollup(gpu, at(11, 0), power=(200.0, 2)),
            rollup(gpu, at(11, 5), power=(600.0, 2)),
            sample(gpu, at(11, 12), power=400),
        ]
    )
    db.session.commit()

    series = history(node_id, DAY, NOW, bucket=timedelta(minutes=15))["GPU-0"]["power_w"]

    # Yesterday 12:15 is the first whole 15-minute bucket; 11:00 holds (200 + 600 + 400) / 5.
    assert values(series) == [
        (at(12, 15, day=YESTERDAY), None),
        (at(11, 0), 240.0),
        (at(11, 15), None),
    ]


def test_history_refuses_buckets_that_would_split_rollups_and_naive_times(ctx):
    node_id, _ = add_node([("GPU-0", None)])
    for bad in (timedelta(minutes=1), timedelta(minutes=7), timedelta(0)):
        with pytest.raises(ValueError, match="multiple of 5 minutes"):
            history(node_id, DAY, NOW, bucket=bad)
    with pytest.raises(ValueError, match="timezone-aware"):
        history(node_id, DAY, NOW.replace(tzinfo=None))


def populate(gpu_ids: list[int]) -> None:
    """Samples every 15 s for the last two hours and rollups for the rest of the day."""
    rows = []
    for gpu_id in gpu_ids:
        rows += [sample(gpu_id, NOW - timedelta(seconds=15 * step), util=step % 100, power=step) for step in range(480)]
        rows += [rollup(gpu_id, at(hour), utilization=(10.0, 20)) for hour in range(10)]
    db.session.add_all(rows)
    db.session.commit()


def counted_history(*args, **kwargs) -> tuple[dict[str, dict[str, Series]], list[str]]:
    """history(...) and the SQL statements it sent."""
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        # On SQLite app/db.py sends its own BEGIN when a transaction starts: not a query.
        if not statement.startswith("BEGIN"):
            statements.append(statement)

    db.session.rollback()  # each call starts its own transaction, as a request would
    sa.event.listen(db.engine, "before_cursor_execute", record)
    try:
        result = history(*args, **kwargs)
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", record)
    return result, statements


def test_query_count_is_fixed_however_many_gpus(ctx):
    one, one_gpus = add_node([("GPU-0", "00000000:01:00.0")])
    eight, eight_gpus = add_node([(f"GPU-{n}", f"00000000:0{n + 1}:00.0") for n in range(8)])
    bare, _ = add_node([])
    populate(list(one_gpus.values()) + list(eight_gpus.values()))

    counts = {}
    for name, node_id in (("one", one), ("eight", eight)):
        for mode, kwargs in (("raw", {}), ("day", {"bucket": FIVE_MINUTES})):
            window = HOUR if mode == "raw" else DAY
            result, statements = counted_history(node_id, window, NOW, **kwargs)
            counts[name, mode] = len(statements)
            assert len(result) == (1 if name == "one" else 8)
            if mode == "day":
                # The day's raw samples are averaged in SQL, not fetched row by row.
                assert sum("GROUP BY" in statement for statement in statements) == 2
                # One gap before midnight, 10 rollup hours each followed by a gap, 25 raw buckets.
                points = result["GPU-0"]["utilization_gpu_percent"].points
                assert len(points) == 1 + 10 * 2 + 25 and points[-1] == (at(12, 0), 5.0)  # steps 0..10
            else:
                assert len(result["GPU-0"]["power_w"].points) == 241  # 15 s apart, both ends included

    assert counts["one", "raw"] == counts["eight", "raw"] == 2  # GPUs, samples
    assert counts["one", "day"] == counts["eight", "day"] == 3  # GPUs, grouped samples, grouped rollups
    result, statements = counted_history(bare, DAY, NOW, bucket=FIVE_MINUTES)
    assert result == {} and len(statements) == 1
