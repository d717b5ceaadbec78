"""Heartbeat throughput against the same server's /healthz, measured in the same run.

Starts the real control plane under gunicorn on a fresh database, enrols NODES nodes through
the API (each advertising artifact.acquire.v1 in an inventory, as a real agent does), then
drives `wrk` (Debian package) at CONNECTIONS connections: first GET /healthz, then POST
/api/v1/agent/heartbeat with one GPU sample, the nodes in turn (the per-node rate is on and the
interval 1 s, so each node's beats stay inside its rate; non-2xx must stay 0). Prints requests/s,
p50/p99 latency and the heartbeat:healthz ratio.

    .venv/bin/python bench/heartbeat.py [--nodes 500] [--connections 32] [--seconds 10]
                                        [--workers 4] [--threads N] [--database-url postgresql+psycopg://…]

With --cpu: the control plane's own CPU time per heartbeat, in process (the Flask test client, no
HTTP), for this tree and for --baseline REV (default main: its app/, templates/ and static/ from
`git archive`) side by side in one run: ROUNDS alternating rounds of BEATS heartbeats each, every
round a fresh process and database, on SQLite and (with --postgres-url or
MODELFORGE_TEST_POSTGRES_URL) PostgreSQL, whose server's CPU is not counted. --profile prints
this tree's cProfile of the same heartbeats instead.

    .venv/bin/python bench/heartbeat.py --cpu [--baseline main] [--beats 2000] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if "--cpu-worker" in sys.argv:  # --cpu's rounds: that tree's app/ (the baseline's or this one's) is imported
    sys.path.insert(0, sys.argv[sys.argv.index("--cpu-worker") + 1])

from tests.support import ADMIN, migrate  # noqa: E402
from tests.support.gunicorn import GunicornServer  # noqa: E402

# Each wrk thread takes its own share of the nodes and beats them in turn, as real nodes beat
# once per interval: a node beats again only after its whole share has, so every heartbeat is
# one the per-node rate accepts (A2) and the figures are accepted beats, never 429s.
LUA = """
local bodies = {}
local auths = {}
local count = 0
local turn = 0
local threads = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  local line_number = 0
  for line in io.lines("%(nodes_file)s") do
    if line_number %% %(threads)d == id then
      local auth, body = line:match("^(%%S+)\\t(.*)$")
      count = count + 1
      auths[count] = "Bearer " .. auth
      bodies[count] = body
    end
    line_number = line_number + 1
  end
end
request = function()
  turn = turn %% count + 1
  return wrk.format("POST", "/api/v1/agent/heartbeat",
    {["Content-Type"] = "application/json", ["Authorization"] = auths[turn]}, bodies[turn])
