"""gunicorn itself refuses a bad configuration with one line naming the variable."""

from __future__ import annotations

import subprocess
import sys

from tests.support import OPERATOR_KEY, PROJECT_ROOT


def test_gunicorn_refuses_to_start_with_one_line_naming_the_variable(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "MODELFORGE_INSTANCE_PATH": str(tmp_path),
        "MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY,
        "MODELFORGE_SECRET_KEY": "s",
        "MODELFORGE_NODE_STALE_AFTER_SECONDS": "120",
        "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "45",
        "MODELFORGE_BIND": "127.0.0.1:0",
    }
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf", "wsgi:app"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert (
        "modelforge: configuration error: MODELFORGE_NODE_OFFLINE_AFTER_SECONDS (45) must exceed "
        "MODELFORGE_NODE_STALE_AFTER_SECONDS (120)" in result.stderr
    )
    assert "Traceback" not in result.stderr
