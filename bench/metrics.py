"""GET /metrics scrape time at fleet scale (O1): 1,000 nodes x 8 GPUs, on SQLite and PostgreSQL.

Fills a fresh, migrated database straight through SQL (enrolling 1,000 agents through the API
would measure the enrolment, not the scrape): NODES nodes with a lease each, GPUS GPUs per node,
SAMPLES raw samples per GPU 15 s apart ending now (the newest is fresh, as a live fleet's is), a
twentieth of the nodes silent for an hour (offline, no fresh sample: no GPU series) and JOBS jobs
across every type and state. Then starts the real control plane under gunicorn on it and times
SCRAPES scrapes of GET /metrics, checking each answer is the whole fleet. Target: under 1 s.

    .venv/bin/python bench/metrics.py [--nodes 1000] [--gpus 8] [--samples 40] [--jobs 20000]
                                      [--scrapes 10] [--database-url postgresql+psycopg://…]

Without --database-url it measures SQLite, then PostgreSQL if MODELFORGE_TEST_POSTGRES_URL names a
server (a throwaway database is created there and dropped).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.models import Gpu, Job, Node, NodeLease, TelemetrySample  # noqa: E402
from tests.support import ADMIN, migrate  # noqa: E402
from tests.support.gunicorn import GunicornServer  # noqa: E402

TARGET_SECONDS = 1.0
FRESH_SECONDS = 300
SAMPLE_EVERY = timedelta(seconds=15)
JOB_TYPES = ("artifact.acquire.v1", "runtime.benchmark.v1", "runtime.generate.v1")
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
CHUNK = 5000


def _chunks(rows: list[dict], size: int = CHUNK):
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def fill(database_url: str, nodes: int, gpus: int, samples: int, jobs: int, now: datetime) -> dict[str, int]:
    """Write the fleet; return how many nodes and GPUs should show as live."""
    engine = sa.create_engine(database_url)
    random.seed(1)
    node_rows, lease_rows, gpu_rows, sample_rows, job_rows = [], [], [], [], []
    live_nodes = live_gpus = 0
    gpu_id = 0
    for index in range(nodes):
        node_id = str(uuid.uuid4())
        silent = index % 20 == 19  # offline for an hour: its GPUs have no fresh sample
        last = now - (timedelta(hours=1) if silent else timedelta(seconds=random.uniform(0, 10)))
        node_rows.append(
            {"id": node_id, "display_name": f"bench-{index:04d}", "hostname": f"bench-{index:04d}", "labels": {}}
        )
        lease_rows.append({"node_id": node_id, "last_heartbeat_at": last, "status": "offline" if silent else "online"})
        live_nodes += not silent
        for slot in range(gpus):
            gpu_id += 1
            live_gpus += not silent
            gpu_rows.append(
                {
                    "id": gpu_id,
                    "node_id": node_id,
                    "uuid": f"GPU-{uuid.uuid4()}",
                    "name": "NVIDIA GeForce RTX 4090",
                    "memory_total_bytes": 25_757_220_864,
                    "pci_bus_id": f"00000000:{slot + 1:02X}:00.0",
                    "present": True,
                    "first_seen_at": now - timedelta(days=1),
                    "last_seen_at": last,
                }
            )
            for back in range(samples):
                moment = last - back * SAMPLE_EVERY
                sample_rows.append(
                    {
                        "gpu_id": gpu_id,
                        "sampled_at": int(moment.timestamp() * 1000),
                        "utilization_gpu_percent": random.uniform(0, 100),
                        "memory_used_bytes": random.randrange(25_757_220_864),
                        "temperature_c": random.uniform(30, 85),
                        "power_w": random.uniform(20, 450),
                    }
                )
    node_ids = [row["id"] for row in node_rows]
    for index in range(jobs):
        state = JOB_STATES[index % len(JOB_STATES)]
        if state == "running":
            state = "succeeded"  # one running job per node at most (a unique index): none here
        job_rows.append(
            {
                "id": str(uuid.uuid4()),
                "type": JOB_TYPES[index % len(JOB_TYPES)],
                "node_id": node_ids[index % len(node_ids)],
                "params": {},
                "state": state,
                "created_at": now - timedelta(minutes=index % 600),
            }
        )
    # Agents publish as time passes, so the table fills in time order (what PostgreSQL's BRIN index
    # on sampled_at relies on).
    sample_rows.sort(key=lambda row: row["sampled_at"])
    with engine.begin() as connection:
        for table, rows in (
            (Node.__table__, node_rows),
            (NodeLease.__table__, lease_rows),
            (Gpu.__table__, gpu_rows),
            (TelemetrySample.__table__, sample_rows),
            (Job.__table__, job_rows),
        ):
            for chunk in _chunks(rows):
                connection.execute(table.insert(), chunk)
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("SELECT setval('gpus_id_seq', (SELECT max(id) FROM gpus))")
    with engine.connect() as connection:  # fresh planner statistics, as autovacuum would have
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    engine.dispose()
    return {"live_nodes": live_nodes, "live_gpus": live_gpus, "samples": len(sample_rows), "jobs": jobs}


def scrape_times(server: GunicornServer, scrapes: int, expected_gpus: int) -> list[float]:
    """Seconds per GET /metrics, each checked to hold every live GPU's utilisation."""
    session = requests.Session()
    times = []
    for _ in range(scrapes + 1):
        started = time.perf_counter()
        response = session.get(server.url + "/metrics", headers=ADMIN, timeout=30)
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        shown = response.text.count("\nmodelforge_gpu_utilization_percent{")
        if shown != expected_gpus:
            raise SystemExit(f"bench: the scrape showed {shown} GPUs, expected {expected_gpus}")
        times.append(elapsed)
    return times[1:]  # the first warms the worker's connection and caches


