"""The control plane as users run it: gunicorn as a subprocess on a free loopback port."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.support import PROJECT_ROOT, app_env, free_port, stop_process


class GunicornServer:
    """The control plane as users run it: gunicorn with several sync workers, as a subprocess."""

    def __init__(
        self,
        database_url: str,
        tmp_path: Path,
        workers: int = 4,
        tls: tuple[Path, Path, Path] | None = None,
        wrapper: list[str] | None = None,
        **env: str,
    ) -> None:
        """`tls` is (certificate, key, CA certificate): gunicorn then serves HTTPS with them.
        `wrapper` comes before gunicorn's command line (a command that ends by exec'ing the rest)."""
        self.wrapper = wrapper or []
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
                [*self.wrapper, sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf", "wsgi:app"],
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
            except (requests.ConnectionError, requests.Timeout):  # not up yet, or a first request still slow
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
