"""Release manifests and the wizard's release-image check, against a real podman image (D5, C4).

A tiny image (`FROM scratch`, two layers, OCI labels, one label full of shell syntax) is built
with podman. `deploy/release_manifest.py` runs under the system Python (no Flask) to write its
manifest and SHA256SUMS; the wizard's start command is run in Bash with a stand-in `docker` whose
`image inspect` is podman's own, so every Go template in the command is read by a real engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.console.commands import COMPOSE_FILE, AgentEnv, env_file, recreate_command, release_image, start_command
from app.release_manifest import NODE_AGENT, differences, parse_pasted, record_from_json, sums_text
from tests.support import PROJECT_ROOT

VERSION = "9.9.9-test"
TAG = f"{NODE_AGENT}:{VERSION}"
TOKEN = "mfe_" + "r" * 43
HOSTILE = 'it\'s $(touch pwned) `id` "q" end'
SYSTEM_PYTHON = "/usr/bin/python3"

CONTAINERFILE = f"""\
FROM scratch
COPY hello /hello
COPY second /second
LABEL org.opencontainers.image.title="{NODE_AGENT}" org.opencontainers.image.version="{VERSION}" \\
      org.example.hostile="it's \\$(touch pwned) `id` \\"q\\" end"
"""

# `image inspect` is podman's; compose is recorded; the container "runs" the image that the
# environment names, unless FAKE_RUNNING_IMAGE says otherwise.
FAKE_DOCKER = """\
import json, os, subprocess, sys

args = sys.argv[1:]
if args[:2] == ["image", "inspect"]:
    os.execvp("podman", ["podman", *args])
state = os.environ["FAKE_DOCKER_STATE"]
with open(os.path.join(state, "calls.jsonl"), "a", encoding="utf-8") as log:
    log.write(json.dumps({"argv": args, "image_env": os.environ.get("MODELFORGE_NODE_AGENT_IMAGE")}) + "\\n")
if args[0] == "inspect":
    print(open(os.path.join(state, "running-image"), encoding="utf-8").read())
elif args[0] == "compose" and "up" in args:
    image = os.environ["MODELFORGE_NODE_AGENT_IMAGE"]
    found = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image],
                           capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(state, "running-image"), "w", encoding="utf-8") as running:
        running.write(os.environ.get("FAKE_RUNNING_IMAGE") or found)
elif args[0] == "compose" and "ps" in args:
    print("4f3c0ffee")
