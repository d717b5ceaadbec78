"""Release manifests and the wizard's release-image checks, against real podman images (D5, C4, W3).

A tiny image (`FROM scratch`, two layers, OCI labels, one label full of shell syntax) is built
with podman. `deploy/release_manifest.py` runs under the system Python (no Flask) to write its
manifest and SHA256SUMS; the wizard's start command is run in Bash with a stand-in `docker` whose
`image inspect` and `inspect` are a real CLI's, so every Go template in the command is evaluated by
a real engine: podman's own CLI, and the real Docker CLI talking to podman's Docker-compatible API
(Docker's template engine over Docker-shaped JSON; no Docker daemon can run here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.console.commands import (
    COMPOSE_FILE,
    WORKER_COMPOSE_FILE,
    WORKER_CPU,
    WORKER_GPU,
    AgentEnv,
    ImageSource,
    env_file,
    recreate_command,
    release_image,
    start_command,
    worker_start_command,
)
from app.release_manifest import (
    NODE_AGENT,
    RUNTIME_WORKER,
    RUNTIME_WORKER_CPU,
    differences,
    parse_pasted,
    pasted_workers,
    record_from_json,
    sums_text,
)
from tests.support import PROJECT_ROOT

VERSION = "9.9.9-test"
TAG = f"{NODE_AGENT}:{VERSION}"
OTHER = "modelforge-other-image:1"
DERIVED = f"{NODE_AGENT}:9.9.9-derived"
WORKER_TAG = f"{RUNTIME_WORKER}:{VERSION}"
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

# `image inspect` and `inspect` go to a real engine's CLI: podman's own, or the Docker CLI talking
# to podman's Docker-compatible API (so Docker's template engine reads Docker-shaped JSON). Compose
# is recorded; its `up` creates a real container from the image the environment names (or from
# FAKE_RUNNING_IMAGE), and `ps -q` names that container.
FAKE_DOCKER = """\
import json, os, subprocess, sys

engine = os.environ["FAKE_DOCKER_ENGINE"].split()
args = sys.argv[1:]
if args[:2] == ["image", "inspect"] or args[0] == "inspect":
    os.execvp(engine[0], [*engine, *args])
state = os.environ["FAKE_DOCKER_STATE"]
with open(os.path.join(state, "calls.jsonl"), "a", encoding="utf-8") as log:
    log.write(json.dumps({"argv": args, "image_env": os.environ.get("MODELFORGE_NODE_AGENT_IMAGE")}) + "\\n")
if args[0] == "compose" and "up" in args:
    variable = "MODELFORGE_RUNTIME_WORKER_IMAGE" if "runtime-worker" in args else "MODELFORGE_NODE_AGENT_IMAGE"
    image = os.environ.get("FAKE_RUNNING_IMAGE") or os.environ[variable]
    created = subprocess.run([*engine, "create", image, "/hello"], capture_output=True, text=True, check=True)
    with open(os.path.join(state, "container"), "w", encoding="utf-8") as container:
        container.write(created.stdout.strip())
elif args[0] == "compose" and "ps" in args:
    print(open(os.path.join(state, "container"), encoding="utf-8").read())