def measure(database_url: str, args: argparse.Namespace, workdir: Path) -> bool:
    """Fill, serve, scrape and print; True when the median scrape meets the target."""
    migrate(database_url, workdir)
    now = datetime.now(UTC)
    started = time.perf_counter()
    filled = fill(database_url, args.nodes, args.gpus, args.samples, args.jobs, now)
    fill_seconds = time.perf_counter() - started
    # The scheduler's retention sweep would fold samples while we measure: off, as in a replica
    # that runs no scheduler. The stale (and so freshness) window is wider than the default 45 s so
    # the fleet is still as filled when the scrapes come, and it makes the newest-sample query
    # range over 20 samples per GPU instead of 3: the harder case.
    server = GunicornServer(
        database_url,
        workdir,
        workers=2,
        MODELFORGE_SCHEDULER="false",
        MODELFORGE_NODE_STALE_AFTER_SECONDS=str(FRESH_SECONDS),
        MODELFORGE_NODE_OFFLINE_AFTER_SECONDS=str(2 * FRESH_SECONDS),
    )
    server.env["GUNICORN_CMD_ARGS"] = "--access-logfile /dev/null"
    server.start()
    try:
        times = scrape_times(server, args.scrapes, filled["live_gpus"])
        size = len(requests.get(server.url + "/metrics", headers=ADMIN, timeout=30).content)
    finally:
        server.stop()
    database = "postgresql" if database_url.startswith("postgresql") else "sqlite"
    median, worst = statistics.median(times), max(times)
    print(
        f"metrics bench, {database}: {args.nodes} nodes x {args.gpus} GPUs ({filled['live_gpus']} with a fresh "
        f"sample), {filled['samples']:,} samples, {filled['jobs']:,} jobs (filled in {fill_seconds:.1f} s)"
    )
    print(
        f"  GET /metrics: median {median * 1000:.0f} ms, max {worst * 1000:.0f} ms over {len(times)} scrapes, "
        f"{size / 1024:.0f} KiB -> {'meets' if worst < TARGET_SECONDS else 'MISSES'} the {TARGET_SECONDS:.0f} s target"
    )
    return worst < TARGET_SECONDS


def _postgres_scratch(base_url: str):
    """A throwaway PostgreSQL database on the server `base_url` names: (url, drop)."""
    name = f"modelforge_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return sa.make_url(base_url).set(database=name).render_as_string(hide_password=False), drop


def main() -> int:
    """Run the benchmark on each database and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=40, help="raw samples per GPU, 15 s apart")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--database-url", default=None, help="default: SQLite, then MODELFORGE_TEST_POSTGRES_URL")
    args = parser.parse_args()
    met = True
    with tempfile.TemporaryDirectory(prefix="modelforge-bench-") as scratch:
        workdir = Path(scratch)
        if args.database_url:
            return 0 if measure(args.database_url, args, workdir) else 1
        met &= measure(f"sqlite:///{workdir / 'bench.sqlite3'}", args, workdir)
        postgres = os.environ.get("MODELFORGE_TEST_POSTGRES_URL")
        if postgres:
            url, drop = _postgres_scratch(postgres)
            try:
                (workdir / "pg").mkdir()
                met &= measure(url, args, workdir / "pg")
            finally:
                drop()
        else:
            print("  (PostgreSQL skipped: set MODELFORGE_TEST_POSTGRES_URL or --database-url)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