end
"""
THREADS = 2  # wrk threads: one per core of the reference box


def enrol(server: GunicornServer, index: int) -> tuple[str, str]:
    """Mint and claim one token; return the node id and credential."""
    session = requests.Session()
    minted = session.post(
        server.url + "/api/v1/admin/node-enrollments",
        json={"display_name": f"bench-{index}", "expires_in_seconds": 900},
        headers=ADMIN,
        timeout=30,
    ).json()
    node_id = str(uuid.uuid4())
    claimed = session.post(
        server.url + "/api/v1/agent/enroll",
        json={
            "enrollment_token": minted["token"],
            "node_id": node_id,
            "hostname": f"bench-{index}",
            "control_plane_url": server.url,
            "protocol_version": 1,
            "agent_version": "bench",
        },
        timeout=30,
    )
    claimed.raise_for_status()
    credential = claimed.json()["credential"]
    # As a real agent: an inventory that advertises the job type it can run, so every heartbeat
    # also answers `jobs_waiting` (J2), as it does in production.
    inventory = session.post(
        server.url + "/api/v1/agent/inventory",
        json={
            "protocol_version": 1,
            "agent_version": "bench",
            "inventory": {"hostname": f"bench-{index}", "gpus": [{"uuid": f"GPU-{node_id}"}]},
            "capabilities": ["artifact.acquire.v1"],
        },
        headers={"Authorization": f"Bearer {credential}"},
        timeout=30,
    )
    inventory.raise_for_status()
    return node_id, credential


def heartbeat_body(node_id: str) -> str:
    """One heartbeat with one GPU sample, as the agent sends it."""
    return json.dumps(
        {
            "protocol_version": 1,
            "agent_version": "bench",
            "health": {"status": "ok", "detail": "bench"},
            "storage_roots_etag": "0",  # the agent's copy of its (empty) root list is current
            "telemetry": [
                {
                    "gpu_uuid": f"GPU-{node_id}",
                    "sampled_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                    "utilization_gpu_percent": 42.0,
                    "memory_used_bytes": 4_000_000_000,
                    "temperature_c": 55.0,
                    "power_w": 180.5,
                }
            ],
        },
        separators=(",", ":"),
    )


def parse_wrk(output: str) -> dict[str, float]:
    """Requests/s, p50 and p99 (ms), and non-2xx count from `wrk --latency` output."""

    def millis(text: str) -> float:
        value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    p50 = millis(re.search(r"^\s+50%\s+(\S+)", output, re.MULTILINE).group(1))
    p99 = millis(re.search(r"^\s+99%\s+(\S+)", output, re.MULTILINE).group(1))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    return {
        "rps": rps,
        "p50_ms": p50,
        "p99_ms": p99,
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": errors.group(1) if errors else "none",
    }


def run_wrk(url: str, connections: int, seconds: int, script: Path | None = None) -> dict[str, float]:
    """Run wrk with THREADS threads."""
    command = ["wrk", f"-t{THREADS}", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "5s"]
    if script:
        command += ["-s", str(script)]
    result = subprocess.run(command + [url], capture_output=True, text=True, check=True)
    return parse_wrk(result.stdout)


# --------------------------------------------------------------------------- --cpu: CPU per heartbeat

CPU_NODES = 50  # heartbeats go to the nodes in turn, as a fleet's do


def cpu_worker(tree: str, database_url: str, beats: int, profile: bool) -> None:
    """In a fresh process whose `app` is `tree`'s: enrol CPU_NODES nodes with one GPU each (and
    artifact.acquire.v1, so each beat answers jobs_waiting), then time `beats` heartbeats."""
    import cProfile
    import logging
    import pstats
    import time

    from flask_migrate import upgrade

    import app as imported

    logging.disable(logging.INFO)  # enrolment lines; the figures are the output

    from app import create_app

    assert Path(imported.__file__).resolve().is_relative_to(Path(tree).resolve()), imported.__file__

    instance = tempfile.mkdtemp(prefix="modelforge-bench-cpu-")
    key = "bench-operator-key-" + "k" * 32
    application = create_app(
        {
            "MODELFORGE_DATABASE_URL": database_url,
            "MODELFORGE_INSTANCE_PATH": instance,
            "MODELFORGE_OPERATOR_API_KEY": key,
            "MODELFORGE_SECRET_KEY": "bench-secret-key",
            "MODELFORGE_NODE_RATE_LIMIT": "off",  # the same UPDATE either way; on, a beat needs 0.5 s per node
            "MODELFORGE_SCHEDULER": "false",
        }
    )
    with application.app_context():
        upgrade()
    client = application.test_client()
    auths, bodies = [], []
    for index in range(CPU_NODES):
        minted = client.post(
            "/api/v1/admin/node-enrollments",
            json={"display_name": f"cpu-{index}", "expires_in_seconds": 900},
            headers={"X-ModelForge-Admin-Token": key},
        ).get_json()
        node_id = str(uuid.uuid4())
        claimed = client.post(
            "/api/v1/agent/enroll",
            json={
                "enrollment_token": minted["token"],
                "node_id": node_id,
                "hostname": f"cpu-{index}",
                "control_plane_url": "http://localhost",
                "protocol_version": 1,
                "agent_version": "bench",
            },
        )
        auth = {"Authorization": f"Bearer {claimed.get_json()['credential']}"}
        inventory = client.post(
            "/api/v1/agent/inventory",
            json={
                "protocol_version": 1,
                "agent_version": "bench",
                "inventory": {"hostname": f"cpu-{index}", "gpus": [{"uuid": f"GPU-{node_id}"}]},
                "capabilities": ["artifact.acquire.v1"],
            },
            headers=auth,
        )
        assert inventory.status_code == 200, inventory.get_data(as_text=True)
        auths.append({**auth, "Content-Type": "application/json"})
        bodies.append(node_id)

    def beat(index: int) -> None:
        response = client.post(
            "/api/v1/agent/heartbeat", data=heartbeat_body(bodies[index % CPU_NODES]), headers=auths[index % CPU_NODES]
        )
        assert response.status_code == 200, response.get_data(as_text=True)

    for index in range(CPU_NODES * 2):  # warm up: first beats bring each node online (audited)
        beat(index)
    profiler = cProfile.Profile() if profile else None
    cpu, wall = time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    for index in range(beats):
        beat(index)
    if profiler:
        profiler.disable()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
        pstats.Stats(profiler).sort_stats("tottime").print_stats("/app/", 40)
    print(json.dumps({"cpu_ms": 1000 * cpu / beats, "wall_ms": 1000 * wall / beats}))


def cpu_main(args: argparse.Namespace) -> int:
    """Alternate rounds of this tree and the baseline's; print the median ms per heartbeat."""
    import os
    import statistics

    postgres = args.postgres_url or os.environ.get("MODELFORGE_TEST_POSTGRES_URL")
    with tempfile.TemporaryDirectory(prefix="modelforge-bench-cpu-") as scratch:
        baseline = Path(scratch) / "baseline"
        baseline.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.baseline, "app", "templates", "static"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
        revision = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", args.baseline], capture_output=True, text=True, check=True
        ).stdout.strip()
        trees = {f"baseline {args.baseline} ({revision})": str(baseline), "this tree": str(ROOT)}
        if args.profile:
            trees = {"this tree": str(ROOT)}
        databases = {"sqlite": None} | ({"postgresql": postgres} if postgres else {})
        for database, base_url in databases.items():
            figures: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for round_number in range(1 if args.profile else args.rounds):
                for name, tree in trees.items():
                    url, admin_url, db_name = _round_database(database, base_url, Path(scratch), name, round_number)
                    try:
                        done = subprocess.run(
                            [
                                sys.executable,
                                __file__,
                                "--cpu-worker",
                                tree,
                                "--database-url",
                                url,
                                "--beats",
                                str(args.beats),
                            ]
                            + (["--profile"] if args.profile else []),
                            capture_output=True,
                            text=True,
                            check=False,
                            cwd=scratch,
                        )
                    finally:
                        _drop_round_database(admin_url, db_name)
                    if done.returncode != 0:
                        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                        return 1
                    if args.profile:
                        print(done.stdout)
                        continue
                    figures[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            if args.profile:
                continue
            print(
                f"heartbeat CPU, in process: {args.beats} beats x {args.rounds} rounds, {CPU_NODES} nodes, {database}"
            )
            for name, rounds in figures.items():
                cpu = [figure["cpu_ms"] for figure in rounds]
                wall = [figure["wall_ms"] for figure in rounds]
                print(
                    f"  {name:<28} CPU {statistics.median(cpu):5.2f} ms/heartbeat (rounds "
                    f"{', '.join(f'{value:.2f}' for value in cpu)})   wall {statistics.median(wall):5.2f} ms"
                )
            names = list(figures)
            if len(names) == 2:
                old, new = (statistics.median(f["cpu_ms"] for f in figures[name]) for name in names)
                print(f"  this tree / baseline: {new / old:.2f}")
    return 0


def _round_database(database: str, base_url: str | None, scratch: Path, name: str, round_number: int):
    """A fresh database for one round: a new SQLite file, or a new PostgreSQL database."""
    if database == "sqlite":
        path = scratch / f"cpu-{uuid.uuid4().hex[:8]}.sqlite3"
        return f"sqlite:///{path}", None, None
    import sqlalchemy as sa

    db_name = f"modelforge_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{db_name}"')
    admin.dispose()
    return sa.make_url(base_url).set(database=db_name).render_as_string(hide_password=False), base_url, db_name


def _drop_round_database(admin_url: str | None, db_name: str | None) -> None:
    if admin_url is None:
        return
    import sqlalchemy as sa

    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    admin.dispose()


def main() -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="CPU per heartbeat in process, against --baseline")
    parser.add_argument("--baseline", default="main", help="--cpu: the git revision to compare with")
    parser.add_argument("--beats", type=int, default=2000, help="--cpu: heartbeats per round")
    parser.add_argument("--rounds", type=int, default=3, help="--cpu: alternating rounds per tree")
    parser.add_argument("--profile", action="store_true", help="--cpu: print this tree's cProfile instead")
    parser.add_argument("--postgres-url", default=None, help="--cpu: PostgreSQL server (a database is made per round)")
    parser.add_argument("--cpu-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="gunicorn's gthread workers, this many threads each")
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    if args.cpu_worker:
        cpu_worker(args.cpu_worker, args.database_url, args.beats, args.profile)
        return 0
    if args.cpu:
        return cpu_main(args)
    if shutil.which("wrk") is None:
        print("bench: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="modelforge-bench-") as scratch:
        workdir = Path(scratch)
        database_url = args.database_url or f"sqlite:///{workdir / 'bench.sqlite3'}"
        migrate(database_url, workdir)
        # The per-node rate on (A2), with the shortest interval there is, so each node may beat
        # twice a second: with 500 nodes in turn, that is far more than the box can serve.
        server = GunicornServer(
            database_url,
            workdir,
            workers=args.workers,
            MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1",
            MODELFORGE_NODE_RATE_LIMIT="on",
        )
        server.env["GUNICORN_CMD_ARGS"] = "--access-logfile /dev/null" + (
            f" --worker-class gthread --threads {args.threads}" if args.threads else ""
        )
        server.start()
        try:
            with ThreadPoolExecutor(max_workers=8) as pool:
                nodes = list(pool.map(lambda i: enrol(server, i), range(args.nodes)))
            nodes_file = workdir / "nodes.tsv"
            nodes_file.write_text("".join(f"{cred}\t{heartbeat_body(node)}\n" for node, cred in nodes))
            script = workdir / "heartbeat.lua"
            script.write_text(LUA % {"nodes_file": nodes_file, "threads": THREADS})

            run_wrk(server.url + "/healthz", args.connections, 2)  # warm up every worker
            healthz = run_wrk(server.url + "/healthz", args.connections, args.seconds)
            heartbeat = run_wrk(server.url, args.connections, args.seconds, script)
        finally:
            server.stop()
        database = "postgresql" if database_url.startswith("postgresql") else "sqlite"
        print(
            f"heartbeat bench: {args.nodes} nodes, {args.connections} connections, {args.seconds}s, "
            f"gunicorn {args.workers} {f'gthread ({args.threads} threads)' if args.threads else 'sync'} workers, "
            f"{database}"
        )
        for name, figures in (("healthz", healthz), ("heartbeat", heartbeat)):
            print(
                f"  {name:<9} {figures['rps']:8.1f} req/s   p50 {figures['p50_ms']:6.2f} ms   "
                f"p99 {figures['p99_ms']:6.2f} ms   non-2xx {figures['non_2xx']}   "
                f"socket errors {figures['socket_errors']}"
            )
        print(f"  ratio heartbeat/healthz: {heartbeat['rps'] / healthz['rps']:.2f}")
        if heartbeat["non_2xx"]:
            print("  bench: some heartbeats were refused (429?): use more --nodes", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