"""

ENGINES = ["podman", "docker"]


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
    # Docker (and podman's Docker API) finds a short name under docker.io/library, where
    # `docker image load` puts it; podman's own CLI finds it under localhost.
    podman("build", "-q", "-t", TAG, "-t", f"docker.io/library/{TAG}", str(context))
    (context / "third").write_text("another image\n")
    (context / "Containerfile").write_text(CONTAINERFILE + "COPY third /third\n")
    podman("build", "-q", "-t", OTHER, "-t", f"docker.io/library/{OTHER}", str(context))
    # W3: the runtime worker's image of the same release (one more layer of its own).
    (context / "worker").write_text("the runtime worker\n")
    (context / "Containerfile").write_text(CONTAINERFILE + "COPY worker /worker\n")
    podman("build", "-q", "-t", WORKER_TAG, "-t", f"docker.io/library/{WORKER_TAG}", str(context))
    # FROM the release, changing only what runs: no new layer, every label inherited.
    derived = f'FROM localhost/{TAG}\nENTRYPOINT ["/evil"]\nUSER 0\nENV LD_PRELOAD=/x.so\n'
    (context / "Containerfile").write_text(derived)
    podman("build", "-q", "-t", DERIVED, "-t", f"docker.io/library/{DERIVED}", str(context))
    (context / "Containerfile").write_text(CONTAINERFILE)
    out = tmp_path_factory.mktemp("release")
    built = subprocess.run(
        [SYSTEM_PYTHON, "deploy/release_manifest.py", "--engine", "podman", "build", "--version", VERSION,
         "--out", str(out), TAG, WORKER_TAG],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    yield out
    ours = [TAG, OTHER, DERIVED, WORKER_TAG]
    for image in ours:  # only the containers the stand-in created from these images
        created = podman("ps", "-a", "-q", "--filter", f"ancestor={image}", check=False).stdout.split()
        if created:
            podman("rm", "-f", *created, check=False)
    podman("rmi", "-f", *ours, *(f"docker.io/library/{image}" for image in ours), check=False)


@pytest.fixture(scope="module")
def docker_api(tmp_path_factory):
    """podman's Docker-compatible API on a private socket, for the real Docker CLI to talk to."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no Docker CLI here")
    socket = tmp_path_factory.mktemp("docker-api") / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    environment = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}
    deadline = time.monotonic() + 30
    while subprocess.run([docker, "version"], env=environment, capture_output=True).returncode != 0:
        assert time.monotonic() < deadline and service.poll() is None, "podman's Docker API did not come up"
        time.sleep(0.2)
    yield docker, environment["DOCKER_HOST"]
    service.terminate()
    service.wait(timeout=10)


@pytest.fixture(params=ENGINES)
def engine(request, release) -> dict[str, str]:
    """What the stand-in's `docker image inspect` really runs: podman's CLI, or Docker's."""
    if request.param == "podman":
        return {"FAKE_DOCKER_ENGINE": "podman"}
    docker, host = request.getfixturevalue("docker_api")
    for tag in (TAG, OTHER, DERIVED, WORKER_TAG):  # a test that loads the bundle again may have dropped this name
        podman("tag", tag, f"docker.io/library/{tag}", check=False)
    return {"FAKE_DOCKER_ENGINE": docker, "DOCKER_HOST": host}


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
    # Saved under docker.io/library/, which Docker loads as the plain tag the start command looks for
    # (podman would otherwise record localhost/…, a name Docker keeps as it is).
    archive = subprocess.run(["tar", "-xOf", str(release / manifest["bundle"]), "manifest.json"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(archive.stdout)[0]["RepoTags"] == [f"docker.io/library/{TAG}"]


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
    "config": {
        "entrypoint": ["/usr/bin/python3", "-m", "modelforge_node_agent"],
        "cmd": [],
        "env": ["PATH=/usr/bin"],
        "volumes": [],
        "exposed_ports": [],
        "user": "65532",
        "working_dir": "/",
    },
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
        (json.dumps({**GOOD, "labels": {"a": "\ud800"}}), "printable"),  # a lone surrogate
        (json.dumps({**GOOD, "labels": {"a": "line\u2028separator"}}), "printable"),
        (json.dumps({**GOOD, "labels": {"a": ""}}), "1 to 1024 printable characters"),
        (json.dumps({key: value for key, value in GOOD.items() if key != "config"}), '"config" must be an object'),
        (json.dumps({**GOOD, "config": {**GOOD["config"], "env": "PATH=/x"}}), '"config.env" must be a list'),
        (json.dumps({**GOOD, "config": {**GOOD["config"], "user": None}}), '"config.user" must be printable'),
        (json.dumps({**GOOD, "config": {**GOOD["config"], "cmd": ["a\nb"]}}), '"config.cmd" must be printable'),
        ('{"a":' * 3000 + "1" + "}" * 3000, "nested too deeply"),
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

    def __init__(self, root: Path, record, engine: dict[str, str]) -> None:
        self.engine = engine
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
            **self.engine,
            **extra,
        }
        return subprocess.run(["bash", "-c", snippet], input=TOKEN + "\n", capture_output=True, text=True,
                              cwd=self.deploy, env=env, timeout=60)  # fmt: skip

    def calls(self) -> list[dict]:
        log = self.state / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_start_command_starts_the_checked_release_image(release, engine, tmp_path):
    node = ReleaseNode(tmp_path, record_from_json(entry(release)), engine)
    result = node.run(start_command(node.source))
    assert result.returncode == 0, result.stderr
    up, ps, start = node.calls()
    assert up["argv"][-6:] == ["up", "--no-start", "--no-build", "--pull", "never", "node-agent"]
    assert up["image_env"] == TAG  # set explicitly, whatever the shell had exported
    assert ps["argv"][-4:] == ["ps", "-a", "-q", "node-agent"]
    assert start["argv"][-2:] == ["start", "node-agent"]  # only after the created container was checked
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
    elif change == "derived image":  # the node's tag names an image built FROM the release
        record["tag"] = DERIVED
    elif change == "env":
        record["config"]["env"].append("EXTRA=1")
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
        ("derived image", "config entrypoint: expected"),
        ("derived image", "config user: expected"),
        ("derived image", "LD_PRELOAD"),
        ("env", "config env: expected"),
    ],
)
def test_the_start_command_refuses_an_image_that_is_not_the_release(release, engine, tmp_path, change, said):
    node = ReleaseNode(tmp_path, record_from_json(tampered(entry(release), change)), engine)
    result = node.run(start_command(node.source))
    assert result.returncode == 1
    assert said in result.stderr
    assert node.calls() == []  # nothing started, and the token was never asked for
    assert "Paste the one-time" not in result.stderr and list(node.tmp.iterdir()) == []


