"""Release manifests: what a release's images are, so a node can check the one it loaded (D5, C4).

A release ships its images (the node agent, the runtime worker's GPU and CPU images, the control
plane) as one `docker image save` bundle, a `manifest.json` and a `SHA256SUMS` over both. For each
image the manifest records what survives `docker image load` unchanged: the tag, the architecture
and OS, the RootFS layer digests, what the image runs (entrypoint, cmd, env, user, working
directory, volumes, exposed ports) and the OCI labels. The build host's image ID is recorded for
reference only; Docker may rewrite it on load, so nothing compares it. The console's enrol wizard
reads the `images.modelforge-node-agent` entry pasted by the admin and turns it into checks in the
start command (app/console/commands.py); pasted as a whole manifest, its runtime worker entries are
checked the same way by the worker's start command.

    python deploy/release_manifest.py build --version 1.3.0-rc.1 --out dist \\
        modelforge-node-agent:1.3.0-rc.1 modelforge-runtime-worker:1.3.0-rc.1 \\
        modelforge-runtime-worker-cpu:1.3.0-rc.1 modelforge-control-plane:1.3.0-rc.1
    python deploy/release_manifest.py verify --manifest dist/manifest.json modelforge-node-agent
    python deploy/release_manifest.py verify --manifest dist/manifest.json modelforge-runtime-worker

Standard library only, no Flask: it runs on a release host and on a node alike. Its one import from
the app, `app.rules`, is standard library too; deploy/app_modules.py imports both without the
package's Flask factory, under the same names as here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from app import rules

SCHEMA = "modelforge-release-manifest/1"
NODE_AGENT = "modelforge-node-agent"
# W1-W3: the runtime worker's two images, built from deploy/Dockerfile.runtime-worker{,-cpu}.
RUNTIME_WORKER = "modelforge-runtime-worker"
RUNTIME_WORKER_CPU = "modelforge-runtime-worker-cpu"
RUNTIME_WORKERS = (RUNTIME_WORKER, RUNTIME_WORKER_CPU)
MANIFEST_NAME = "manifest.json"
SUMS_NAME = "SHA256SUMS"
MAX_PASTE_BYTES = 64 * 1024

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_VERSION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_ARCHITECTURE = re.compile(r"[a-z0-9_]{1,32}")
# A label key as Docker and the OCI annotation rules write them; it goes inside a Go template string
# in the start command, so nothing that could end that string (quotes, backslashes) is allowed.
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
MAX_LABEL_VALUE = 1024
MAX_LAYERS = 256
MAX_CONFIG_ITEMS = 256
# What the image runs, and as whom: a `FROM <release>` image can change any of these without adding
# a layer or losing a label, so the manifest records them and the node compares them (D5).
CONFIG_LISTS = ("entrypoint", "cmd", "env", "volumes", "exposed_ports")
CONFIG_STRINGS = ("user", "working_dir")


@dataclass(frozen=True)
class ImageRecord:
    """One image of a release, as `docker image load` leaves it on a node (D5)."""

    tag: str  # exact, e.g. "modelforge-node-agent:1.3.0-rc.1"
    architecture: str
    os: str
    rootfs_layers: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]  # sorted (key, value) pairs
    config: tuple[tuple[str, object], ...] = ()  # CONFIG_LISTS as tuples, CONFIG_STRINGS as str
    image_id: str | None = None  # the build host's; informational only

    def setting(self, name: str):
        return dict(self.config)[name]

    @property
    def name(self) -> str:
        return self.tag.rsplit(":", 1)[0]

    @property
    def version(self) -> str:
        return self.tag.rsplit(":", 1)[1]

    def to_json(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "tag": self.tag,
            "architecture": self.architecture,
            "os": self.os,
            "rootfs_layers": list(self.rootfs_layers),
            "labels": dict(self.labels),
            "config": {name: list(value) if isinstance(value, tuple) else value for name, value in self.config},
        }
        if self.image_id:
            entry["image_id"] = self.image_id
        return entry


def _config(entry: dict) -> tuple[tuple[str, object], ...]:
    config = entry.get("config")
    if not isinstance(config, dict):
        raise ValueError('"config" must be an object with the image\'s entrypoint, cmd, env, user, working_dir,'
                         " volumes and exposed_ports (deploy/release_manifest.py writes it)")  # fmt: skip
    checked: dict[str, object] = {}
    for name in CONFIG_LISTS:
        value = config.get(name)
        if not isinstance(value, list) or len(value) > MAX_CONFIG_ITEMS:
            raise ValueError(f'"config.{name}" must be a list (empty when the image sets none)')
        if not all(isinstance(item, str) and len(item) <= 4096 and rules.is_text(item) for item in value):
            raise ValueError(f'every entry of "config.{name}" must be printable text')
        checked[name] = tuple(sorted(value) if name in ("volumes", "exposed_ports") else value)
    for name in CONFIG_STRINGS:
        value = config.get(name)
        if not isinstance(value, str) or len(value) > 4096 or not rules.is_text(value):
            raise ValueError(f'"config.{name}" must be printable text (empty when the image sets none)')
        checked[name] = value
    return tuple(checked.items())


def record_from_json(entry: object, name: str = NODE_AGENT) -> ImageRecord:
    """A manifest's `images.<name>` entry → ImageRecord; ValueError says what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError(f"images.{name} must be a JSON object")
    tag = entry.get("tag")
    if not isinstance(tag, str) or ":" not in tag:
        raise ValueError(f'"tag" must be a string like "{name}:1.3.0"')
    image_name, version = tag.rsplit(":", 1)
    if image_name != name:
        raise ValueError(f'"tag" must name the {name} image, not {image_name!r}')
    if not _VERSION.fullmatch(version) or version in ("latest", "local"):
        raise ValueError(f'"tag" must carry a release version, not {version!r}')
    architecture, system = entry.get("architecture"), entry.get("os", "linux")
    if not isinstance(architecture, str) or not _ARCHITECTURE.fullmatch(architecture):
        raise ValueError('"architecture" must be a Docker architecture name such as "amd64"')
    if not isinstance(system, str) or not _ARCHITECTURE.fullmatch(system):
        raise ValueError('"os" must be an operating system name such as "linux"')
    layers = entry.get("rootfs_layers")
    if not isinstance(layers, list) or not layers or len(layers) > MAX_LAYERS:
        raise ValueError(f'"rootfs_layers" must be a list of 1 to {MAX_LAYERS} layer digests')
    for layer in layers:
        if not isinstance(layer, str) or not _DIGEST.fullmatch(layer):
            raise ValueError('every entry of "rootfs_layers" must be a digest like "sha256:<64 hex digits>"')
    labels = entry.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise ValueError('"labels" must be an object holding the image\'s OCI labels')
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"label name {key[:80]!r} is not a plain label name")
        if not isinstance(value, str) or not 0 < len(value) <= MAX_LABEL_VALUE or not rules.is_text(value):
            # Never empty: a node's Go template prints "" for a missing label too.
            raise ValueError(f"label {key!r} must be 1 to {MAX_LABEL_VALUE} printable characters")
    image_id = entry.get("image_id")
    if image_id is not None and (not isinstance(image_id, str) or not _DIGEST.fullmatch(image_id)):
        raise ValueError('"image_id", when present, must be a digest like "sha256:<64 hex digits>"')
    return ImageRecord(
        tag=tag,
        architecture=architecture,
        os=system,
        rootfs_layers=tuple(layers),
        labels=tuple(sorted(labels.items())),
        config=_config(entry),
        image_id=image_id,
    )


