"""The real runtime worker as a subprocess, and HTTP to it over its Unix socket (W1).

Shared by the worker's own tests, the agent's relay tests and the end-to-end tests.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from tests.support import wait_until

START_TIMEOUT = 30.0
JOB_TIMEOUT = 120.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix stream socket, as the agent talks to the worker."""

    def __init__(self, socket_path: str, timeout: float = 10.0) -> None:
        super().__init__("worker", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def call(socket_path: Path, method: str, path: str, body: object = None, raw: bytes | None = None) -> tuple[int, dict]:
    """One request on a fresh connection; the status and the JSON answer."""
    connection = UnixHTTPConnection(str(socket_path))
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        assert response.getheader("Content-Type") == "application/json", payload
        return response.status, json.loads(payload)
    finally:
        connection.close()


def answers(socket_path: Path) -> bool:
    """Whether a worker answers GET /v1/info on the socket."""
    try:
        return call(socket_path, "GET", "/v1/info")[0] == 200
    except OSError:
        return False


def short_socket_dir() -> Path:
    """A directory under /tmp: pytest's tmp_path is too long for a Unix socket path (107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="mfw-", dir="/tmp"))


class WorkerProcess:
    """`python -m modelforge_runtime_worker` with its socket, artifact directory and log."""

    def __init__(self, socket_path: Path, artifact_dir: Path, log_path: Path, **env: str) -> None:
        self.socket_path = socket_path
        self.artifact_dir = artifact_dir
        self.log_path = log_path
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MODELFORGE_WORKER_SOCKET": str(socket_path),
            "MODELFORGE_WORKER_ARTIFACT_DIR": str(artifact_dir),
            "MODELFORGE_WORKER_ACCELERATOR_MODE": "cpu",
            **env,
        }
        self.process: subprocess.Popen | None = None

    def log(self) -> str:
        """What the worker logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def run(self, *args: str, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess:
        """Run the worker to its end (settings errors, --check); stdout and stderr captured."""
        return subprocess.run(
            [sys.executable, "-m", "modelforge_runtime_worker", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> WorkerProcess:
        """Start the worker and wait until it answers on its socket."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "modelforge_runtime_worker"], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not answers(self.socket_path):
            assert self.process.poll() is None, f"the worker exited {self.process.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"the worker did not answer within {START_TIMEOUT} s:\n{self.log()}"
            time.sleep(0.05)
        return self

    def call(self, method: str, path: str, body: object = None, raw: bytes | None = None) -> tuple[int, dict]:
        """One request to this worker."""
        return call(self.socket_path, method, path, body, raw)

    def submit(self, job_type: str, params: dict, job_id: str | None = None) -> tuple[int, dict]:
        """POST /v1/jobs."""
        body = {"id": job_id or str(uuid.uuid4()), "type": job_type, "params": params}
        return self.call("POST", "/v1/jobs", body)

    def wait_until(self, job_id: str, done, timeout: float = JOB_TIMEOUT) -> dict:
        """Poll the job's status until done(status) holds."""
        deadline = time.monotonic() + timeout
        while True:
            code, status = self.call("GET", f"/v1/jobs/{job_id}")
            assert code == 200, status
            if done(status):
                return status
            assert time.monotonic() < deadline, f"job {job_id} still {status} after {timeout} s:\n{self.log()}"
            time.sleep(0.02)

    def finish(self, job_id: str) -> dict:
        """Poll until the job has ended; its status."""
        return self.wait_until(job_id, lambda status: status["state"] != "running")

    def run_job(self, job_type: str, params: dict) -> dict:
        """Submit a job and wait for its end."""
        code, status = self.submit(job_type, params)
        assert code == 202, status
        return self.finish(status["id"])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the worker and wait for it; its exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=15)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as an OOM kill leaves it: no goodbye, the socket file stays behind."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def children(self) -> list[int]:
        """The pids of the worker's child processes: its engine process while a job runs."""
        pids = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                pids += [int(pid) for pid in (task / "children").read_text().split()]
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
        return pids

    def rss_bytes(self) -> int:
        """The worker's resident set now (VmRSS)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


def gone(pid: int) -> bool:
    """Whether a process no longer runs (a zombie counts: it holds no memory, no GPU)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


LOAD_TIMEOUT = 60.0  # a deployment's load on the worker, tiny or test-sized models


@contextmanager
def serving_worker(artifacts: Path, log_path: Path):
    """A worker serving `artifacts` on a short socket path, stopped cleanly (exit 0) at the end."""
    directory = short_socket_dir()
    process = WorkerProcess(directory / "w.sock", artifacts, log_path).start()
    try:
        yield process
        assert process.stop() == 0, process.log()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def deploy(worker: WorkerProcess, model_path: str = "tiny.gguf", **spec) -> dict:
    """PUT a deployment and wait until it is no longer loading; its status."""
    deployment_id = f"dep-{uuid.uuid4().hex[:12]}"
    code, status = worker.call("PUT", f"/v1/deployments/{deployment_id}", {"model_path": model_path, **spec})
    assert code == 202, status
    assert status["state"] == "loading"

    def loaded():
        answer = worker.call("GET", f"/v1/deployments/{deployment_id}")[1]
        return answer if answer["state"] != "loading" else None

    return wait_until(loaded, f"deployment {deployment_id} to load", LOAD_TIMEOUT)