def test_a_container_created_from_another_image_is_removed_unstarted(release, engine, tmp_path):
    node = ReleaseNode(tmp_path, record_from_json(entry(release)), engine)
    result = node.run(start_command(node.source), FAKE_RUNNING_IMAGE=OTHER)
    assert result.returncode == 1
    assert "not the checked" in result.stderr and "removed before it started" in result.stderr
    assert [call["argv"][-3:] for call in node.calls()][1:] == [["-a", "-q", "node-agent"], ["-f", "-s", "node-agent"]]
    assert not any("start" in call["argv"] for call in node.calls())
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


def test_the_two_engines_really_are_two_clis(release, engine, tmp_path):
    """Docker's CLI writes image IDs with their `sha256:` prefix, podman's without: both run here."""
    node = ReleaseNode(tmp_path, record_from_json(entry(release)), engine)
    shown = node.run(f"docker image inspect --format '{{{{.Id}}}}' {TAG}").stdout.strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}" if "DOCKER_HOST" in engine else r"[0-9a-f]{64}", shown), shown


def test_the_manifest_tool_verifies_through_the_docker_cli(release, docker_api):
    """`verify` reads `docker image inspect` JSON as Docker writes it, not only podman's."""
    docker, host = docker_api
    podman("tag", TAG, f"docker.io/library/{TAG}", check=False)
    checked = subprocess.run(
        [SYSTEM_PYTHON, str(PROJECT_ROOT / "deploy/release_manifest.py"), "--engine", docker, "verify",
         "--manifest", str(release / "manifest.json")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "DOCKER_HOST": host},
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert "matches" in checked.stdout


def test_values_that_look_like_template_markers_are_written_as_they_are():
    record = record_from_json({**GOOD, "tag": f"{NODE_AGENT}:1__BUNDLE__", "labels": {"a": "x__COMPOSE__y"}})
    snippet = start_command(release_image(record))
    assert "x__COMPOSE__y" in snippet and f"image={NODE_AGENT}:1__BUNDLE__" in snippet
    assert "modelforge-1__BUNDLE__-images.tar" in snippet


# --------------------------------------------------------------------------- the runtime worker (W3)


def test_the_manifest_records_the_worker_image_and_verifies_it_by_name(release):
    manifest = json.loads((release / "manifest.json").read_text())
    assert set(manifest["images"]) == {NODE_AGENT, RUNTIME_WORKER}
    checked = subprocess.run(
        [SYSTEM_PYTHON, str(PROJECT_ROOT / "deploy/release_manifest.py"), "--engine", "podman", "verify",
         "--manifest", str(release / "manifest.json"), RUNTIME_WORKER],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert f"{RUNTIME_WORKER} matches" in checked.stdout


def test_worker_entries_come_only_from_a_whole_pasted_manifest():
    worker = {**GOOD, "tag": f"{RUNTIME_WORKER_CPU}:1.3.0-rc.1"}
    whole = json.dumps({"images": {NODE_AGENT: GOOD, RUNTIME_WORKER_CPU: worker}})
    (record,) = pasted_workers(whole)
    assert record.tag == worker["tag"]
    assert pasted_workers(json.dumps(GOOD)) == () and pasted_workers("{") == ()
    # The same rules as the agent's entry: a wrong worker entry is refused, not ignored.
    for bad, said in [({**worker, "tag": f"{RUNTIME_WORKER_CPU}:latest"}, "release version"),
                      ({**worker, "tag": f"{NODE_AGENT}:1.3.0-rc.1"}, "must name the modelforge-runtime-worker-cpu"),
                      ({**worker, "rootfs_layers": []}, "rootfs_layers")]:  # fmt: skip
        with pytest.raises(ValueError, match=said):
            pasted_workers(json.dumps({"images": {NODE_AGENT: GOOD, RUNTIME_WORKER_CPU: bad}}))
    # Kept with the enrolment, so the progress page gives the same command later.
    source = release_image(parse_pasted(whole), (record,))
    assert ImageSource.from_json(json.loads(json.dumps(source.to_json()))) == source
    assert source.worker_image(WORKER_CPU) == worker["tag"] and source.worker_image(WORKER_GPU) is None
    with pytest.raises(ValueError, match="not a runtime worker image of release 1.3.0-rc.1"):
        release_image(
            parse_pasted(whole), (record_from_json({**worker, "tag": f"{RUNTIME_WORKER_CPU}:2"}, RUNTIME_WORKER_CPU),)
        )


class WorkerNode(ReleaseNode):
    """ReleaseNode with the worker overlay beside the node-agent file."""

    def __init__(self, root: Path, source: ImageSource, engine: dict[str, str]) -> None:
        super().__init__(root, source.release, engine)
        self.source = source
        shutil.copyfile(PROJECT_ROOT / "deploy" / WORKER_COMPOSE_FILE, self.deploy / WORKER_COMPOSE_FILE)


def test_the_worker_start_command_starts_the_checked_worker_image(release, engine, tmp_path):
    manifest = (release / "manifest.json").read_text()
    source = release_image(parse_pasted(manifest), pasted_workers(manifest))
    node = WorkerNode(tmp_path, source, engine)
    result = node.run(worker_start_command(source, WORKER_GPU))
    assert result.returncode == 0, result.stderr
    up, ps, start, status = node.calls()
    assert up["argv"][-7:] == ["up", "--no-start", "--no-build", "--pull", "never", "node-agent", "runtime-worker"]
    assert ps["argv"][-4:] == ["ps", "-a", "-q", "runtime-worker"]
    assert start["argv"][-3:] == ["start", "node-agent", "runtime-worker"]
    assert status["argv"][-2:] == ["ps", "runtime-worker"]
    assert "Paste" not in result.stderr  # no secret is asked for


def test_the_worker_start_command_refuses_a_worker_image_that_is_not_the_release(release, engine, tmp_path):
    manifest = (release / "manifest.json").read_text()
    (worker,) = pasted_workers(manifest)
    changed = record_from_json(tampered(worker.to_json(), "layer"), RUNTIME_WORKER)
    source = release_image(parse_pasted(manifest), (changed,))
    node = WorkerNode(tmp_path, source, engine)
    result = node.run(worker_start_command(source, WORKER_GPU))
    assert result.returncode == 1 and "RootFS layers: expected" in result.stderr
    assert node.calls() == []

    honest = release_image(parse_pasted(manifest), (worker,))
    swapped = node.run(worker_start_command(honest, WORKER_GPU), FAKE_RUNNING_IMAGE=OTHER)
    assert swapped.returncode == 1 and "removed before it started" in swapped.stderr
    assert not any("start" in call["argv"] for call in node.calls())