"""


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, timeout=300)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The tiny image, and the release directory made from it by deploy/release_manifest.py."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("no container engine here (podman, runc)")
    context = tmp_path_factory.mktemp("image")
    (context / "hello").write_text("hello\n")
    (context / "second").write_text("second layer\n")
    (context / "Containerfile").write_text(CONTAINERFILE)
    podman("build", "-q", "-t", TAG, str(context))
    out = tmp_path_factory.mktemp("release")
    built = subprocess.run(
        [SYSTEM_PYTHON, "deploy/release_manifest.py", "--engine", "podman", "build", "--version", VERSION,
         "--out", str(out), TAG],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    yield out
    podman("rmi", "-f", TAG, check=False)


def entry(release: Path) -> dict:
    return json.loads((release / "manifest.json").read_text())["images"][NODE_AGENT]


def verify(manifest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SYSTEM_PYTHON, str(PROJECT_ROOT / "deploy/release_manifest.py"), "--engine", "podman", "verify",
         "--manifest", str(manifest)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


# --------------------------------------------------------------------------- manifest tool


def test_the_manifest_records_what_docker_load_keeps_and_the_sums_check(release):
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["schema"] == "modelforge-release-manifest/1" and manifest["version"] == VERSION
    assert manifest["bundle"] == f"modelforge-{VERSION}-images.tar"
    image = manifest["images"][NODE_AGENT]
    inspected = json.loads(podman("image", "inspect", TAG).stdout)[0]
    assert image["tag"] == TAG
    assert image["rootfs_layers"] == inspected["RootFS"]["Layers"] and len(image["rootfs_layers"]) == 2
    assert image["architecture"] == inspected["Architecture"] and image["os"] == "linux"
    assert image["labels"]["org.example.hostile"] == HOSTILE
    assert image["labels"]["org.opencontainers.image.version"] == VERSION
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=release, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count(": OK") == 2


def test_a_bundle_loaded_again_verifies_and_a_changed_manifest_does_not(release, tmp_path):
    podman("rmi", "-f", TAG)
    podman("load", "-i", str(release / f"modelforge-{VERSION}-images.tar"))
    matched = verify(release / "manifest.json")
    assert matched.returncode == 0, matched.stderr
    assert "matches" in matched.stdout

    changed = json.loads((release / "manifest.json").read_text())
    changed["images"][NODE_AGENT]["labels"]["org.opencontainers.image.version"] = "9.9.8"
    changed["images"][NODE_AGENT]["rootfs_layers"][0] = "sha256:" + "0" * 64
    (tmp_path / "manifest.json").write_text(json.dumps(changed))
    refused = verify(tmp_path / "manifest.json")
    assert refused.returncode == 1
    assert "label org.opencontainers.image.version: expected '9.9.8', found '9.9.9-test'" in refused.stderr
    assert "rootfs_layers" in refused.stderr


def test_a_tampered_bundle_fails_its_sums(release, tmp_path):
    copy = tmp_path / "release"
    shutil.copytree(release, copy)
    with (copy / "manifest.json").open("a") as manifest:
        manifest.write(" ")
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=copy, capture_output=True, text=True)
    assert checked.returncode != 0 and "manifest.json: FAILED" in checked.stdout
    assert sums_text([copy / "manifest.json"]) not in (release / "SHA256SUMS").read_text()


# --------------------------------------------------------------------------- pasted entries

GOOD = {
    "tag": f"{NODE_AGENT}:1.3.0-rc.1",
    "architecture": "amd64",
    "os": "linux",
    "rootfs_layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64],
    "labels": {"org.opencontainers.image.version": "1.3.0-rc.1"},
    "image_id": "sha256:" + "c" * 64,
}


def test_the_entry_or_the_whole_manifest_can_be_pasted():
    record = parse_pasted(json.dumps(GOOD))
    assert record.tag == GOOD["tag"] and record.version == "1.3.0-rc.1"
    assert parse_pasted(json.dumps({"images": {NODE_AGENT: GOOD, "other": {}}})) == record
    assert record_from_json(record.to_json()) == record


def test_the_image_id_is_never_compared():
    loaded = record_from_json({**GOOD, "image_id": "sha256:" + "d" * 64})
    assert differences(parse_pasted(json.dumps(GOOD)), loaded) == []
    extra_label = record_from_json({**GOOD, "labels": {**GOOD["labels"], "io.buildah.version": "1"}})
    assert differences(parse_pasted(json.dumps(GOOD)), extra_label) == []  # only recorded labels count


@pytest.mark.parametrize(
    ("pasted", "message"),
    [
        ("{", "not JSON"),
        ("[]", "must be a JSON object"),
        (json.dumps({"images": {"modelforge-control-plane": GOOD}}), "no images.modelforge-node-agent"),
        (json.dumps({**GOOD, "tag": "modelforge-node-agent"}), '"tag" must be a string'),
        (json.dumps({**GOOD, "tag": "evil/agent:1.0"}), "must name the modelforge-node-agent image"),
        (json.dumps({**GOOD, "tag": "modelforge-node-agent:latest"}), "release version"),
        (json.dumps({**GOOD, "tag": "modelforge-node-agent:1.0;rm -rf /"}), "release version"),
        (json.dumps({**GOOD, "architecture": "amd64 $(id)"}), '"architecture"'),
        (json.dumps({**GOOD, "rootfs_layers": []}), '"rootfs_layers" must be a list'),
        (json.dumps({**GOOD, "rootfs_layers": ["sha256:abc"]}), "every entry"),
        (json.dumps({**GOOD, "labels": {}}), '"labels" must be an object'),
        (json.dumps({**GOOD, "labels": {'a"}}{{x': "1"}}), "not a plain label name"),
        (json.dumps({**GOOD, "labels": {"a": "line\nbreak"}}), "printable"),
        (json.dumps({**GOOD, "labels": {"a": 1}}), "printable"),
        (json.dumps({**GOOD, "image_id": "abc"}), '"image_id"'),
        (json.dumps({**GOOD, "labels": {"a": "x" * 70_000}}), "more than 64 KiB"),
    ],
)
def test_a_bad_entry_is_refused_with_the_reason(pasted, message):
    with pytest.raises(ValueError) as refused:
        parse_pasted(pasted)
    assert message in str(refused.value)


# --------------------------------------------------------------------------- the start command


class ReleaseNode:
    """deploy/ with the wizard's .env for the release image, a stand-in docker over real podman."""

    def __init__(self, root: Path, record) -> None:
        self.deploy, self.bin, self.state, self.tmp = (root / name for name in ("deploy", "bin", "state", "tmp"))
        for directory in (self.deploy, self.bin, self.state, self.tmp):
            directory.mkdir()
        self.source = release_image(record)
        shutil.copyfile(PROJECT_ROOT / "deploy" / COMPOSE_FILE, self.deploy / COMPOSE_FILE)
        env = AgentEnv(control_plane_url="https://mf.lan:8000", display_name="rack", image=self.source.reference)
        (self.deploy / ".env").write_text(env_file(env) + "MODELFORGE_AGENT_HOSTNAME=rack\n")
        (self.bin / "docker").write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
        (self.bin / "docker").chmod(0o755)

    def run(self, snippet: str, **extra: str) -> subprocess.CompletedProcess:
        env = {
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(self.deploy.parent),
            "TMPDIR": str(self.tmp),
            "LANG": "C.UTF-8",
            "FAKE_DOCKER_STATE": str(self.state),
            **extra,
        }
        return subprocess.run(["bash", "-c", snippet], input=TOKEN + "\n", capture_output=True, text=True,
                              cwd=self.deploy, env=env, timeout=60)  # fmt: skip

    def calls(self) -> list[dict]:
        log = self.state / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_start_command_starts_the_checked_release_image(release, tmp_path):
    node = ReleaseNode(tmp_path, record_from_json(entry(release)))
    result = node.run(start_command(node.source))
    assert result.returncode == 0, result.stderr
    up, ps, inspect = node.calls()
    assert up["argv"][-5:] == ["-d", "--no-build", "--pull", "never", "node-agent"]
    assert up["image_env"] == TAG  # set explicitly, whatever the shell had exported
    assert ps["argv"][-3:] == ["ps", "-q", "node-agent"] and inspect["argv"][-1] == "4f3c0ffee"
    assert list(node.tmp.iterdir()) == []
    assert not (node.deploy / "pwned").exists() and TOKEN not in result.stdout + result.stderr