def parse_pasted(text: str, name: str = NODE_AGENT) -> ImageRecord:
    """What an admin pasted: the `images.<name>` entry, or the whole manifest (C4, D5)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PASTE_BYTES:
        raise ValueError(f"that is more than {MAX_PASTE_BYTES // 1024} KiB; paste only images.{name}")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to be a manifest") from None
    if isinstance(document, dict) and "images" in document:
        images = document["images"]
        if not isinstance(images, dict) or name not in images:
            raise ValueError(f"the manifest has no images.{name}")
        document = images[name]
    return record_from_json(document, name)


def pasted_workers(text: str) -> tuple[ImageRecord, ...]:
    """The runtime worker entries of a pasted whole manifest, each checked as the agent's (W3, D5).

    A pasted single entry has none. ValueError names a worker entry that is present but wrong.
    """
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return ()  # parse_pasted, which reads the same text first, says what is wrong with it
    images = document.get("images") if isinstance(document, dict) else None
    if not isinstance(images, dict):
        return ()
    return tuple(record_from_json(images[name], name) for name in RUNTIME_WORKERS if name in images)


def record_from_inspect(inspected: dict, tag: str) -> ImageRecord:
    """An ImageRecord from `docker image inspect` (or podman's) output for `tag`."""
    config = inspected.get("Config") or {}
    entry = {
        "tag": tag,
        "architecture": inspected.get("Architecture"),
        "os": inspected.get("Os", "linux"),
        "rootfs_layers": (inspected.get("RootFS") or {}).get("Layers"),
        # An empty label cannot be told from a missing one on the node, so it is not recorded.
        "labels": {key: value for key, value in (config.get("Labels") or {}).items() if value},
        "config": {
            "entrypoint": config.get("Entrypoint") or [],
            "cmd": config.get("Cmd") or [],
            "env": config.get("Env") or [],
            "volumes": sorted(config.get("Volumes") or {}),
            "exposed_ports": sorted(config.get("ExposedPorts") or {}),
            "user": config.get("User") or "",
            "working_dir": config.get("WorkingDir") or "",
        },
        "image_id": _image_id(inspected.get("Id", "")),
    }
    return record_from_json(entry, tag.rsplit(":", 1)[0])


def _image_id(value: str) -> str | None:
    value = value if value.startswith("sha256:") else f"sha256:{value}"
    return value if _DIGEST.fullmatch(value) else None


def differences(expected: ImageRecord, actual: ImageRecord) -> list[str]:
    """What differs between a manifest entry and a loaded image; the image ID is not compared."""
    problems = []
    for what in ("tag", "architecture", "os", "rootfs_layers"):
        if getattr(expected, what) != getattr(actual, what):
            problems.append(f"{what}: expected {getattr(expected, what)!r}, found {getattr(actual, what)!r}")
    for name, value in expected.config:
        if actual.setting(name) != value:
            problems.append(f"config.{name}: expected {value!r}, found {actual.setting(name)!r}")
    found = dict(actual.labels)
    for key, value in expected.labels:
        if found.get(key) != value:
            problems.append(f"label {key}: expected {value!r}, found {found.get(key)!r}")
    return problems


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sums_text(paths: list[Path]) -> str:
    """`sha256sum` format, so `sha256sum -c SHA256SUMS` checks the release on any Linux host."""
    return "".join(f"{sha256_file(path)}  {path.name}\n" for path in paths)


def _inspect(engine: str, tag: str) -> dict:
    result = subprocess.run([engine, "image", "inspect", tag], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ValueError(f"{engine} image inspect {tag} failed: {result.stderr.strip()}")
    (inspected,) = json.loads(result.stdout)
    return inspected


def build(engine: str, version: str, out: Path, tags: list[str]) -> Path:
    """Save the images into one bundle, write manifest.json and SHA256SUMS; returns the manifest."""
    records = [record_from_inspect(_inspect(engine, tag), tag) for tag in tags]
    for record in records:
        if record.version != version:
            raise ValueError(f"{record.tag} is not tagged {version}")
    out.mkdir(parents=True, exist_ok=True)
    bundle = out / f"modelforge-{version}-images.tar"
    names, several = list(tags), []
    if Path(engine).name == "podman":
        # podman would record a short name as localhost/<name>, which Docker then loads under that
        # name; saved as docker.io/library/<name>, Docker loads it as plain <name>:<version>.
        names = [tag if "/" in tag else f"docker.io/library/{tag}" for tag in tags]
        for tag, name in zip(tags, names, strict=True):
            subprocess.run([engine, "tag", tag, name], check=True, capture_output=True)
        # podman writes several images into one docker-archive only when asked; docker always does.
        several = ["--multi-image-archive"] if len(tags) > 1 else []
    subprocess.run([engine, "image", "save", *several, "-o", str(bundle), *names], check=True, capture_output=True)
    manifest = out / MANIFEST_NAME
    document = {
        "schema": SCHEMA,
        "version": version,
        "bundle": bundle.name,
        "images": {record.name: record.to_json() for record in records},
    }
    manifest.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / SUMS_NAME).write_text(sums_text([bundle, manifest]), encoding="utf-8")
    return manifest


def verify(engine: str, manifest: Path, name: str) -> list[str]:
    """Compare the image loaded here with images.<name> of the manifest; [] when it matches."""
    expected = parse_pasted(manifest.read_text(encoding="utf-8"), name)
    return differences(expected, record_from_inspect(_inspect(engine, expected.tag), expected.tag))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release_manifest.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="docker", help="docker (default) or podman")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="save the images and write manifest.json and SHA256SUMS")
    make.add_argument("--version", required=True)
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("tags", nargs="+", help="local images, each tagged <name>:<version>")
    check = commands.add_parser("verify", help="check a loaded image against the manifest")
    check.add_argument("--manifest", type=Path, required=True)
    check.add_argument("name", nargs="?", default=NODE_AGENT)
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "build":
            print(build(arguments.engine, arguments.version, arguments.out, arguments.tags))
            return EXIT_OK
        problems = verify(arguments.engine, arguments.manifest, arguments.name)
    except (ValueError, OSError, subprocess.CalledProcessError) as error:
        print(f"release_manifest: {error}", file=sys.stderr)
        return EXIT_USAGE
    for problem in problems:
        print(f"release_manifest: {problem}", file=sys.stderr)
    if not problems:
        print(f"release_manifest: {arguments.name} matches {arguments.manifest}")
    return EXIT_MISMATCH if problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
