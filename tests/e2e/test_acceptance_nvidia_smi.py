"""V1: the agent runs nvidia-smi (stand-in scripts on PATH) and relays what it printed, or why not."""

from __future__ import annotations

from pathlib import Path

from app import acceptance


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


def stand_in(directory: Path, script: str) -> dict[str, str]:
    """A PATH whose only nvidia-smi is this shell script."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return {"PATH": f"{directory}:/usr/bin:/bin"}
