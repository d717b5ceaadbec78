"""Running the real node agent as a subprocess against a real control plane."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.support import ADMIN, PROJECT_ROOT

FAKE_NVML_DIR = str(PROJECT_ROOT / "tests" / "fake_nvml")


def mint_token(url: str, verify: bool | str = True) -> dict:
    """Mint an enrolment token through the admin API."""
    response = requests.post(
        url + "/api/v1/admin/node-enrollments",
        json={"display_name": "agent under test", "expires_in_seconds": 900},
        headers=ADMIN,
        timeout=10,
        verify=verify,
    )
    assert response.status_code == 201, response.text
    return response.json()


class AgentProcess:
    """`python -m modelforge_node_agent` with its own state and data directories."""

    def __init__(self, tmp_path: Path, control_plane_url: str, name: str = "agent", **env: str) -> None:
        self.home = tmp_path / name
        self.state_dir = self.home / "state"
        for directory in ("state", "hf-cache", "artifacts", "quarantine"):
            (self.home / directory).mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "agent.log"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": control_plane_url,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_HOSTNAME": f"{name}-host",
            "MODELFORGE_AGENT_STATE_DIR": str(self.state_dir),
            "MODELFORGE_AGENT_HF_CACHE_DIR": str(self.home / "hf-cache"),
            "MODELFORGE_AGENT_ARTIFACT_DIR": str(self.home / "artifacts"),
            "MODELFORGE_AGENT_QUARANTINE_DIR": str(self.home / "quarantine"),
            **env,
        }
        self.process: subprocess.Popen | None = None

    def with_fake_nvml(self, scenario: str) -> AgentProcess:
        """Put the fake pynvml first on the agent's path (no GPU on this machine)."""
        self.env["PYTHONPATH"] = FAKE_NVML_DIR
        self.env["FAKE_NVML_SCENARIO"] = scenario
        return self

    def start(self, *args: str) -> AgentProcess:
        """Start the agent in the background."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "modelforge_node_agent", *args],
                cwd=self.home,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def run(self, *args: str, timeout: float = 60) -> int:
        """Run the agent to completion; return its exit code."""
        self.start(*args)
        return self.process.wait(timeout=timeout)

    def wait_for(self, pattern: str, timeout: float = 30, count: int = 1) -> list[re.Match]:
        """Wait until the log holds `count` matches of `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            matches = list(re.finditer(pattern, self.log()))
            if len(matches) >= count:
                return matches
            if self.process and self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} x{count} not in the agent log within {timeout}s:\n{self.log()}")

    def stop(self, timeout: float = 5) -> float:
        """SIGTERM; return how long the agent took to exit."""
        if not self.process or self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        return time.monotonic() - started

    def node_id(self) -> str:
        """The persisted node ID."""
        return (self.state_dir / "node-id").read_text().strip()

    def credential(self) -> str:
        """The stored credential (tests only read it to grep logs for it)."""
        return (self.state_dir / "node-credential").read_text().strip()

    def log(self) -> str:
        """What the agent printed."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""


def nvidia_agent(tmp_path: Path, server, scenario: str, name: str = "agent") -> tuple[AgentProcess, dict]:
    """An agent in nvidia mode on the fake NVML, holding a fresh token."""
    minted = mint_token(server.url)
    agent = AgentProcess(
        tmp_path,
        server.url,
        name=name,
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"],
        MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
    ).with_fake_nvml(scenario)
    return agent, minted
