"""The agent's four data directories: health and --preflight ask the same question (N3, N4, R1).

A bare-metal agent left at the image's /data/* defaults, or pointed at a file or a directory it
cannot write to, hears it from its health (degraded, each directory named) and from `--preflight`
(exit 2, each directory and its variable named), in the same words from one function.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import modelforge_node_agent as agent
from app import rules
from tests.support.agent import FakeControlPlane, make_agent, make_config

# A directory no process can create a file in, root included (the suite may run as root, for whom
# a mode-0500 directory is still writable).
UNWRITABLE = Path("/proc")


@pytest.fixture
def fake():
    control_plane = FakeControlPlane()
    yield control_plane
    control_plane.close()


def broken_dirs(tmp_path: Path) -> dict[str, str]:
    """The variables of one usable state directory and three unusable ones."""
    (tmp_path / "a-file").write_text("not a directory")
    return {
        "MODELFORGE_AGENT_HF_CACHE_DIR": str(tmp_path / "missing"),
        "MODELFORGE_AGENT_ARTIFACT_DIR": str(tmp_path / "a-file"),
        "MODELFORGE_AGENT_QUARANTINE_DIR": str(UNWRITABLE),
    }


def expected_problems(tmp_path: Path) -> dict[str, str]:
    return {
        "hf-cache": f"{tmp_path / 'missing'} does not exist",
        "artifacts": f"{tmp_path / 'a-file'} is not a directory",
        "quarantine": f"{UNWRITABLE} is not writable by this agent (uid {agent.os.getuid()})",
    }


def run_preflight_cli(monkeypatch, capsys, env: dict[str, str]) -> tuple[int, str]:
    for name in list(agent.os.environ):
        if name.startswith("MODELFORGE_AGENT_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # configure_logging() takes the agent's logger off the root logger onto this test's stderr:
    # each is put back afterwards, or later tests' caplog hears nothing from the agent.
    monkeypatch.setattr(agent.log, "handlers", [])
    monkeypatch.setattr(agent.log, "propagate", agent.log.propagate)
    monkeypatch.setattr(agent.log, "level", agent.log.level)
    code = agent.main(["--preflight"])
    return code, capsys.readouterr().out


def test_health_reports_every_unusable_data_directory_in_its_inventory_and_heartbeat(tmp_path, fake):
    config = make_config(tmp_path, fake.url, **broken_dirs(tmp_path))
    assert agent.data_dir_problems(config.data_dirs) == expected_problems(tmp_path)
    running = make_agent(config)
    assert running.run(once=True) == 0
    (inventory,) = fake.bodies("inventory")
    storage = inventory["inventory"]["storage"]
    # R1: the inventory says which directory and why, so readiness can name the fix.
    assert {name: facts["problem"] for name, facts in storage.items() if "problem" in facts} == expected_problems(
        tmp_path
    )
    (heartbeat,) = fake.bodies("heartbeat")
    assert heartbeat["health"]["status"] == "degraded"
    for name, reason in expected_problems(tmp_path).items():
        assert f"{name} directory: {reason}" in heartbeat["health"]["detail"]
    assert "state directory" not in heartbeat["health"]["detail"]


def test_health_is_ok_once_every_directory_is_usable(tmp_path, fake):
    for name in ("hf-cache", "quarantine"):
        (tmp_path / name).mkdir()
    config = make_config(tmp_path, fake.url, MODELFORGE_AGENT_HF_CACHE_DIR=str(tmp_path / "hf-cache"))
    assert make_agent(config).run(once=True) == 0
    (heartbeat,) = fake.bodies("heartbeat")
    assert heartbeat["health"] == {"status": "ok", "detail": "CPU-only; all readings succeeded"}
    assert not any("problem" in facts for facts in fake.bodies("inventory")[0]["inventory"]["storage"].values())


def test_preflight_refuses_unusable_data_directories_with_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "state").mkdir()
    env = {
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_DIR": str(tmp_path / "state"),
        **broken_dirs(tmp_path),
    }
    code, report = run_preflight_cli(monkeypatch, capsys, env)
    assert code == agent.EXIT_CONFIG == 2, report
    # The very words of the health detail, each with the variable that moves it.
    for name, reason in expected_problems(tmp_path).items():
        assert f"data directory {name}: {reason}; create it or set {agent.DATA_DIRS[name][0]}" in report
    assert f"data directory state: {tmp_path / 'state'} is writable" in report
    assert report.rstrip().endswith("result: FAIL data directories unusable: artifacts, hf-cache, quarantine")


def test_preflight_outside_the_image_without_the_variables_fails_on_the_data_defaults(monkeypatch, capsys):
    # Nothing set, as a bare-metal agent started with only a URL and token: /data/* does not exist here.
    if any(Path(default).exists() for _variable, default in agent.DATA_DIRS.values()):
        pytest.fail("this machine has /data/* directories; the test needs a host without them")
    code, report = run_preflight_cli(monkeypatch, capsys, {"MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu"})
    assert code == 2
    assert "data directory hf-cache: /data/hf-cache does not exist; create it or set MODELFORGE_AGENT_HF_CACHE_DIR" in (
        report
    )


def test_preflight_passes_with_four_writable_directories_and_leaves_them_empty(tmp_path, monkeypatch, capsys):
    env = {"MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu"}
    for name, (variable, _default) in agent.DATA_DIRS.items():
        (tmp_path / name).mkdir()
        env[variable] = str(tmp_path / name)
    code, report = run_preflight_cli(monkeypatch, capsys, env)
    assert code == 0, report
    assert report.rstrip().endswith("result: PASS")
    assert all(not any((tmp_path / name).iterdir()) for name in agent.DATA_DIRS)  # the write probe is gone


def test_an_nvidia_failure_still_exits_3_when_a_directory_is_unusable_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    env = {"MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia", **broken_dirs(tmp_path)}
    code, report = run_preflight_cli(monkeypatch, capsys, env)
    assert code == agent.EXIT_PREFLIGHT == 3
    assert "FAIL NVIDIA_NVML_UNAVAILABLE" in report and "data directory hf-cache:" in report


def test_the_control_plane_names_the_agents_data_directories_and_variables():
    """One list each side of the wire (the agent has no app imports): they must agree."""
    assert {name: variable for name, (variable, _default) in agent.DATA_DIRS.items()} == rules.AGENT_DATA_DIR_VARIABLES
    config = agent.load_config({variable: f"/x/{name}" for name, variable in rules.AGENT_DATA_DIR_VARIABLES.items()},
                               need_url=False)  # fmt: skip
    assert {name: str(path) for name, path in config.data_dirs.items()} == {
        name: f"/x/{name}" for name in rules.AGENT_DATA_DIR_VARIABLES
    }
