"""V1: the agent runs nvidia-smi (stand-in scripts on PATH) and relays what it printed, or why not."""

from __future__ import annotations

from pathlib import Path

import requests

from app import acceptance
from tests.support import ADMIN, OPERATOR_KEY
from tests.support.agent import FAKE_RTX_4080, fake_nvml_scenario, nvidia_agent
from tests.support.console import csrf_from


def test_the_agent_runs_the_query_and_relays_what_nvidia_smi_printed_or_why_not(tmp_path):
    import modelforge_node_agent as agent

    assert agent.run_nvidia_smi({"PATH": str(tmp_path)}) == {"output": None, "problem": "nvidia-smi is not on PATH"}
    echo = stand_in(tmp_path / "echo", 'printf "NVIDIA GeForce RTX 4080, GPU-1, 550.54.14, 16376 MiB\\n# %s\\n" "$*"\n')
    answered = agent.run_nvidia_smi(echo)
    assert answered["exit_status"] == 0 and answered["problem"] is None
    assert answered["output"].splitlines() == [
        "NVIDIA GeForce RTX 4080, GPU-1, 550.54.14, 16376 MiB",
        "# " + " ".join(agent.NVIDIA_SMI_ARGS),
    ]
    assert " ".join(agent.NVIDIA_SMI_ARGS) in acceptance.checklist.gpu_facts.NVIDIA_SMI_QUERY
    failing = stand_in(
        tmp_path / "fail", 'printf "Failed to initialize NVML:\\tDriver/library version mismatch\\n" >&2\nexit 9\n'
    )
    refused = agent.run_nvidia_smi(failing)
    assert refused["output"] is None and refused["exit_status"] == 9
    assert (
        refused["problem"]
        == "nvidia-smi exited with status 9: Failed to initialize NVML:?Driver/library version mismatch"
    )
    flood = stand_in(tmp_path / "flood", "head -c 100000 /dev/zero | tr '\\0' 'x'\n")
    assert len(agent.run_nvidia_smi(flood)["output"]) == agent.NVIDIA_SMI_MAX_OUTPUT


def test_a_node_printing_a_memory_field_past_int_limits_takes_no_page_down(agent_server, tmp_path):
    """Issue 22 item 4 through gunicorn and the real agent: 4,301 digits of memory.total are unreadable, not a 500."""
    line = f"{FAKE_RTX_4080['name']}, {FAKE_RTX_4080['uuid']}, 550.54.14, {'9' * 4301} MiB"
    agent, _ = nvidia_agent(tmp_path, agent_server, fake_nvml_scenario(FAKE_RTX_4080))
    agent.env |= stand_in(tmp_path / "huge", f'printf "{line}\\n"\n')
    assert agent.run("--once") == 0, agent.log()
    node_id, base = agent.node_id(), agent_server.url
    checklist = requests.get(f"{base}/api/v1/admin/nodes/{node_id}/acceptance", headers=ADMIN, timeout=10)
    assert checklist.status_code == 200, checklist.text
    gpu_facts = next(item for item in checklist.json()["items"] if item["name"] == "gpu_facts")
    assert gpu_facts["state"] == "contradicted" and "memory" in gpu_facts["detail"], gpu_facts
    for path in (
        f"/api/v1/hardware/nodes/{node_id}",
        "/api/v1/hardware/nodes",
        f"/api/v1/admin/nodes/{node_id}/acceptance/export",
    ):
        assert requests.get(base + path, headers=ADMIN, timeout=10).status_code == 200, path
    eligible = requests.post(
        f"{base}/api/v1/admin/nodes/{node_id}/production-eligibility",
        json={"production_eligible": True},
        headers=ADMIN,
        timeout=10,
    )
    assert eligible.status_code == 409 and "gpu_facts" in eligible.json()["contradicted"], eligible.text
    browser = requests.Session()
    form = browser.get(base + "/login", timeout=10)
    signed = browser.post(
        base + "/login", data={"csrf_token": csrf_from(form.text), "operator_key": OPERATOR_KEY}, timeout=10
    )
    assert signed.status_code == 200, signed.text
    for path in (f"/hardware/nodes/{node_id}", f"/hardware/nodes/{node_id}/acceptance", "/hardware/nodes"):
        assert browser.get(base + path, timeout=10).status_code == 200, path
    assert "Traceback" not in agent_server.log()


def stand_in(directory: Path, script: str) -> dict[str, str]:
    """A PATH whose only nvidia-smi is this shell script."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return {"PATH": f"{directory}:/usr/bin:/bin"}
