"""Running the real runtime worker as a subprocess, and talking to it over its Unix socket."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class UnixConnection(http.client.HTTPConnection):
    """http.client over an AF_UNIX socket (the worker has no TCP port)."""

    def __init__(self, path: str, timeout: float = 10) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def call(socket_path: str | Path, method: str, path: str, body: object = None, timeout: float = 10):
    """One request to the worker: (status, parsed JSON reply)."""
    connection = UnixConnection(str(socket_path), timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else None)
    finally:
        connection.close()


def short_socket_dir() -> Path:
    """A directory whose socket path fits AF_UNIX's ~107 bytes (pytest's tmp_path may not)."""
    return Path(tempfile.mkdtemp(prefix="mf-w-", dir="/tmp"))


class WorkerProcess:
    """`python -m modelforge_runtime_worker` on a short socket path, serving `artifact_dir`."""

    def __init__(self, artifact_dir: Path, log_path: Path, socket_dir: Path | None = None, **env: str) -> None:
        self.socket_dir = socket_dir or short_socket_dir()
        self.socket_path = self.socket_dir / "worker.sock"
        self.log_path = log_path
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MODELFORGE_WORKER_SOCKET": str(self.socket_path),
            "MODELFORGE_WORKER_ARTIFACT_DIR": str(artifact_dir),
            "MODELFORGE_WORKER_ACCELERATOR_MODE": "cpu",
            **env,
        }
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 20) -> WorkerProcess:
        """Start it and wait until it answers GET /v1/info."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "modelforge_runtime_worker"], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the worker exited with {self.process.returncode}:\n{self.log()}")
            try:
                if call(self.socket_path, "GET", "/v1/info", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"the worker never answered on {self.socket_path}:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: the worker dies as an OOM kill would leave it (its socket file stays)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL if it does not go."""
        if not self.process or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        """What the worker printed."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
