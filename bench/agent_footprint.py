"""Node agent footprint: idle RSS against bare Python, and CPU seconds per heartbeat.

Starts the real control plane (SQLite, gunicorn) with a short heartbeat interval, enrols the
real agent in `nvidia` mode on the fake NVML of the test suite (one GPU; there is no GPU on
the reference box), lets it publish for --seconds, and reads the agent's RSS and CPU time
from /proc. Heartbeats are counted from the telemetry rows the server stored.

    .venv/bin/python bench/agent_footprint.py [--seconds 60] [--interval 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import migrate  # noqa: E402
from tests.support.agent import AgentProcess, mint_token  # noqa: E402
from tests.support.gunicorn import GunicornServer  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ONE_GPU = json.dumps(
    {
        "gpus": [
            {
                "uuid": "GPU-bench-0000",
                "name": "Bench GPU",
                "memory_total": 17171480576,
                "memory_used": 1,
                "utilization": 1,
                "temperature": 30,
                "power_mw": 20000,
                "pci_bus_id": "00000000:01:00.0",
            }
        ]
    }
)


def rss_bytes(pid: int) -> int:
    """Resident set size from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def bare_python_rss() -> int:
    """RSS of an idle interpreter that imported nothing: the `python -c pass` baseline."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(1.0)
        return rss_bytes(process.pid)
    finally:
        process.kill()
        process.wait()


def main() -> int:
    """Run the measurement and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--interval", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="modelforge-footprint-") as scratch:
        workdir = Path(scratch)
        database = workdir / "bench.sqlite3"
        migrate(f"sqlite:///{database}", workdir)
        server = GunicornServer(
            f"sqlite:///{database}", workdir, workers=2, MODELFORGE_HEARTBEAT_INTERVAL_SECONDS=str(args.interval)
        )
        server.env["GUNICORN_CMD_ARGS"] = "--access-logfile /dev/null"
        server.start()
        try:
            token = mint_token(server.url)["token"]
            agent = AgentProcess(
                workdir,
                server.url,
                MODELFORGE_AGENT_ENROLLMENT_TOKEN=token,
                MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
            ).with_fake_nvml(ONE_GPU)
            agent.start()
            agent.wait_for(r"inventory published")
            time.sleep(2)  # past start-up work
            pid = agent.process.pid
            cpu_start, started = cpu_seconds(pid), time.monotonic()
            with sqlite3.connect(database) as connection:
                beats_start = connection.execute("SELECT COUNT(*) FROM telemetry_samples").fetchone()[0]
            time.sleep(args.seconds)
            cpu_used, elapsed = cpu_seconds(pid) - cpu_start, time.monotonic() - started
            with sqlite3.connect(database) as connection:
                beats = connection.execute("SELECT COUNT(*) FROM telemetry_samples").fetchone()[0] - beats_start
            agent_rss = rss_bytes(pid)
            agent.stop()
        finally:
            server.stop()
    bare = bare_python_rss()
    per_beat = cpu_used / max(beats, 1)
    print(f"agent footprint: {elapsed:.0f}s at a {args.interval}s interval, {beats} heartbeats, one GPU (fake NVML)")
    print(
        f"  idle RSS         agent {agent_rss / 2**20:.1f} MiB   bare python {bare / 2**20:.1f} MiB   "
        f"ratio {agent_rss / bare:.2f}"
    )
    print(f"  CPU per beat     {per_beat * 1000:.2f} ms")
    print(
        f"  CPU of one core  {cpu_used / elapsed * 100:.3f} % at {args.interval}s   "
        f"{per_beat / 15 * 100:.4f} % at the default 15s interval"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
