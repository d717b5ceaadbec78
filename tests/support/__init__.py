"""The suite's support package: shared constants and small helpers; each helper family is a module
beside this one (gunicorn, agent, hub, worker, console, nodes, ...). Test modules import from here,
never from one another."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa
from flask_migrate import upgrade

from app import create_app
from app.extensions import db

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Data files the tests read: the compose specification, the wizard's golden snippets.
DATA_DIR = PROJECT_ROOT / "tests" / "data"
OPERATOR_KEY = "test-operator-key-" + "k" * 32
ADMIN = {"X-ModelForge-Admin-Token": OPERATOR_KEY}
# P2, S1: anything shaped like a token, credential or client API key.
SECRET_PATTERN = re.compile(r"mf[enk]_[A-Za-z0-9_-]{20,}")


# The job types (SPEC "Job names"), as the tests send and expect them.
ACQUIRE = "artifact.acquire.v1"
BENCHMARK = "runtime.benchmark.v1"
GENERATE = "runtime.generate.v1"
EVERY_TYPE = [ACQUIRE, BENCHMARK, GENERATE]

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
        # tested where it is the subject (tests/e2e/test_rate_limits.py, the real agent's cadence).
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


def wait_until(condition, what="the condition", timeout: float = 30.0, interval: float = 0.05):
    """Poll `condition()` until it returns something truthy, and return that; fail naming `what`
    (a string, or a callable that describes the state at the deadline) after `timeout` seconds.
    Tests wait on what they need, never a fixed time; a bound about timing says so where passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what() if callable(what) else what}")
        time.sleep(interval)


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


def file_modes(path) -> dict[str, str]:
    """The permission bits of a SQLite file and of its -wal and -shm companions, where they exist."""
    return {
        suffix: oct(stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode))
        for suffix in ("", "-wal", "-shm")
        if os.path.exists(f"{path}{suffix}")
    }
