"""The enrol wizard offers a bare-metal (virtual environment) start beside Docker's, with the
settings the admin chose and the four data directories the README's example sets (C4, N4)."""

from __future__ import annotations

import re
from html import unescape

from app import rules
from app.console.commands import AgentEnv, venv_start_command
from tests.support import PROJECT_ROOT
from tests.support.console import htmx_post


def reveal(console, **fields: str) -> str:
    data = {"display_name": "Rack GPU", "expires_in_seconds": "900", "accelerator_mode": "cpu",
            "image_source": "local", **fields}  # fmt: skip
    response = htmx_post(console, "/hardware/enroll", data=data)
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def pre(html: str, name: str) -> str:
    return unescape(re.search(rf'id="{name}"[^>]*>(.*?)</pre>', html, re.S)[1])


def test_the_reveal_offers_the_venv_command_beside_the_docker_one(console):
    html = reveal(console, display_name="Bob's GPU box #2")
    assert 'data-testid="start-command"' in html and 'data-testid="venv-option"' in html
    command = pre(html, "venv-command")
    # The very text venv_start_command() writes for the enrolment's own settings (E3: the origin).
    expected = venv_start_command(
        AgentEnv(control_plane_url="http://localhost", display_name="Bob's GPU box #2", accelerator_mode="cpu")
    )
    assert command == expected
    assert "export MODELFORGE_AGENT_CONTROL_PLANE_URL=http://localhost\n" in command
    assert "export MODELFORGE_AGENT_ACCELERATOR_MODE=cpu\n" in command
    assert "export MODELFORGE_AGENT_DISPLAY_NAME='Bob'\"'\"'s GPU box #2'\n" in command
    assert "docker" not in command and "mfe_" + "x" not in command
    token = re.search(r'id="enrollment-token"[^>]*>(mfe_[^<]+)<', html)[1]
    assert token not in command  # P2: read on the node from a hidden prompt


def test_the_venv_command_and_the_readme_set_the_same_four_data_directories():
    """One list (app.rules) for the wizard; the README's bare-metal block is held to it too."""
    command = venv_start_command(AgentEnv(control_plane_url="https://mf.lan:8000", display_name="n"))
    (mkdir,) = re.findall(r"^  mkdir -p -- .*$", command, re.M)
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- bare-metal-agent:begin -->", 1)[1].split("<!-- bare-metal-agent:end -->", 1)[0]
    set_in_command = set(re.findall(r"export (MODELFORGE_AGENT_\w+_DIR)=", command))
    set_in_readme = set(re.findall(r"\b(MODELFORGE_AGENT_\w+_DIR)=", block))
    assert set_in_command == set_in_readme == set(rules.AGENT_DATA_DIR_VARIABLES.values())
    for name, variable in rules.AGENT_DATA_DIR_VARIABLES.items():
        assert f'export {variable}="$agent_data/{name}"\n' in command
        assert f'"$agent_data/{name}"' in mkdir
    assert command.index("--preflight") < command.index("read -rs")  # nothing asked before the check
