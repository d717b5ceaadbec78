"""Heartbeat throughput against the same server's /healthz, measured in the same run.

Starts the real control plane under gunicorn on a fresh database, enrols NODES nodes through
the API (each advertising artifact.acquire.v1 in an inventory, as a real agent does), then
drives `wrk` (Debian package) at CONNECTIONS connections: first GET /healthz, then POST
/api/v1/agent/heartbeat with one GPU sample, the nodes in turn (the per-node rate is on and the
interval 1 s, so each node's beats stay inside its rate; non-2xx must stay 0). Prints requests/s,
p50/p99 latency and the heartbeat:healthz ratio.

    .venv/bin/python bench/heartbeat.py [--nodes 500] [--connections 32] [--seconds 10]
                                        [--workers 4] [--database-url postgresql+psycopg://…]
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


def main() -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
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
        server.env["GUNICORN_CMD_ARGS"] = "--access-logfile /dev/null"
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
            f"gunicorn {args.workers} sync workers, {database}"
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
