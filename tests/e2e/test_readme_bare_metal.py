"""The README's bare-metal agent, run as written, reaches "ready" with every check green (R1, N3, N4).

The commands between the README's `bare-metal-agent` markers run with bash, unchanged, against the
real control plane under gunicorn, in a directory laid out as the checkout they are written for:
`.venv/bin/python` there is this test's interpreter, and `$API` and `$TOKEN` are what the README's
previous block sets (the control plane's URL, a token minted through the admin API). NVML is the
fake one (tests/support/fake_nvml) as in every agent test; the GPU case swaps the README's
`MODELFORGE_AGENT_ACCELERATOR_MODE=cpu` for `nvidia`, as its text tells a GPU box to.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from app import rules
from tests.support import ADMIN, PROJECT_ROOT, wait_until
from tests.support.agent import FAKE_NVML_DIR, FAKE_RTX_4080, fake_nvml_scenario, mint_token, venv_checkout

README = PROJECT_ROOT / "README.md"
BEGIN, END = "<!-- bare-metal-agent:begin -->", "<!-- bare-metal-agent:end -->"
CPU_MODE = "MODELFORGE_AGENT_ACCELERATOR_MODE=cpu"


def readme_commands(text: str) -> str:
    """The one bash block between the README's bare-metal markers."""
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"README.md needs one {BEGIN} … {END} block"
    (commands,) = re.findall(r"```bash\n(.*?)```", text.split(BEGIN, 1)[1].split(END, 1)[0], re.S)
    return commands


class ReadmeRun:
    """The README's commands in bash; `wait` after them keeps bash as the agent's parent, so the test
    can stop both (they are their own process group) and bash reaps the agent."""

    def __init__(self, commands: str, cwd: Path, **env: str) -> None:
        self.output = cwd / "readme-run.log"
        with self.output.open("wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", commands + "wait\n"],
                cwd=cwd,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def readiness(server, node_id: str) -> dict:
    response = requests.get(f"{server.url}/api/v1/admin/nodes/{node_id}/readiness", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def node_of(server, enrollment_id: str) -> str | None:
    response = requests.get(f"{server.url}/api/v1/admin/node-enrollments/{enrollment_id}", headers=ADMIN, timeout=10)
    return response.json().get("node_id")


def run_until_ready(server, tmp_path: Path, commands: str, **env: str) -> tuple[dict, Path, ReadmeRun]:
    """Run `commands` with a fresh token; return the node's readiness once ready (or fail with it)."""
    minted = mint_token(server.url)
    checkout = venv_checkout(tmp_path / "checkout")
    run = ReadmeRun(commands, checkout, API=server.url, TOKEN=minted["token"], PYTHONPATH=FAKE_NVML_DIR, **env)
    try:
        node_id = wait_until(lambda: node_of(server, minted["id"]), lambda: f"no node enrolled:\n{run.log()}")
        answer = {}

        def ready() -> bool:
            answer.update(readiness(server, node_id))
            return answer["ready"]

        wait_until(ready, lambda: f"not ready: {answer}\n{run.log()}", timeout=30)
    except BaseException:
        run.stop()
        raise
    return answer, checkout, run


@pytest.mark.parametrize("mode", ["cpu", "nvidia"])
def test_the_readmes_bare_metal_agent_reaches_ready_with_every_check_green(agent_server, tmp_path, mode):
    commands = readme_commands(README.read_text(encoding="utf-8"))
    assert commands.count(CPU_MODE) == 1
    env = {}
    if mode == "nvidia":
        commands = commands.replace(CPU_MODE, "MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia")
        env["FAKE_NVML_SCENARIO"] = fake_nvml_scenario(FAKE_RTX_4080)
    answer, checkout, run = run_until_ready(agent_server, tmp_path, commands, **env)
    try:
        checks = {check["name"]: check for check in answer["checks"]}
        assert {name: check["status"] for name, check in checks.items()} == {
            "connection": "pass",
            "inventory": "pass",
            "protocol": "pass",
            "agent_health": "pass",
            **({"telemetry": "pass"} if mode == "nvidia" else {}),
        }, answer
        assert checks["agent_health"]["detail"].endswith("all readings succeeded")
        # The README runs --preflight first: it checked the same four directories and passed.
        assert "result: PASS" in run.log() and run.log().count("is writable") == 4, run.log()
        assert (checkout / "instance" / "state" / "node-credential").exists()
    finally:
        run.stop()


def test_without_its_data_directories_the_same_agent_is_degraded_and_readiness_names_them(agent_server, tmp_path):
    """The check above can fail: the README's commands less the hf-cache and quarantine variables
    (the agent falls back to /data/*, absent here) leave health degraded, preflight exit 2, and a
    readiness next step that names each directory to create."""
    commands = readme_commands(README.read_text(encoding="utf-8"))
    for variable in ("MODELFORGE_AGENT_HF_CACHE_DIR", "MODELFORGE_AGENT_QUARANTINE_DIR"):
        commands, found = re.subn(rf"{variable}=\S+", "", commands)
        assert found == 1, variable
    minted = mint_token(agent_server.url)
    checkout = venv_checkout(tmp_path / "checkout")
    run = ReadmeRun(commands, checkout, API=agent_server.url, TOKEN=minted["token"], PYTHONPATH=FAKE_NVML_DIR)
    try:
        node_id = wait_until(lambda: node_of(agent_server, minted["id"]), lambda: run.log())
        health = wait_until(
            lambda: next(
                (
                    c
                    for c in readiness(agent_server, node_id)["checks"]
                    if c["name"] == "agent_health" and c["status"] == "fail"
                ),
                None,
            ),
            "agent_health to fail",
        )
        assert "/data/hf-cache does not exist" in health["detail"]
        assert (
            "`mkdir -p /data/hf-cache`" in health["next_step"]
            and "MODELFORGE_AGENT_QUARANTINE_DIR" in health["next_step"]
        )
        assert "result: FAIL data directories unusable: hf-cache, quarantine" in run.log()
    finally:
        run.stop()


def test_the_readme_sets_every_data_directory_under_one_base():
    """N4: the four variables the agent reads (app.rules, held to the agent's own list by a unit
    test), each a directory below the block's first variable, which its mkdir creates."""
    commands = readme_commands(README.read_text(encoding="utf-8"))
    base = re.match(r"(\w+)=", commands)[1]
    (mkdir,) = re.findall(r"^mkdir -p .*$", commands, re.M)
    for name, variable in rules.AGENT_DATA_DIR_VARIABLES.items():
        assert len(re.findall(rf"\b{variable}=\${base}/{name}(?:\s|$)", commands)) == 1, variable
        assert f'"${base}/{name}' in mkdir, name