def tampered(record: dict, change: str) -> dict:
    record = json.loads(json.dumps(record))
    if change == "layer":
        record["rootfs_layers"][1] = "sha256:" + "0" * 64
    elif change == "layer order":
        record["rootfs_layers"].reverse()
    elif change == "architecture":
        record["architecture"] = "arm64" if record["architecture"] != "arm64" else "amd64"
    elif change == "label value":
        record["labels"]["org.example.hostile"] = HOSTILE.replace("end", "END")
    elif change == "label missing":
        record["labels"]["org.opencontainers.image.revision"] = "abc123"
    elif change == "not loaded":
        record["tag"] = f"{NODE_AGENT}:9.9.9-missing"
    return record


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("layer", "RootFS layers: expected"),
        ("layer order", "RootFS layers: expected"),
        ("architecture", "architecture: expected"),
        ("label value", "label org.example.hostile: expected"),
        ("label missing", "label org.opencontainers.image.revision: expected 'abc123', found ''"),
        ("not loaded", "there is no image modelforge-node-agent:9.9.9-missing on this node"),
    ],
)
def test_the_start_command_refuses_an_image_that_is_not_the_release(release, tmp_path, change, said):
    node = ReleaseNode(tmp_path, record_from_json(tampered(entry(release), change)))
    result = node.run(start_command(node.source))
    assert result.returncode == 1
    assert said in result.stderr
    assert node.calls() == []  # nothing started, and the token was never asked for
    assert "Paste the one-time" not in result.stderr and list(node.tmp.iterdir()) == []


def test_a_container_that_runs_another_image_is_stopped(release, tmp_path):
    node = ReleaseNode(tmp_path, record_from_json(entry(release)))
    result = node.run(start_command(node.source), FAKE_RUNNING_IMAGE="sha256:" + "e" * 64)
    assert result.returncode == 1
    assert "not the checked" in result.stderr
    assert node.calls()[-1]["argv"][-2:] == ["stop", "node-agent"]
    assert list(node.tmp.iterdir()) == []


def test_release_commands_pass_shellcheck_with_hostile_labels(release, tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    source = release_image(record_from_json(entry(release)))
    for snippet in (start_command(source), recreate_command(source)):
        checked = subprocess.run(["shellcheck", "-s", "bash", "-"], input=snippet, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout
    assert "--pull never" in recreate_command(source) and "-u MODELFORGE_NODE_AGENT_IMAGE" in recreate_command(source)


@settings(max_examples=60, deadline=None)
@example(HOSTILE)
@example("back\\slash $HOME \\x24 \\n")
@example("ends in a backslash $\\")
@example("plain-1.3.0")
@given(st.text(alphabet=st.characters(min_codepoint=32, blacklist_categories=("Cs", "Cc")), max_size=40))
def test_a_label_value_reaches_bash_exactly_as_written(value):
    from app.console.commands import _bash_literal

    printed = subprocess.run(["bash", "-c", f"printf '%s' {_bash_literal(value)}"], capture_output=True, timeout=10)
    assert printed.stdout.decode() == value
