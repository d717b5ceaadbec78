"""Helpers for the fixtures: migrations, cleaning databases, and a real gunicorn subprocess."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
import sqlalchemy as sa
from flask_migrate import upgrade

from app import create_app
from app.extensions import db

PROJECT_ROOT = Path(__file__).resolve().parent.parent
OPERATOR_KEY = "test-operator-key-" + "k" * 32
ADMIN = {"X-ModelForge-Admin-Token": OPERATOR_KEY}
# P2: anything shaped like a token or credential.
SECRET_PATTERN = re.compile(r"mf[en]_[A-Za-z0-9_-]{20,}")


# Job tests' lease: progress every second (a third of it), a lapse seen within seconds (J2).
JOB_LEASE_SECONDS = 3
# End-to-end liveness in seconds, not minutes: one-second beats and sweeps, a silent node stale
# after 2 s and offline after 4 s (L1–L3).
FAST_LIVENESS = {
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "2",
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "4",
    "MODELFORGE_SWEEP_INTERVAL_SECONDS": "1",
    "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "1",
}


def app_env(database_url: str, instance_path: Path, **overrides: str) -> dict[str, str]:
    """The MODELFORGE_* variables a test control plane runs with."""
    return {
        "MODELFORGE_DATABASE_URL": database_url,
        "MODELFORGE_INSTANCE_PATH": str(instance_path),
        "MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY,
        "MODELFORGE_SECRET_KEY": "test-secret-key",
        # Tests publish as fast as their setup needs; the per-node rate (on in production) is
        # tested where it is the subject (tests/test_rate_limits.py, the real agent's cadence).
        "MODELFORGE_NODE_RATE_LIMIT": "off",
        **overrides,
    }


def migrate(database_url: str, instance_path: Path) -> None:
    """Bring a database to the latest Alembic revision, as `make run` does."""
    application = create_app(app_env(database_url, instance_path))
    with application.app_context():
        upgrade()
        db.engine.dispose()


def truncate_all(database_url: str) -> None:
    """Empty every table of a PostgreSQL test database (schema stays, as migrated)."""
    engine = sa.create_engine(database_url)
    tables = ", ".join(f'"{table.name}"' for table in db.metadata.sorted_tables)
    with engine.begin() as connection:
        connection.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    engine.dispose()


def free_port() -> int:
    """A loopback TCP port nobody is listening on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_no_secrets(text: str, *secrets: str) -> None:
    """P2: none of these secrets, nor anything shaped like one, appears in a log."""
    for secret in secrets:
        assert secret not in text, "a secret appeared in the log"
    found = SECRET_PATTERN.findall(text)
    assert not found, f"something shaped like a secret appeared in the log: {found[0][:8]}…"


def stop_process(process: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    """Ask a running subprocess to exit with `sig`; kill it if it has not within `timeout` seconds."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class GunicornServer:
    """The control plane as users run it: gunicorn with several sync workers, as a subprocess."""

    def __init__(
        self,
        database_url: str,
        tmp_path: Path,
        workers: int = 4,
        tls: tuple[Path, Path, Path] | None = None,
        **env: str,
    ) -> None:
        """`tls` is (certificate, key, CA certificate): gunicorn then serves HTTPS with them."""
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.verify: bool | str = str(tls[2]) if tls else True
        self.log_path = tmp_path / f"gunicorn-{self.port}.log"
        self.env = {
            **os.environ,
            **app_env(database_url, tmp_path),
            "MODELFORGE_BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": str(workers),
            **env,
        }
        if tls:
            self.env["GUNICORN_CMD_ARGS"] = f"--certfile {tls[0]} --keyfile {tls[1]}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> None:
        """Start gunicorn and wait until /healthz answers."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf", "wsgi:app"],
                cwd=PROJECT_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.process.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/healthz", timeout=1, verify=self.verify).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn did not become healthy in {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        """Stop gunicorn gracefully."""
        stop_process(self.process)

    def log(self) -> str:
        """Everything gunicorn and the app wrote so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""


@contextmanager
def gunicorn_on_sqlite_copy(sqlite_template: Path, database: Path, **options) -> Iterator[GunicornServer]:
    """A started GunicornServer on a fresh copy of the migrated SQLite template at `database`.

    `options` go to GunicornServer (workers, tls, MODELFORGE_* overrides); its instance path is
    `database`'s folder. On exit the server is stopped and its log's tail printed (pytest shows
    it only when the test failed).
    """
    shutil.copyfile(sqlite_template, database)
    running = GunicornServer(f"sqlite:///{database}", database.parent, **options)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        print(running.log()[-20000:])
