"""The wizard's bare-metal start command, run for real against gunicorn (C4, N3, N4, I3, P2).

It runs with bash in a directory laid out as a checkout (`.venv/bin/python` is this interpreter),
HOME in the test's temp directory (the data directories go below it), the token on standard input
as a paste into its hidden prompt, and the fake NVML on PYTHONPATH as in every agent test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from app.console.commands import AgentEnv, venv_start_command
from tests.support import ADMIN, assert_no_secrets, wait_until
from tests.support.agent import FAKE_NVML_DIR, mint_token, venv_checkout

TIMEOUT = 60


class VenvNode:
    """A node with a checkout and a home directory; stops every agent its commands started."""

    def __init__(self, tmp_path: Path) -> None:
        self.checkout = venv_checkout(tmp_path / "checkout")
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.data = self.home / "modelforge-node-agent"
        self.pids: list[int] = []

    def run(self, command: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["bash", "-c", command],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=self.checkout,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(self.home),
                "LANG": "C.UTF-8",
                "PYTHONPATH": FAKE_NVML_DIR,
                **env,
            },
            timeout=TIMEOUT,
        )
        self.pids += [int(pid) for pid in re.findall(r"started the agent \(process (\d+)\)", result.stderr)]
        return result

    def alive(self, pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state != "Z"  # an orphan's zombie is dead, whoever reaps it

    def stop(self) -> None:
        for pid in self.pids:
            if self.alive(pid):
                os.kill(pid, signal.SIGTERM)
                wait_until(lambda pid=pid: not self.alive(pid), f"agent {pid} to stop", timeout=15)


@pytest.fixture
def node(tmp_path):
    running = VenvNode(tmp_path)
    yield running
    running.stop()


def command_for(server, mode: str = "cpu") -> str:
    return venv_start_command(
        AgentEnv(control_plane_url=server.url, display_name="Bob's $HOME box", accelerator_mode=mode)
    )


def readiness(server, node_id: str) -> dict:
    return requests.get(f"{server.url}/api/v1/admin/nodes/{node_id}/readiness", headers=ADMIN, timeout=10).json()


def test_the_venv_command_enrols_a_ready_node_and_restarts_it_without_a_token(agent_server, node):
    minted = mint_token(agent_server.url)
    result = node.run(command_for(agent_server), minted["token"] + "\n")
    assert result.returncode == 0, result.stdout + result.stderr
    (pid,) = node.pids
    assert "not enrolled yet; it needs the one-time token" in result.stderr  # (read -p prompts on a terminal only)
    assert "result: PASS" in result.stdout and result.stdout.count("is writable") == 4
    assert_no_secrets(result.stdout + result.stderr, minted["token"])
    # P2: the token reaches the agent through its environment, never its command line.
    assert minted["token"] not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")

    state = node.data / "state"
    wait_until(lambda: (state / "node-id").exists(), lambda: (node.data / "agent.log").read_text())
    node_id = (state / "node-id").read_text().strip()
    answer = {}

    def ready() -> bool:
        answer.update(readiness(agent_server, node_id))
        return answer.get("ready", False)  # 404 until the node has enrolled

    wait_until(ready, lambda: f"{answer}\n{(node.data / 'agent.log').read_text()}")
    assert {check["status"] for check in answer["checks"]} == {"pass"}
    assert {path.name for path in node.data.iterdir()} >= {"state", "hf-cache", "artifacts", "quarantine"}

    # I3: the same command again, once enrolled: no prompt, no token, the same node.
    node.stop()
    again = node.run(command_for(agent_server))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "enrolled already" in again.stderr and "not enrolled yet" not in again.stderr
    assert (state / "node-id").read_text().strip() == node_id
    log = node.data / "agent.log"
    wait_until(lambda: f"node {node_id} starting with its stored credential" in log.read_text(), log.read_text)
    assert log.read_text().count("enrolled as node") == 1 and node.alive(node.pids[-1])


def test_the_venv_command_starts_nothing_when_the_preflight_fails(agent_server, node):
    result = node.run(command_for(agent_server, "nvidia"), "", FAKE_NVML_SCENARIO='{"gpus": []}')
    assert result.returncode == 1
    assert "FAIL NVIDIA_DEVICE_NOT_FOUND" in result.stdout
    assert "the preflight above failed; nothing was started" in result.stderr
    assert node.pids == [] and "enrolled" not in result.stderr  # never got as far as the token


@pytest.mark.parametrize("typed", ["not-a-token\n", "", "mfn_" + "c" * 43 + "\n"], ids=["word", "eof", "credential"])
def test_the_venv_command_refuses_what_is_not_a_token(agent_server, node, typed):
    result = node.run(command_for(agent_server), typed)
    assert result.returncode == 1
    assert "not an enrolment token (they start with mfe_); nothing was started" in result.stderr
    assert node.pids == [] and not (node.data / "state" / "node-id").exists()
    if typed.strip():
        assert typed.strip() not in result.stdout + result.stderr


def test_the_venv_command_outside_a_checkout_says_how_to_make_one(agent_server, node):
    (node.checkout / ".venv" / "bin" / "python").unlink()
    result = node.run(command_for(agent_server))
    assert result.returncode == 1
    assert "python3 -m venv .venv && .venv/bin/pip install -e ." in result.stderr
    assert not node.data.exists()
