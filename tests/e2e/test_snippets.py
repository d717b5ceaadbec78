"""The wizard's generated text, byte for byte, against golden files (C4, D5, P2).

tests/data/snippets/ holds what every public generator of app/console/commands.py wrote for a fixed
set of inputs: each image mode (a release bundle whose pasted entry carries `$`, quotes, backquotes,
backslashes, unicode and template-marker look-alikes; a digest-pinned registry image; a local
build), the credential snippet, the .env, and the runtime worker's start commands (GPU and CPU
images, W3) for each mode, with and without the worker's release entries. A change to how the
text is built must leave it as it was; a change meant to alter it regenerates the files with
`python -m tests.test_snippets` and shows the difference in the commit.

Every .sh template under app/console/snippets/, read as a file, and every generated snippet pass
shellcheck.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from app.console.commands import (
    LOCAL_BUILD,
    WORKER_CPU,
    WORKER_GPU,
    AgentEnv,
    env_file,
    pinned_image,
    recreate_command,
    release_image,
    replace_credential_command,
    start_command,
    venv_start_command,
    worker_start_command,
)
from app.release_manifest import NODE_AGENT, RUNTIME_WORKER, RUNTIME_WORKER_CPU, record_from_json
from tests.support import DATA_DIR, PROJECT_ROOT

GOLDEN = DATA_DIR / "snippets"
TEMPLATES = sorted((PROJECT_ROOT / "app" / "console" / "snippets").glob("*.sh"))
URL = "https://mf.lan:8000"

# Every kind of text a pasted manifest entry may carry into the start command (D5): shell syntax,
# quotes, backquotes, backslashes, unicode, an empty list item, and markers of both placeholder
# styles (today's __NAME__ and the @@NAME@@ of .sh templates), which must be written as they are.
HOSTILE_ENTRY = {
    "tag": f"{NODE_AGENT}:1.3.0-rc.1",
    "architecture": "amd64",
    "os": "linux",
    "rootfs_layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64],
    "labels": {
        "org.opencontainers.image.version": "1.3.0-rc.1",
        "org.example.hostile": 'it\'s $(touch pwned) `id` "q" end',
        "org.example.unicode": "Büro-GPU ☃ — naïve",
        "org.example.backslash": "back\\slash $HOME \\x24 \\n ${x}",
        "org.example.trailing": "ends in a backslash $\\",
        "org.example.markers": "__COMPOSE__ @@COMPOSE@@ @@EXPECTATIONS@@ {{.Id}} __IMAGE__",
    },
    "config": {
        "entrypoint": ["/usr/bin/python3", "-m", "modelforge_node_agent"],
        "cmd": ["--verbose", "it's $HOME", ""],
        "env": ["PATH=/usr/local/bin:/usr/bin", 'GREETING=héllo `x` "$y"'],
        "volumes": ["/state", "/hf cache"],
        "exposed_ports": ["8080/tcp"],
        "user": "65532:65532",
        "working_dir": "/srv/it's here",
    },
    "image_id": "sha256:" + "d" * 64,
}
HOSTILE_RELEASE = record_from_json(HOSTILE_ENTRY)
# W3: the worker's entries of the same manifest, as hostile as the agent's.
HOSTILE_WORKERS = tuple(
    record_from_json({**HOSTILE_ENTRY, "tag": f"{name}:1.3.0-rc.1"}, name)
    for name in (RUNTIME_WORKER, RUNTIME_WORKER_CPU)
)
# The least an entry can hold, and a tag that looks like a marker.
MINIMAL_RELEASE = record_from_json(
    {
        "tag": f"{NODE_AGENT}:1__BUNDLE__",
        "architecture": "arm64",
        "os": "linux",
        "rootfs_layers": ["sha256:" + "e" * 64],
        "labels": {"a": "x__COMPOSE__y", "b": "@@BUNDLE@@"},
        "config": {
            "entrypoint": [],
            "cmd": [],
            "env": [],
            "volumes": [],
            "exposed_ports": [],
            "user": "",
            "working_dir": "",
        },
    }
)
PINNED = pinned_image("registry.lan:5000/team/modelforge-node-agent:1.3.0@sha256:" + "0123456789abcdef" * 4)
PINNED_UNTAGGED = pinned_image(f"{NODE_AGENT}@sha256:" + "f" * 64)

SOURCES = {
    "local": LOCAL_BUILD,
    "digest": PINNED,
    "digest-untagged": PINNED_UNTAGGED,
    "release-hostile": release_image(HOSTILE_RELEASE, HOSTILE_WORKERS),
    "release-minimal": release_image(MINIMAL_RELEASE),
}

CASES: dict[str, Callable[[], str]] = {
    "start-default": start_command,
    "recreate-default": recreate_command,
    "replace-credential": replace_credential_command,
    "env-default": lambda: env_file(AgentEnv(control_plane_url=URL, display_name="GPU Node")),
    "env-tricky": lambda: env_file(
        AgentEnv(
            control_plane_url="http://10.0.0.5:8000",
            display_name="Bob's GPU box #2",
            accelerator_mode="cpu",
            image=PINNED.reference,
            state_volume="/mnt/user/app data/state",
            hf_cache_volume='C:\\models "hf"',
            artifact_volume="costs $5 # a lot",
            quarantine_volume="Büro ☃",
        )
    ),
    "env-release": lambda: env_file(
        AgentEnv(
            control_plane_url=URL,
            display_name="rack",
            accelerator_mode="auto",
            image=HOSTILE_RELEASE.tag,
            worker_image=SOURCES["release-hostile"].worker_image(WORKER_GPU),
            worker_cpu_image=SOURCES["release-hostile"].worker_image(WORKER_CPU),
        )
    ),
    "env-release-without-workers": lambda: env_file(
        AgentEnv(
            control_plane_url=URL,
            display_name="rack",
            image=MINIMAL_RELEASE.tag,
            worker_image=SOURCES["release-minimal"].worker_image(WORKER_GPU),
            worker_cpu_image=SOURCES["release-minimal"].worker_image(WORKER_CPU),
        )
    ),
}
# C4, N4: the bare-metal (virtual environment) start command, plain and with words Bash must quote.
CASES["venv-default"] = lambda: venv_start_command(AgentEnv(control_plane_url=URL, display_name="GPU Node"))
CASES["venv-tricky"] = lambda: venv_start_command(
    AgentEnv(control_plane_url="http://10.0.0.5:8000", display_name="Bob's GPU box #2 `x`", accelerator_mode="cpu")
)
for _mode, _source in SOURCES.items():
    CASES[f"start-{_mode}"] = lambda source=_source: start_command(source)
    CASES[f"recreate-{_mode}"] = lambda source=_source: recreate_command(source)
    for _image in (WORKER_GPU, WORKER_CPU):
        _suffix = "" if _image is WORKER_GPU else "-cpu"
        CASES[f"worker{_suffix}-{_mode}"] = lambda source=_source, image=_image: worker_start_command(source, image)


def golden_path(name: str) -> Path:
    return GOLDEN / f"{name}.golden"


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_text_is_byte_identical_to_its_golden_file(name):
    """C4, D5: the same inputs give the same bytes, whatever builds the text."""
    assert CASES[name]().encode("utf-8") == golden_path(name).read_bytes()


def test_every_golden_file_belongs_to_a_case():
    """A golden file left behind by a removed case would check nothing."""
    assert sorted(path.stem for path in GOLDEN.glob("*.golden")) == sorted(CASES)


def shellcheck(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["shellcheck", str(path)], capture_output=True, text=True, timeout=30)


def test_the_templates_are_found():
    """The parametrised check below is not vacuous: it sees the whole snippets at least."""
    assert {"start.sh", "recreate.sh", "replace-credential.sh"} <= {path.name for path in TEMPLATES}


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda path: path.name)
def test_every_template_passes_shellcheck_as_a_file(template, tmp_path):
    """C4: each .sh template, header included, is Bash that shellcheck reads on its own.

    Markers get harmless values first: a marker alone on its line (a part filled in elsewhere)
    goes, any other becomes a plain word. The header names the shell, so no -s is given.
    """
    text = template.read_text(encoding="utf-8")
    assert text.startswith("# shellcheck shell=bash") and "\n\n" in text
    harmless = re.sub(r"@@[A-Z_]+@@", "placeholder", re.sub(r"(?m)^@@[A-Z_]+@@\n", "", text))
    checked = tmp_path / template.name
    checked.write_text(harmless, encoding="utf-8")
    result = shellcheck(checked)
    assert result.returncode == 0, result.stdout + result.stderr


BASH_CASES = sorted(name for name in CASES if not name.startswith("env-"))


@pytest.mark.parametrize("name", BASH_CASES)
def test_every_generated_snippet_passes_shellcheck(name, tmp_path):
    """C4, D5: every image mode's snippets, hostile labels included, have no findings and disable none."""
    snippet = CASES[name]()
    assert "shellcheck" not in snippet  # the templates' directives stay in their headers
    checked = tmp_path / "snippet.sh"
    checked.write_text("# shellcheck shell=bash\n" + snippet + "\n", encoding="utf-8")
    result = shellcheck(checked)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_reports_a_template_with_a_broken_line(tmp_path):
    """The checks above can fail: an unquoted expansion in a template is reported."""
    broken = tmp_path / "broken.sh"
    broken.write_text("# shellcheck shell=bash\n\n  rm -f -- $secret_file\n", encoding="utf-8")
    result = shellcheck(broken)
    assert result.returncode != 0 and "SC2086" in result.stdout


def main() -> int:
    """Write every golden file from the current code (a deliberate change only; review the diff)."""
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, generate in sorted(CASES.items()):
        golden_path(name).write_bytes(generate().encode("utf-8"))
    print(f"wrote {len(CASES)} golden files to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
