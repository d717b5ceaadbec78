"""artifact.acquire.v1 on loopback: the agent's download against snapshot_download, its memory,
job pickup and lease recovery (J3, issue 11).

Starts a stand-in Hugging Face Hub (tests/support/hub.py), the real control plane under gunicorn
(SQLite, heartbeat interval 15 s, lease 60 s, sweep 5 s: the product defaults) and the real
agent, all on 127.0.0.1, and prints:

1. download: a repo of one --size-mib file plus --small-files files of 2–6 KiB, fetched by a real
   job (the agent hashes every byte: sha256 for LFS files, the git blob id for the rest, and
   fsyncs each file) against huggingface_hub's own `snapshot_download` of the same repo from the
   same stand-in (`endpoint=`, a fresh cache, in a subprocess, 8 workers, no hashing). The agent's
   time runs from its "claimed" log line to its "succeeded" line, as this bench sees them reach
   the log file (polled every 10 ms; the agent's own timestamps have 1 s resolution); the API's
   `started_at` → `finished_at` is printed beside it. MB/s are 10^6 bytes per second of the whole
   repo, metadata calls included on both sides (snapshot_download's clock starts after its
   interpreter and imports). The agent's time is split by its per-file "verified" lines: the
   small files (fetched first, one after another), the big file alone, and the rest; and the
   moment the stand-in sent the big file's last byte (sampled every 50 ms) against its
   "verified" line shows what hashing's tail and the fsync cost. Target: agent ≥ 0.9 ×
   snapshot_download.
2. memory: the agent's VmRSS read every 50 ms while the job runs against its idle VmRSS just
   before it, and VmHWM (lifetime peak) at the end. The pickup jobs run first, so huggingface_hub
   is already imported; the RSS before any job ("cold") is shown too. Target: ≤ +32 MiB.
3. pickup: --pickup-jobs small jobs, created at phases spread over the agent's 15 s heartbeat
   cycle, the first 0.2 s after a beat (the worst case): POST → the API shows `running`, and
   POST → the agent's "claimed" line; median and max. Target: ≤ one heartbeat interval + 1 s.
4. lease: the agent is SIGKILLed mid-download (the stand-in stalls the body after 8 MiB) and the
   job is polled every 100 ms until it is `queued` again; with the default 60 s lease, then with a
   --short-lease server and agent. Expected: kill → queued ≤ lease + one sweep tick, and lease
   expiry → queued ≤ one sweep tick.

The stand-in's responses go out with TCP_NODELAY unless --stand-in-nagle: it sends headers and
body in two writes, and with Nagle the body waits ~40 ms for a delayed ACK, once per file.

    .venv/bin/python bench/acquire.py [--size-mib 1024] [--small-files 50] [--pickup-jobs 5]
                                      [--short-lease 10] [--skip-kill] [--skip-snapshot-download]
                                      [--stand-in-nagle]
    .venv/bin/python bench/acquire.py --size-mib 64 --pickup-jobs 2 --skip-kill   # a quick run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import shutil
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import ADMIN, migrate  # noqa: E402
from tests.support.agent import AgentProcess, mint_token  # noqa: E402
from tests.support.gunicorn import GunicornServer  # noqa: E402
from tests.support.hub import Generated, StandinHub  # noqa: E402

ACQUIRE = "artifact.acquire.v1"
HEARTBEAT_SECONDS = 15  # the product default, and what the pickup target is measured against
DEFAULT_LEASE_SECONDS = 60
SWEEP_SECONDS = 5
RSS_TARGET_BYTES = 32 * 2**20
THROUGHPUT_TARGET = 0.9
PICKUP_FIRST_PHASE = 0.2  # seconds after a beat: the job just missed it
SAMPLE_SECONDS = 0.05
LOG_POLL_SECONDS = 0.01
KILL_FILE_BYTES = 64 * 2**20
KILL_STALL_AFTER_BYTES = 8 * 2**20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CHILD_FLAG = "--snapshot-download-child"
MIB = 2**20


# --------------------------------------------------------------------------- /proc


def proc_status(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


class Sampler:
    """Reads a process's VmRSS every 50 ms in a thread, and notes when the Hub has sent a file whole."""

    def __init__(self, pid: int, hub: StandinHub | None = None, path: str = "", size: int = 0) -> None:
        self.pid, self.hub, self.path, self.size = pid, hub, path, size
        self.samples: list[tuple[float, int]] = []
        self.hub_done_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                self.samples.append((now, proc_status(self.pid, "VmRSS")))
            except (FileNotFoundError, ProcessLookupError):
                return  # the agent is gone
            if self.hub is not None and self.hub_done_at is None and self.hub.bytes_served(self.path) >= self.size:
                self.hub_done_at = now
            next_at += SAMPLE_SECONDS  # drift-free: 20 samples a second however long a read takes
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def between(self, start: float, end: float) -> list[int]:
        """The RSS samples taken in [start, end]."""
        return [rss for at, rss in self.samples if start <= at <= end]


