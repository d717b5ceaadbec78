"""Liveness sweep time at 10,000 nodes, and telemetry bytes per 8-GPU node-day.

1. 10,000 nodes whose leases are a third fresh, a third 60 s old (→ stale) and a third
   500 s old (→ offline). Times one liveness sweep (set-based UPDATE … RETURNING plus the
   audit rows) against a bare indexed UPDATE of the same rows, in the same run.
2. One 8-GPU node at a 15 s interval for two simulated days, retention run every simulated
   hour: raw bytes after one day without retention, and raw + rollup bytes once the raw window
   is full (it should stay flat).

    .venv/bin/python bench/sweep.py [--nodes 10000] [--postgres-url postgresql+psycopg://…/postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app import create_app  # noqa: E402
from app.extensions import db  # noqa: E402
from app.models import Gpu, Node, NodeLease, TelemetryRollup, TelemetrySample  # noqa: E402
from app.nodes import liveness, retention  # noqa: E402
from app.timeutil import utcnow  # noqa: E402
from tests.support import app_env, migrate  # noqa: E402

AGES = (5, 60, 500)  # fresh, stale, offline with the default 45 s / 120 s thresholds


def seed_nodes(count: int) -> None:
    """`count` nodes and leases, all marked online, with staggered heartbeat ages."""
    now = utcnow()
    nodes, leases = [], []
    for index in range(count):
        node_id = str(uuid.uuid4())
        nodes.append(
            {
                "id": node_id,
                "display_name": f"n{index}",
                "hostname": f"h{index}",
                "labels": {},
                "production_eligible": False,
                "lab_eligible": False,
                "benchmark_eligible": False,
                "disabled": False,
                "created_at": now,
                "enrolled_at": now,
            }
        )
        leases.append(
            {"node_id": node_id, "status": "online", "last_heartbeat_at": now - timedelta(seconds=AGES[index % 3])}
        )
    db.session.execute(sa.insert(Node), nodes)
    db.session.execute(sa.insert(NodeLease), leases)
    db.session.commit()


def reset_leases() -> None:
    db.session.execute(sa.update(NodeLease).values(status="online"))
    db.session.commit()


def time_sweeps(settings, rounds: int = 5) -> tuple[float, float, dict[str, int]]:
    """Median seconds of the real sweep and of a bare indexed UPDATE of the same rows."""
    sweep_times, bare_times, moved = [], [], {}
    leases = NodeLease.__table__
    for _ in range(rounds):
        reset_leases()
        started = time.perf_counter()
        moved = liveness.sweep(settings)
        sweep_times.append(time.perf_counter() - started)

        reset_leases()
        now = utcnow()
        started = time.perf_counter()
        for cutoff, status in ((now - timedelta(seconds=120), "offline"), (now - timedelta(seconds=45), "stale")):
            db.session.connection().execute(
                leases.update()
                .where(leases.c.status == "online", leases.c.last_heartbeat_at <= cutoff)
                .values(status=status)
            )
        db.session.commit()
        bare_times.append(time.perf_counter() - started)
    return statistics.median(sweep_times), statistics.median(bare_times), moved


def table_bytes(names: list[str]) -> int:
    """Bytes the tables and their indexes take (PostgreSQL after VACUUM; SQLite pages in use)."""
    engine = db.engine
    db.session.commit()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if engine.dialect.name == "postgresql":
            total = 0
            for name in names:
                connection.exec_driver_sql(f"VACUUM {name}")
                total += connection.exec_driver_sql(f"SELECT pg_total_relation_size('{name}')").scalar()
            return total
        return sum(
            connection.exec_driver_sql(
                "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_schema WHERE tbl_name = ?)",
                (name,),
            ).scalar()
            for name in names
        )


def telemetry_footprint(settings, gpus: int = 8, interval: int = 15, days: int = 9) -> list[tuple[int, int, int]]:
    """(simulated day, raw bytes, rollup bytes): day 1 without retention, then with it, hourly."""
    now = utcnow()
    node = Node(id=str(uuid.uuid4()), display_name="bench", hostname="bench", created_at=now, enrolled_at=now)
    db.session.add(node)
    db.session.flush()
    gpu_ids = []
    for index in range(gpus):
        gpu = Gpu(node_id=node.id, uuid=f"GPU-bench-{index}", first_seen_at=now, last_seen_at=now)
        db.session.add(gpu)
        db.session.flush()
        gpu_ids.append(gpu.id)
    db.session.commit()
    start = now - timedelta(days=days)
    points = []
    clock = start
    for hour in range(1, days * 24 + 1):
        rows = []
        hour_end = start + timedelta(hours=hour)
        while clock < hour_end:
            sample = {
                "sampled_at": clock,
                "utilization_gpu_percent": 55.0,
                "memory_used_bytes": 12_884_901_888,
                "temperature_c": 63.0,
                "power_w": 251.7,
            }
            rows += [{"gpu_id": gpu_id, **sample} for gpu_id in gpu_ids]
            clock += timedelta(seconds=interval)
        db.session.execute(sa.insert(TelemetrySample), rows)
        db.session.commit()
        if hour == 24:
            points.append((0, table_bytes(["telemetry_samples"]), 0))  # one day, no retention yet
        if hour >= 24:
            retention.sweep(settings, now=hour_end)
            if db.engine.dialect.name == "postgresql":
                # What autovacuum does between real retention runs: make deleted rows' space reusable.
                with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                    connection.exec_driver_sql("VACUUM telemetry_samples, telemetry_rollups")
        if hour % 24 == 0:
            points.append((hour // 24, table_bytes(["telemetry_samples"]), table_bytes(["telemetry_rollups"])))
    return points


def run(database_url: str, instance: Path, nodes: int) -> None:
    migrate(database_url, instance)
    app = create_app(app_env(database_url, instance))
    with app.app_context():
        settings = app.config["MODELFORGE"]
        kind = db.engine.dialect.name
        seed_nodes(nodes)
        sweep_s, bare_s, moved = time_sweeps(settings)
        print(f"{kind}: liveness sweep over {nodes} nodes ({moved['stale']} → stale, {moved['offline']} → offline)")
        print(
            f"  sweep {sweep_s * 1000:7.1f} ms   bare indexed UPDATE {bare_s * 1000:7.1f} ms   "
            f"ratio {sweep_s / bare_s:.1f}×"
        )
        for table in (TelemetrySample, TelemetryRollup):
            db.session.execute(sa.delete(table))
        db.session.commit()
        points = telemetry_footprint(settings)
        (_, day_raw, _), *days = points
        print(f"  telemetry, one 8-GPU node at 15 s: one day of raw samples, no retention: {day_raw / 2**20:.2f} MiB")
        for day, raw, rollups in days:
            print(
                f"    day {day}, with retention: raw {raw / 2**20:.2f} MiB + rollups {rollups / 2**20:.2f} MiB "
                f"= {(raw + rollups) / 2**20:.2f} MiB"
            )
        db.session.remove()
        db.engine.dispose()


def main() -> int:
    """Run on SQLite, and on PostgreSQL when a URL is given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--postgres-url", default=os.environ.get("MODELFORGE_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="modelforge-sweep-") as scratch:
        run(f"sqlite:///{scratch}/bench.sqlite3", Path(scratch), args.nodes)
        if args.postgres_url:
            name = f"modelforge_bench_{os.getpid()}"
            admin = sa.create_engine(args.postgres_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as connection:
                connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
            try:
                url = sa.make_url(args.postgres_url).set(database=name).render_as_string(hide_password=False)
                run(url, Path(scratch), args.nodes)
            finally:
                with admin.connect() as connection:
                    connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
