"""Server time of the console's nodes page at 1,000 nodes (target ≤ 150 ms), the node page and the audit log.

Seeds 1,000 nodes (a third online, stale, offline; one to eight GPUs each; two pairs sharing a
hostname), signs in through the real login form, then times the full nodes page, its htmx
fragment, one node page (8 GPUs, a day of 15 s samples), the audit log over 200,000 events and
/healthz in the same process: the time from the request entering the WSGI app to the last byte of
the body.

    .venv/bin/python bench/console.py [--nodes 1000] [--audit-events 200000] [--requests 40] \
        [--postgres-url postgresql+psycopg://…/db]
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import requests
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app import create_app  # noqa: E402
from app.extensions import db  # noqa: E402
from app.models import AuditEvent, Gpu, Node, NodeInventory, NodeLease, TelemetrySample  # noqa: E402
from app.timeutil import utcnow  # noqa: E402
from tests.support import OPERATOR_KEY, app_env, migrate, truncate_all  # noqa: E402
from tests.support.gunicorn import GunicornServer  # noqa: E402

AGES = (5, 60, 500)  # online, stale, offline with the default 45 s / 120 s thresholds
MODELS = ("NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000", "NVIDIA H100 80GB HBM3")


def seed(count: int) -> str:
    """`count` nodes with leases and GPUs; returns the id of the 8-GPU node that gets a day of samples."""
    now = utcnow()
    nodes, leases, gpus, inventories = [], [], [], []
    for index in range(count):
        node_id = str(uuid.uuid4())
        hostname = f"gpu-host-{index if index not in (10, 11) else 10}"
        nodes.append(
            {
                "id": node_id,
                "display_name": f"node {index:04d}",
                "hostname": hostname,
                "labels": {"rack": str(index % 12)},
                "production_eligible": False,
                "lab_eligible": index % 2 == 0,
                "benchmark_eligible": index % 5 == 0,
                "disabled": index % 50 == 0,
                "created_at": now,
                "enrolled_at": now,
            }
        )
        leases.append(
            {
                "node_id": node_id,
                "status": "online",
                "last_heartbeat_at": now - timedelta(seconds=AGES[index % 3]),
                "agent_version": "0.1.0",
                "protocol_version": 1,
                "compatibility": "COMPATIBLE",
                "health_status": "ok",
            }
        )
        inventories.append({"node_id": node_id, "facts": {"hostname": hostname, "cpu_count": 16}, "received_at": now})
        for gpu_index in range(index % 8 + 1):
            gpus.append(
                {
                    "node_id": node_id,
                    "uuid": f"GPU-{uuid.uuid4()}",
                    "name": MODELS[index % len(MODELS)],
                    "memory_total_bytes": 25_757_220_864,
                    "driver_version": "550.54.14",
                    "pci_bus_id": f"00000000:{gpu_index + 1:02x}:00.0",
                    "present": True,
                    "first_seen_at": now,
                    "last_seen_at": now,
                }
            )
    db.session.execute(sa.insert(Node), nodes)
    db.session.execute(sa.insert(NodeLease), leases)
    db.session.execute(sa.insert(NodeInventory), inventories)
    db.session.execute(sa.insert(Gpu), gpus)
    busy_node = nodes[7]["id"]  # index 7 has 8 GPUs
    gpu_ids = db.session.scalars(sa.select(Gpu.id).where(Gpu.node_id == busy_node)).all()
    samples = []
    start = now - timedelta(days=1)
    for gpu_id in gpu_ids:
        for step in range(0, 86_400, 15):
            samples.append(
                {
                    "gpu_id": gpu_id,
                    "sampled_at": start + timedelta(seconds=step),
                    "utilization_gpu_percent": float(step % 100),
                    "memory_used_bytes": 2_000_000_000 + step,
                    "temperature_c": 40.0 + step % 30,
                    "power_w": 100.0 + step % 200,
                }
            )
    db.session.execute(sa.insert(TelemetrySample), samples)
    db.session.commit()
    return busy_node


AUDIT_ACTIONS = ("node.online", "node.stale", "node.offline", "node.returned", "node.inventory_changed")


def seed_audit(count: int) -> None:
    """`count` audit events over the last 30 days, spread over the nodes and five actions."""
    now = utcnow()
    node_ids = list(db.session.scalars(sa.select(Node.id)))
    rows = [
        {
            "at": now - timedelta(seconds=(count - index) * 13),
            "actor": "system",
            "action": AUDIT_ACTIONS[index % len(AUDIT_ACTIONS)],
            "node_id": node_ids[index % len(node_ids)],
            "details": {"heartbeat_age_seconds": index % 600},
        }
        for index in range(count)
    ]
    for start in range(0, count, 20_000):
        db.session.execute(sa.insert(AuditEvent), rows[start : start + 20_000])
    db.session.commit()


def timed(client, path: str, requests: int, headers: dict[str, str] | None = None) -> list[float]:
    """Milliseconds per request, body fully read, after two warm-up requests."""
    for _ in range(2):
        assert client.get(path, headers=headers).status_code == 200
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path, headers=headers)
        response.get_data()
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    return times


def report(label: str, times: list[float], baseline: float | None = None) -> float:
    median = statistics.median(times)
    p95 = sorted(times)[int(len(times) * 0.95) - 1]
    ratio = f"  ({median / baseline:.0f}× /healthz)" if baseline else ""
    print(f"  {label:<46} median {median:7.1f} ms   p95 {p95:7.1f} ms{ratio}")
    return median


def through_gunicorn(database_url: str, instance: Path, count: int, repeat: int) -> None:
    """The nodes page from a real gunicorn worker over HTTP, as a browser gets it."""
    server = GunicornServer(database_url, instance, workers=1)
    server.start()
    try:
        session = requests.Session()
        login = session.get(server.url + "/login").text
        csrf = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', login).group(1)
        session.post(server.url + "/login", data={"operator_key": OPERATOR_KEY, "csrf_token": csrf})
        times = []
        for attempt in range(repeat + 2):
            started = time.perf_counter()
            response = session.get(server.url + "/hardware/nodes")
            assert response.status_code == 200 and len(response.content) > 0
            if attempt >= 2:  # two warm-up requests, as in-process
                times.append((time.perf_counter() - started) * 1000)
        report(f"nodes page via gunicorn + HTTP, {count} nodes", times)
    finally:
        server.stop()


def run(database_url: str, instance: Path, count: int, requests: int, audit_events: int) -> None:
    with create_app(app_env(database_url, instance)).app_context():
        if database_url.startswith("postgresql"):
            truncate_all(database_url)
        started = time.perf_counter()
        busy_node = seed(count)
        seed_audit(audit_events)
        if database_url.startswith("postgresql"):
            db.session.execute(sa.text("ANALYZE"))
            db.session.commit()
        print(
            f"  seeded {count} nodes, a day of samples for 8 GPUs and {audit_events} audit events"
            f" in {time.perf_counter() - started:.1f} s"
        )
        db.engine.dispose()
    gc.collect()
    app = create_app(app_env(database_url, instance))
    gc.freeze()  # as gunicorn's master does before forking a worker (app/gunicorn_conf.py pre_fork)
    client = app.test_client()
    login = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', login).group(1)
    assert client.post("/login", data={"operator_key": OPERATOR_KEY, "csrf_token": csrf}).status_code == 302
    healthz = report("/healthz", timed(client, "/healthz", requests))
    page = report(f"nodes page, {count} nodes", timed(client, "/hardware/nodes", requests), healthz)
    report(
        f"nodes fragment (htmx poll), {count} nodes",
        timed(client, "/hardware/nodes", requests, {"HX-Request": "true"}),
        healthz,
    )
    report("node page, 8 GPUs, hour charts", timed(client, f"/hardware/nodes/{busy_node}", requests), healthz)
    report(
        "day charts fragment, 8 GPUs",
        timed(client, f"/hardware/nodes/{busy_node}/charts?window=day", requests, {"HX-Request": "true"}),
        healthz,
    )
    report(f"audit log, {audit_events} events", timed(client, "/audit", requests), healthz)
    report("audit log, one action", timed(client, "/audit?action=node.offline", requests), healthz)
    size = len(client.get("/hardware/nodes").get_data())
    print(f"  nodes page body {size / 1024:.0f} KiB; target ≤ 150 ms: {'met' if page <= 150 else 'NOT met'}")
    with app.app_context():
        db.engine.dispose()
    gc.unfreeze()
    through_gunicorn(database_url, instance, count, requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--audit-events", type=int, default=200_000)
    parser.add_argument("--postgres-url", help="also run against this (emptied!) PostgreSQL database")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        instance = Path(directory)
        url = f"sqlite:///{instance / 'bench.sqlite3'}"
        migrate(url, instance)
        print("SQLite")
        run(url, instance, args.nodes, args.requests, args.audit_events)
        if args.postgres_url:
            migrate(args.postgres_url, instance)
            print("PostgreSQL")
            run(args.postgres_url, instance, args.nodes, args.requests, args.audit_events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