class LogWatch:
    """Tails the agent's log in a thread and stamps each line with the monotonic time it appeared."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop tailing."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self.path.exists() and not self._stop.wait(LOG_POLL_SECONDS):
            pass
        with self.path.open("r", encoding="utf-8", errors="replace") as handle:
            pending = ""
            while not self._stop.wait(LOG_POLL_SECONDS):
                pending += handle.read()
                *complete, pending = pending.split("\n")
                if complete:
                    now = time.monotonic()
                    with self._lock:
                        self.lines.extend((now, line) for line in complete)

    def wait_for(self, pattern: str, timeout: float, since: float = 0.0) -> float:
        """The time the first line matching `pattern` appeared at or after `since`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [at for at, line in self.lines if at >= since and regex.search(line)]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pattern!r} not in the agent log within {timeout:g}s:\n{self.tail()}")
            time.sleep(LOG_POLL_SECONDS)

    def times(self, pattern: str, since: float = 0.0) -> list[float]:
        """When each line matching `pattern` appeared, at or after `since`."""
        regex = re.compile(pattern)
        with self._lock:
            return [at for at, line in self.lines if at >= since and regex.search(line)]

    def tail(self, count: int = 20) -> str:
        """The last lines, for an error message."""
        with self._lock:
            return "\n".join(line for _, line in self.lines[-count:])


# --------------------------------------------------------------------------- control plane


def api(server: GunicornServer, method: str, path: str, **kwargs) -> dict:
    """One admin API call; raises on any non-2xx."""
    response = requests.request(method, server.url + path, headers=ADMIN, timeout=30, **kwargs)
    if not response.ok:
        raise RuntimeError(f"{method} {path}: HTTP {response.status_code} {response.text[:500]}")
    return response.json()


