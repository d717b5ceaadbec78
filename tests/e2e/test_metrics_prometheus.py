"""A real Prometheus scrapes the real control plane (O1): Debian's `prometheus` on loopback, gunicorn
with four workers and its scheduler, and a real agent on the fake NVML.

Prometheus reads GET /metrics with MODELFORGE_METRICS_TOKEN from a credentials file every second;
its query API must return the agent's GPU series and the nodes-by-status series, and, once the
agent is stopped, the node offline and its GPU series gone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.support import ADMIN, assert_no_secrets, free_port, stop_process
from tests.support.agent import nvidia_agent
from tests.support.gunicorn import gunicorn_on_sqlite_copy

PROMETHEUS = shutil.which("prometheus") or next((path for path in ["/usr/bin/prometheus"] if Path(path).exists()), None)
METRICS_TOKEN = "mft-e2e-" + "p" * 40
FAST = {
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "3",
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "5",
    "MODELFORGE_SWEEP_INTERVAL_SECONDS": "1",
    "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "1",
    "MODELFORGE_METRICS_TOKEN": METRICS_TOKEN,
}
GPUS = [
    {
        "uuid": f"GPU-5f3b2c1a-0000-4000-8000-00000000408{index}",
        "name": "NVIDIA GeForce RTX 4080",
        "memory_total": 17171480576,
        "memory_used": 734003200 * (index + 1),
        "utilization": 7 + index,
        "temperature": 38 + index,
        "power_mw": 21500 + 1000 * index,
        "pci_bus_id": f"00000000:0{index + 1}:00.0",
    }
    for index in range(2)
]


class Prometheus:
    """`prometheus` on a free loopback port, scraping `target` every second with a bearer token file."""

    def __init__(self, tmp_path: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = tmp_path / "prometheus"
        self.home.mkdir()
        token_file = self.home / "metrics-token"
        token_file.write_text(METRICS_TOKEN + "\n")
        token_file.chmod(0o600)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "modelforge",
                    "metrics_path": "/metrics",
                    "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        self.config = self.home / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.log_path = self.home / "prometheus.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> Prometheus:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.home / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus was not ready within {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        stop_process(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def query(self, promql: str) -> list[dict]:
        """An instant query through the HTTP API: the result vector."""
        response = requests.get(self.url + "/api/v1/query", params={"query": promql}, timeout=5)
        assert response.status_code == 200, response.text
        return response.json()["data"]["result"]

    def wait_for(self, promql: str, check, timeout: float = 30) -> list[dict]:
        """Query until `check(result)` holds."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if check(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{promql}: {result} after {timeout}s\n{self.log()[-3000:]}")

    def target(self) -> dict:
        (active,) = requests.get(self.url + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return active


def value(result: list[dict]) -> float | None:
    return float(result[0]["value"][1]) if len(result) == 1 else None


@pytest.fixture
def metrics_server(sqlite_template, tmp_path):
    with gunicorn_on_sqlite_copy(sqlite_template, tmp_path / "metrics.sqlite3", workers=4, **FAST) as running:
        yield running


@pytest.fixture
def prometheus(metrics_server, tmp_path):
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    running = Prometheus(tmp_path, f"127.0.0.1:{metrics_server.port}").start()
    yield running
    running.stop()
    print(running.log()[-5000:])  # shown only when the test fails


def test_prometheus_scrapes_the_agents_gpus_and_sees_the_node_go_offline(metrics_server, prometheus, tmp_path):
    assert requests.get(metrics_server.url + "/metrics", timeout=5).status_code == 401  # never anonymous
    agent, _ = nvidia_agent(tmp_path, metrics_server, json.dumps({"gpus": GPUS}))
    agent.start()
    agent.wait_for(r"inventory published")
    node_id = agent.node_id()
    selector = f'node_id="{node_id}"'

    utilisation = prometheus.wait_for(
        f"modelforge_gpu_utilization_percent{{{selector}}}", lambda result: len(result) == len(GPUS)
    )
    assert {(s["metric"]["gpu_uuid"], float(s["value"][1])) for s in utilisation} == {
        (gpu["uuid"], float(gpu["utilization"])) for gpu in GPUS
    }
    assert {s["metric"]["node_name"] for s in utilisation} == {"agent under test"}
    power = prometheus.query(f"modelforge_gpu_power_watts{{{selector}}}")
    assert sorted(float(s["value"][1]) for s in power) == [21.5, 22.5]
    memory = prometheus.query(f"modelforge_gpu_memory_total_bytes{{{selector}}}")
    assert [float(s["value"][1]) for s in memory] == [17171480576.0] * len(GPUS)
    prometheus.wait_for('modelforge_nodes{status="online"}', lambda result: value(result) == 1)
    assert value(prometheus.query(f'modelforge_node_status{{{selector},status="online"}}')) == 1
    target = prometheus.target()
    assert target["health"] == "up" and target["lastError"] == ""
    # The scheduler process ran the liveness sweep and stored how long it took.
    prometheus.wait_for('modelforge_sweep_duration_seconds_count{sweep="liveness"}', lambda r: (value(r) or 0) >= 1)
    # HTTP series summed across the four workers (multi-process mode), by route template.
    prometheus.wait_for(
        'sum(modelforge_http_requests_total{route="/api/v1/agent/heartbeat",status="200"})',
        lambda result: (value(result) or 0) >= 2,
    )

    agent.process.kill()  # no goodbye: the control plane must notice by itself
    agent.process.wait()
    prometheus.wait_for(f'modelforge_node_status{{{selector},status="offline"}}', lambda result: value(result) == 1)
    prometheus.wait_for('modelforge_nodes{status="offline"}', lambda result: value(result) == 1)
    assert value(prometheus.query('modelforge_nodes{status="online"}')) == 0
    # Its samples aged out of the freshness window: no GPU series at all, never a last value held.
    prometheus.wait_for(f"modelforge_gpu_utilization_percent{{{selector}}}", lambda result: result == [])
    age = value(prometheus.query(f"modelforge_node_heartbeat_age_seconds{{{selector}}}"))
    assert age is not None and age > 5

    assert_no_secrets(metrics_server.log() + prometheus.log(), METRICS_TOKEN, agent.credential())


def test_http_counts_are_summed_across_gunicorn_workers_and_outlive_a_dead_one(metrics_server):
    def healthz_count() -> float:
        response = requests.get(metrics_server.url + "/metrics", headers=ADMIN, timeout=10)
        assert response.status_code == 200
        lines = [
            line
            for line in response.text.splitlines()
            if line.startswith("modelforge_http_requests_total{")
            and 'route="/healthz"' in line
            and 'status="200"' in line
        ]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    before = healthz_count()
    session = requests.Session()
    with_fresh_connections = [requests.get(metrics_server.url + "/healthz", timeout=5) for _ in range(20)]
    kept_alive = [session.get(metrics_server.url + "/healthz", timeout=5) for _ in range(20)]
    assert all(response.status_code == 200 for response in with_fresh_connections + kept_alive)
    assert healthz_count() - before == 40  # whichever of the four workers answered each

    # A worker that dies takes none of its counts with it (child_exit marks it dead).
    booted = re.findall(r"Booting worker with pid: (\d+)", metrics_server.log())
    for pid in booted:
        os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 20
    while len(re.findall(r"Booting worker with pid", metrics_server.log())) < 2 * len(booted):
        assert time.monotonic() < deadline, metrics_server.log()[-3000:]
        time.sleep(0.2)
    assert healthz_count() - before == 40

    # The files live in a private directory made for this master (the scheduler it spawned carries
    # its name in its environment), and go with it.
    (scheduler_pid,) = re.findall(r"started the scheduler as process (\d+)", metrics_server.log())
    environ = Path(f"/proc/{scheduler_pid}/environ").read_bytes().split(b"\0")
    (directory,) = [
        Path(item.split(b"=", 1)[1].decode()) for item in environ if item.startswith(b"PROMETHEUS_MULTIPROC_DIR=")
    ]
    assert directory.stat().st_mode & 0o777 == 0o700
    assert len(list(directory.glob("counter_*.db"))) >= 1
    metrics_server.stop()
    assert not directory.exists()