def epoch(text: str) -> float:
    """An RFC 3339 timestamp from the API as seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def start_server(workdir: Path, name: str, lease: int) -> GunicornServer:
    """gunicorn on a fresh SQLite database, 15 s heartbeats, the given lease, 5 s sweeps."""
    database_url = f"sqlite:///{workdir / (name + '.sqlite3')}"
    migrate(database_url, workdir)
    server = GunicornServer(
        database_url,
        workdir,
        workers=2,
        MODELFORGE_HEARTBEAT_INTERVAL_SECONDS=str(HEARTBEAT_SECONDS),
        MODELFORGE_JOB_LEASE_SECONDS=str(lease),
        MODELFORGE_SWEEP_INTERVAL_SECONDS=str(SWEEP_SECONDS),
    )
    server.env["GUNICORN_CMD_ARGS"] = "--access-logfile /dev/null"
    try:
        server.start()
    except BaseException:
        server.stop()  # started but never healthy: the caller has no server to stop
        raise
    return server


class Node:
    """A real agent enrolled on a server, with one storage root below its artifact directory."""

    def __init__(self, workdir: Path, server: GunicornServer, hub: StandinHub, name: str) -> None:
        self.server = server
        self.agent = AgentProcess(
            workdir,
            server.url,
            name=name,
            MODELFORGE_AGENT_ENROLLMENT_TOKEN=mint_token(server.url)["token"],
            HF_ENDPOINT=hub.url,
            HF_HOME=str(workdir / name / "hf-home"),
            HF_HUB_DISABLE_TELEMETRY="1",
        )
        self.agent.start()
        self.watch = LogWatch(self.agent.log_path)
        try:
            # The first heartbeat follows this line at once: it starts the agent's beat grid.
            self.first_beat = self.watch.wait_for(r"inventory published", timeout=30)
            self.node_id = self.agent.node_id()
            self.root_dir = self.agent.home / "artifacts" / "registry"
            self.root_dir.mkdir()
            body = {"name": "models", "host_path": "/mnt/models", "container_path": str(self.root_dir)}
            path = f"/api/v1/admin/nodes/{self.node_id}/storage-roots"
            self.root_id = api(server, "POST", path, json={**body, "min_free_bytes": 0})["id"]
        except BaseException:
            self.stop()  # the caller never gets this node to stop
            raise

    @property
    def pid(self) -> int:
        """The agent's process id."""
        return self.agent.process.pid

    def create_job(self, repo_id: str) -> tuple[dict, float]:
        """POST an acquire job; return it and the monotonic time just before the POST."""
        posted = time.monotonic()
        params = {"repo_id": repo_id, "storage_root_id": self.root_id}
        body = {"type": ACQUIRE, "node_id": self.node_id, "params": params}
        job = api(self.server, "POST", "/api/v1/admin/jobs", json=body)
        return job, posted

    def job(self, job_id: str) -> dict:
        """The job as the API shows it now."""
        return api(self.server, "GET", f"/api/v1/admin/jobs/{job_id}")

    def wait_job(self, job_id: str, states: set[str], timeout: float, poll: float = 0.05) -> tuple[dict, float]:
        """Poll until the job is in one of `states`; return it and the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            seen = time.monotonic()
            if job["state"] in states:
                return job, seen
            if seen > deadline:
                raise RuntimeError(f"job never reached {states} in {timeout:g}s: {job}\n{self.watch.tail()}")
            time.sleep(poll)

    def stop(self) -> None:
        """Stop the agent (SIGTERM, SIGKILL after 5 s) and the log watch."""
        try:
            self.agent.stop()
        except subprocess.TimeoutExpired:
            pass  # AgentProcess.stop already killed it
        self.watch.stop()


# --------------------------------------------------------------------------- the figures


def add_repos(hub: StandinHub, size: int, small_files: int) -> tuple[str, str, int]:
    """The download repo: one large LFS file and many small plain ones; returns its id, big file, size."""
    rng = random.Random(11)
    big = "model-00001-of-00001.safetensors"
    files = {big: Generated(size, seed=1)}
    files |= {f"configs/part-{index:02d}.json": rng.randbytes(rng.randint(2048, 6144)) for index in range(small_files)}
    hub.add_repo("bench/model", files)  # computes the 1 GiB file's sha256 once, before any timing
    return "bench/model", big, sum(len(value) if isinstance(value, bytes) else value.size for value in files.values())


def measure_pickup(node: Node, hub: StandinHub, jobs: int) -> dict[str, list[float]]:
    """Small jobs created at phases spread over the agent's heartbeat cycle, the first just after a
    beat (the worst case): POST → running, POST → claimed."""
    running, claimed, phases = [], [], []
    beat = node.first_beat
    for index in range(jobs):
        repo_id = f"bench/pickup-{index}"
        hub.add_repo(repo_id, {"config.json": b'{"n": %d}\n' % index, "README.md": b"# pickup\n"})
        # The agent beats on a drift-free grid and claims right after a beat, so its last claim
        # marks the grid; the job goes in `phase` seconds after a beat.
        phase = PICKUP_FIRST_PHASE + HEARTBEAT_SECONDS * index / jobs
        cycles = max(0, math.ceil((time.monotonic() - beat - phase) / HEARTBEAT_SECONDS))
        time.sleep(max(0.0, beat + cycles * HEARTBEAT_SECONDS + phase - time.monotonic()))
        job, posted = node.create_job(repo_id)
        _, seen = node.wait_job(job["id"], {"running", "succeeded", "failed"}, timeout=HEARTBEAT_SECONDS + 30)
        beat = node.watch.wait_for(rf"job {job['id']} .*claimed", timeout=10, since=posted)
        done, _ = node.wait_job(job["id"], {"succeeded", "failed"}, timeout=60, poll=0.2)
        if done["state"] != "succeeded":
            raise RuntimeError(f"pickup job failed: {done}")
        running.append(seen - posted)
        claimed.append(beat - posted)
        phases.append(phase)
    return {"running": running, "claimed": claimed, "phases": phases}


def measure_download(node: Node, hub: StandinHub, repo_id: str, big: str, size: int, total: int) -> dict:
    """One acquire job of the download repo, with the agent's RSS sampled throughout."""
    pid = node.agent.process.pid
    with Sampler(pid, hub, big, size) as sampler:
        time.sleep(1.0)  # idle samples before the job
        cpu_before = cpu_seconds(pid)
        job, posted = node.create_job(repo_id)
        timeout = 120 + total / MIB  # at worst 1 MB/s, plus the wait for a heartbeat
        claimed = node.watch.wait_for(rf"job {job['id']} .*claimed", timeout=timeout, since=posted)
        hub_cpu_from = time.process_time()
        succeeded = node.watch.wait_for(rf"job {job['id']} .*(succeeded|failed)", timeout=timeout, since=claimed)
        hub_cpu = time.process_time() - hub_cpu_from
        verified = node.watch.times(rf"job {job['id']}: .* verified", since=claimed)
        big_verified = node.watch.wait_for(rf"job {job['id']}: {re.escape(big)} verified", timeout=1, since=claimed)
        done, _ = node.wait_job(job["id"], {"succeeded", "failed"}, timeout=30, poll=0.1)
        cpu_after = cpu_seconds(pid)
        hwm = proc_status(pid, "VmHWM")
    if done["state"] != "succeeded":
        raise RuntimeError(f"the download job failed: {done}\n{node.watch.tail()}")
    idle = sampler.between(0, posted)
    during = sampler.between(claimed, succeeded)
    return {
        "seconds": succeeded - claimed,
        "api_seconds": epoch(done["finished_at"]) - epoch(done["started_at"]),
        "idle_rss": statistics.median(idle),
        "peak_rss": max(during),
        "hwm": hwm,
        "samples": len(during),
        "agent_user": cpu_after[0] - cpu_before[0],
        "agent_sys": cpu_after[1] - cpu_before[1],
        "hub_cpu": hub_cpu,
        "tail_seconds": big_verified - sampler.hub_done_at if sampler.hub_done_at is not None else None,
        # Files go in path order: the small configs/ files, then the big one (its own MB/s).
        "before_big": max([at for at in verified if at < big_verified], default=claimed) - claimed,
        "big_seconds": big_verified - max([at for at in verified if at < big_verified], default=claimed),
        "after_big": succeeded - big_verified,
        "big_size": size,
        "small_files": len(verified) - 1,
    }


def snapshot_child(endpoint: str, repo_id: str, cache_dir: str) -> int:
    """In the subprocess: snapshot_download the repo and print time, CPU and memory as JSON."""
    from huggingface_hub import snapshot_download

    rss_before = proc_status(os.getpid(), "VmRSS")
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    folder = snapshot_download(repo_id, cache_dir=cache_dir, endpoint=endpoint, token=False)
    seconds = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    files = [path for path in Path(folder).rglob("*") if path.is_file()]
    print(
        json.dumps(
            {
                "seconds": seconds,
                "user": cpu_after.ru_utime - cpu_before.ru_utime,
                "sys": cpu_after.ru_stime - cpu_before.ru_stime,
                "rss_before": rss_before,
                "hwm": proc_status(os.getpid(), "VmHWM"),
                "files": len(files),
                "bytes": sum(path.stat().st_size for path in files),
            }
        )
    )
    return 0


def measure_snapshot_download(workdir: Path, hub: StandinHub, repo_id: str) -> dict:
    """huggingface_hub's snapshot_download of the same repo in a fresh interpreter and cache."""
    home = workdir / "snapshot-download"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HF_HOME": str(home / "hf-home"),
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_XET": "1",  # plain HTTP, as the agent; the stand-in offers no Xet anyway
    }
    bench_cpu = time.process_time()
    result = subprocess.run(
        [sys.executable, __file__, CHILD_FLAG, hub.url, repo_id, str(home / "cache")],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"snapshot_download failed ({result.returncode}):\n{result.stderr[-4000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["hub_cpu"] = time.process_time() - bench_cpu
    shutil.rmtree(home)
    return figures


def measure_kill(node: Node, hub: StandinHub, lease: int) -> dict:
    """SIGKILL the agent mid-download; time until the job is queued again."""
    repo_id, path = f"bench/kill-{lease}", f"kill-{lease}.safetensors"
    hub.add_repo(repo_id, {path: Generated(KILL_FILE_BYTES, seed=lease)})
    hub.stall(path, after_bytes=KILL_STALL_AFTER_BYTES, seconds=3600, repo_id=repo_id, times=None)
    job, _ = node.create_job(repo_id)
    node.wait_job(job["id"], {"running"}, timeout=HEARTBEAT_SECONDS + 30)
    deadline = time.monotonic() + 60
    while hub.bytes_served(path) < KILL_STALL_AFTER_BYTES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the kill download never started:\n{node.watch.tail()}")
        time.sleep(0.05)
    time.sleep(1.0)  # mid-transfer: bytes written, the body stalled, progress reports going on
    node.agent.process.kill()
    killed = time.monotonic()
    node.agent.process.wait()
    lease_expires = epoch(node.job(job["id"])["lease_expires_at"])  # the last renewal that landed
    requeued, seen = node.wait_job(job["id"], {"queued", "failed"}, timeout=lease + 4 * SWEEP_SECONDS + 30, poll=0.1)
    seen_wall = time.time()
    api(node.server, "POST", f"/api/v1/admin/jobs/{job['id']}/cancel")
    return {
        "lease": lease,
        "state": requeued["state"],
        "code": (requeued.get("error") or {}).get("code"),
        "kill_to_queued": seen - killed,
        "expiry_to_queued": seen_wall - lease_expires,
        "lease_left_at_kill": lease_expires - (seen_wall - (seen - killed)),
    }


# --------------------------------------------------------------------------- printing


def mib(value: float) -> str:
    return f"{value / MIB:.1f} MiB"


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_download(download: dict, snapshot: dict | None, total: int, cores: int) -> None:
    agent_rate = total / download["seconds"] / 1e6
    print(
        f"  download   agent              {agent_rate:7.1f} MB/s  {download['seconds']:6.2f} s "
        f'("claimed" → "succeeded" log lines; API started_at → finished_at {download["api_seconds"]:.2f} s)'
    )
    print(
        f"             agent CPU user {download['agent_user']:.2f} s + sys {download['agent_sys']:.2f} s over the job "
        f"(one thread hashes, writes and reads); stand-in Hub (this process) {download['hub_cpu']:.2f} s; {cores} cores"
    )
    big_rate = download["big_size"] / download["big_seconds"] / 1e6
    print(
        f"             claimed → small files done {download['before_big']:.2f} s (metadata and "
        f"{download['small_files']} files, one after another); big file {download['big_seconds']:.2f} s "
        f"({big_rate:.1f} MB/s); → succeeded {download['after_big']:.2f} s"
    )
    if download["tail_seconds"] is not None:
        print(
            f'             Hub sent the big file\'s last byte → its "verified" line: {download["tail_seconds"]:.2f} s '
            "± 0.05 (socket buffer drained, hash finished, fsync)"
        )
    if snapshot is None:
        return
    rate = snapshot["bytes"] / snapshot["seconds"] / 1e6
    ratio = agent_rate / rate
    print(
        f"             snapshot_download  {rate:7.1f} MB/s  {snapshot['seconds']:6.2f} s "
        f"({snapshot['files']} files, {snapshot['bytes']} bytes, subprocess, CPU user {snapshot['user']:.2f} s + "
        f"sys {snapshot['sys']:.2f} s, "
        f"stand-in Hub {snapshot['hub_cpu']:.2f} s, no hashing)"
    )
    verdict = met(ratio >= THROUGHPUT_TARGET)
    print(f"             ratio agent / snapshot_download {ratio:.2f}  (target ≥ {THROUGHPUT_TARGET}: {verdict})")


def print_memory(download: dict, cold_rss: int, snapshot: dict | None) -> None:
    delta = download["peak_rss"] - download["idle_rss"]
    print(
        f"  memory     agent idle {mib(download['idle_rss'])} before the job (cold, before any job: {mib(cold_rss)}); "
        f"peak {mib(download['peak_rss'])} ({download['samples']} samples at 50 ms), VmHWM {mib(download['hwm'])}"
    )
    print(
        f"             delta +{mib(delta)} over idle, +{mib(download['peak_rss'] - cold_rss)} over cold "
        f"(target ≤ +{mib(RSS_TARGET_BYTES)}: {met(delta <= RSS_TARGET_BYTES)})"
    )
    if snapshot is not None:
        print(
            f"             snapshot_download: VmHWM {mib(snapshot['hwm'])}, "
            f"+{mib(snapshot['hwm'] - snapshot['rss_before'])} over its RSS just before the call"
        )


def print_pickup(pickup: dict[str, list[float]]) -> None:
    target = HEARTBEAT_SECONDS + 1
    for name, label in (("running", "API shows running"), ("claimed", 'agent logs "claimed"')):
        values = pickup[name]
        print(
            f"  pickup     POST → {label:<20} median {statistics.median(values):5.2f} s  max {max(values):5.2f} s  "
            f"({len(values)} jobs, heartbeat {HEARTBEAT_SECONDS} s; target ≤ {target} s: {met(max(values) <= target)})"
        )
    measured = zip(pickup["phases"], pickup["running"], strict=True)
    pairs = ", ".join(f"{phase:.1f} → {value:.2f}" for phase, value in measured)
    print(f"             created this long after a beat → running (s): {pairs}")


def print_kill(kill: dict) -> None:
    lease = kill["lease"]
    expected = lease + SWEEP_SECONDS
    print(
        f"  lease {lease:>3}s SIGKILL → {kill['state']} ({kill['code']}) {kill['kill_to_queued']:6.2f} s "
        f"(expected ≤ lease + sweep = {expected} s: {met(kill['kill_to_queued'] <= expected + 0.5)}); "
        f"lease expiry → queued {kill['expiry_to_queued']:.2f} s (≤ {SWEEP_SECONDS} s: "
        f"{met(kill['expiry_to_queued'] <= SWEEP_SECONDS + 0.5)}); "
        f"lease left at the kill {kill['lease_left_at_kill']:.1f} s"
    )


# --------------------------------------------------------------------------- main


def main() -> int:
    """Run the benchmark and print its figures."""
    if sys.argv[1:2] == [CHILD_FLAG]:
        return snapshot_child(*sys.argv[2:5])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="the large file (default 1024)")
    parser.add_argument("--small-files", type=int, default=50)
    parser.add_argument("--pickup-jobs", type=int, default=5, help="0 skips the pickup figures")
    parser.add_argument("--short-lease", type=int, default=10, help="seconds; 0 skips the second kill")
    parser.add_argument("--skip-kill", action="store_true", help="no lease figures")
    parser.add_argument("--skip-snapshot-download", action="store_true")
    parser.add_argument(
        "--stand-in-nagle",
        action="store_true",
        help="leave Nagle on for the stand-in's responses: ~40 ms per response, like a slow link",
    )
    args = parser.parse_args()
    # The stand-in writes a response's headers and body in two sends; with Nagle on, the body
    # waits for the client's delayed ACK (~40 ms on loopback), which made 50 small files cost
    # 2.3 s of waiting. This process serves nothing but the stand-in (gunicorn is a subprocess).
    socketserver.StreamRequestHandler.disable_nagle_algorithm = not args.stand_in_nagle
    size = args.size_mib * MIB
    cores = os.cpu_count() or 1
    load_start = os.getloadavg()
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="modelforge-acquire-") as scratch, StandinHub() as hub:
        workdir = Path(scratch)
        if shutil.disk_usage(workdir).free < 3 * size:
            print(f"bench: {workdir} has less than {3 * size} bytes free", file=sys.stderr)
            return 2
        repo_id, big, total = add_repos(hub, size, args.small_files)
        servers: list[GunicornServer] = []
        nodes: list[Node] = []
        try:
            servers.append(start_server(workdir, "default", DEFAULT_LEASE_SECONDS))
            node = Node(workdir, servers[0], hub, "agent")
            nodes.append(node)
            time.sleep(2)  # past start-up work
            cold_rss = proc_status(node.pid, "VmRSS")
            pickup = measure_pickup(node, hub, args.pickup_jobs) if args.pickup_jobs else None
            download = measure_download(node, hub, repo_id, big, size, total)
            shutil.rmtree(node.root_dir / "models")  # the page cache and disk to themselves for the next
            snapshot = None if args.skip_snapshot_download else measure_snapshot_download(workdir, hub, repo_id)
            kills = []
            if not args.skip_kill:
                kills.append(measure_kill(node, hub, DEFAULT_LEASE_SECONDS))
                if args.short_lease:
                    servers.append(start_server(workdir, "short", args.short_lease))
                    short = Node(workdir, servers[1], hub, "agent-short")
                    nodes.append(short)
                    kills.append(measure_kill(short, hub, args.short_lease))
        finally:
            for running in nodes:
                running.stop()
            for server in servers:
                server.stop()

    print(
        f"acquire bench: 1 × {args.size_mib} MiB + {args.small_files} small files ({total} bytes), stand-in Hub, "
        f"gunicorn 2 sync workers, SQLite, all on 127.0.0.1; stand-in Nagle {'on' if args.stand_in_nagle else 'off'}"
    )
    load_end = os.getloadavg()
    print(
        f"  machine    {cores} cores; load average {' '.join(f'{v:.2f}' for v in load_start)} at start, "
        f"{' '.join(f'{v:.2f}' for v in load_end)} at the end; {time.monotonic() - started:.0f} s in all"
    )
    print_download(download, snapshot, total, cores)
    print_memory(download, cold_rss, snapshot)
    if pickup:
        print_pickup(pickup)
    for kill in kills:
        print_kill(kill)
    return 0


if __name__ == "__main__":
    sys.exit(main())
