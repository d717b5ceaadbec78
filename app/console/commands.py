"""The text the enrol wizard and the node page hand to the admin: a `.env` and Bash snippets (C4, I5, P2).

Pure functions: no Flask, no database. Nothing here ever sees a token or a credential; the
snippets read them on the node from a hidden prompt, so no secret is ever part of this text (P2).
The Bash itself is in snippets/*.sh beside this module; the functions here fill those templates.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from urllib.parse import urlsplit

from app import rules
from app.release_manifest import (
    NODE_AGENT,
    RUNTIME_WORKER,
    RUNTIME_WORKER_CPU,
    RUNTIME_WORKERS,
    ImageRecord,
    record_from_json,
)

COMPOSE_FILE = "docker-compose.node-agent.yml"
ACCELERATOR_MODES = ("nvidia", "cpu", "auto")
LOCAL_IMAGE = f"{NODE_AGENT}:local"
# W3: the runtime worker's overlays, added to COMPOSE_FILE with -f; the CPU one after the GPU one.
WORKER_COMPOSE_FILE = "docker-compose.runtime-worker.yml"
WORKER_CPU_COMPOSE_FILE = "docker-compose.runtime-worker.cpu.yml"


@dataclass(frozen=True)
class WorkerImage:
    """One of the runtime worker's two images: its release name, Compose files and image variable."""

    name: str
    which: str  # as the start command's comment says it
    compose_files: tuple[str, ...]
    variable: str
    heading: str  # the wizard's

    @property
    def local_image(self) -> str:
        return f"{self.name}:local"


WORKER_GPU = WorkerImage(
    RUNTIME_WORKER,
    "GPU image",
    (COMPOSE_FILE, WORKER_COMPOSE_FILE),
    "MODELFORGE_RUNTIME_WORKER_IMAGE",
    "On a node with an NVIDIA GPU",
)
WORKER_CPU = WorkerImage(
    RUNTIME_WORKER_CPU,
    "CPU image, no NVIDIA GPU",
    (COMPOSE_FILE, WORKER_COMPOSE_FILE, WORKER_CPU_COMPOSE_FILE),
    "MODELFORGE_RUNTIME_WORKER_CPU_IMAGE",
    "On a node without one (the CPU image; the agent needs MODELFORGE_AGENT_ACCELERATOR_MODE=cpu)",
)
WORKER_IMAGES = (WORKER_GPU, WORKER_CPU)


# registry[:port]/path/name@sha256:<digest>, lower case as the distribution spec writes names.
@dataclass(frozen=True)
class ImageSource:
    """Where the node's agent image comes from, and what the start command checks about it (C4, D5).

    release: the release bundle loaded with `docker image load`, checked against the manifest's
        images.modelforge-node-agent entry (tag, architecture, OS, RootFS layers, config, labels)
        before the token is read; the container must be created from exactly that image before it
        starts. Never pulled or built.
    digest: a registry image pinned by @sha256 digest; pulled if missing, never built.
    local: built from this checkout's Dockerfile (development).

    workers: for a release, the runtime worker entries of the pasted manifest (W3), which the
        worker's start command checks the same way; none when only the agent's entry was pasted.
    """

    kind: str
    reference: str
    release: ImageRecord | None = None
    workers: tuple[ImageRecord, ...] = ()

    def worker(self, image: WorkerImage) -> ImageRecord | None:
        """The release entry of that worker image, when the admin pasted one."""
        return next((record for record in self.workers if record.name == image.name), None)

    def worker_image(self, image: WorkerImage) -> str | None:
        """What .env names for that worker image, or None when only the admin can say (W3, D5)."""
        if self.kind == "local":
            return image.local_image
        record = self.worker(image)
        return record.tag if record is not None else None

    def to_json(self) -> dict[str, object]:
        """What the enrolment keeps, so later steps give the same commands."""
        stored: dict[str, object] = {"kind": self.kind, "reference": self.reference}
        if self.release is not None:
            stored["release"] = self.release.to_json()
        if self.workers:
            stored["workers"] = [record.to_json() for record in self.workers]
        return stored

    @classmethod
    def from_json(cls, stored: dict | None) -> ImageSource:
        if not stored:
            return LOCAL_BUILD
        if stored.get("kind") == "release":
            workers = tuple(_stored_worker(entry) for entry in stored.get("workers") or ())
            return release_image(record_from_json(stored["release"]), workers)
        if stored.get("kind") == "digest":
            return pinned_image(stored["reference"])
        return LOCAL_BUILD


LOCAL_BUILD = ImageSource("local", LOCAL_IMAGE)


def _stored_worker(entry: dict) -> ImageRecord:
    name = str(entry.get("tag", "")).rsplit(":", 1)[0]
    if name not in RUNTIME_WORKERS:
        raise ValueError(f"a stored worker entry names {name!r}, not one of {', '.join(RUNTIME_WORKERS)}")
    return record_from_json(entry, name)


def release_image(record: ImageRecord, workers: tuple[ImageRecord, ...] = ()) -> ImageSource:
    """A release bundle: the agent's manifest entry, and the worker entries pasted with it (W3)."""
    for worker in workers:
        if worker.name not in RUNTIME_WORKERS or worker.version != record.version:
            raise ValueError(f"{worker.tag} is not a runtime worker image of release {record.version}")
    return ImageSource("release", record.tag, record, tuple(workers))


def pinned_image(reference: str) -> ImageSource:
    """A registry image pinned by digest; ValueError when `reference` is not one."""
    if problem := rules.image_reference_problem(reference, digest_required=True):
        raise ValueError(problem)
    return ImageSource("digest", reference)


# Written without quotes: every .env reader takes these characters literally (no `$`, space, `#`,
# quote or backslash), so URLs, image references and plain paths stay readable.
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./:@%+,=~-]*")


@dataclass(frozen=True)
class AgentEnv:
    """The non-secret settings of one node agent, as the wizard fills them in (C4, D2)."""

    control_plane_url: str  # the console's own API origin (E3), e.g. "https://mf.lan:8000"
    display_name: str
    accelerator_mode: str = "nvidia"  # nvidia|cpu|auto (N1)
    image: str = LOCAL_IMAGE
    # W3: the runtime worker's two images; None leaves the line commented out for the admin to fill.
    worker_image: str | None = WORKER_GPU.local_image
    worker_cpu_image: str | None = WORKER_CPU.local_image
    state_volume: str = "/mnt/user/appdata/modelforge-node-agent/state"
    hf_cache_volume: str = "/mnt/user/appdata/modelforge-node-agent/hf-cache"
    artifact_volume: str = "/mnt/user/appdata/modelforge-node-agent/artifacts"
    quarantine_volume: str = "/mnt/user/appdata/modelforge-node-agent/quarantine"


def env_value_error(value: str) -> str | None:
    """Why `value` cannot be written to the .env so that every reader gets it back exactly, or None."""
    # The file must mean the same to Docker Compose v2 (compose-go's dotenv parser, the reader that
    # matters, D2) and to python-dotenv (podman-compose, our tests). Where no quoting makes the two
    # agree, or Compose cannot represent the value at all, the value is refused rather than altered;
    # forms call this before minting so the wizard never fails after a token exists (P5).
    if any(char in value for char in "\n\r\0"):
        return "must be a single line (no newline, carriage return or NUL character)"
    if value.endswith("\\"):
        # Compose reads a backslash right before the closing quote as an escaped quote.
        return "must not end with a backslash"
    if "${" in value:
        # python-dotenv expands ${...} even inside single quotes; Compose does not.
        return "must not contain '${'"
    if "$" in value and ("'" in value or "\\" in value):
        # Such a value needs double quotes, where Compose reads `$$` as `$` and python-dotenv does not.
        return "must not contain '$' together with a quote (') or a backslash"
    return None


def _dotenv_value(name: str, value: str) -> str:
    """`value` quoted for a Compose .env line; ValueError when it cannot be written exactly."""
    problem = env_value_error(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    if _PLAIN_VALUE.fullmatch(value):
        return value
    if "'" not in value and "\\" not in value:
        # Single quotes are literal in Compose and python-dotenv alike: spaces, `#`, `"` and `$`
        # need no escaping, and no quote or backslash inside can end the value early.
        return f"'{value}'"
    # An apostrophe ("Bob's GPU box") or a backslash: double quotes, where both readers undo
    # exactly `\\` and `\"`. env_value_error keeps `$` and a trailing backslash out of this branch.
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _check(env: AgentEnv) -> None:
    """Refuse settings that cannot be right, before an admin copies them to a node (N1, D2, E3)."""
    url = urlsplit(env.control_plane_url)
    if url.scheme not in ("https", "http") or not url.netloc:
        raise ValueError(f"control_plane_url must be an http(s) origin, not {env.control_plane_url!r}")
    if env.accelerator_mode not in ACCELERATOR_MODES:
        raise ValueError(f"accelerator_mode must be one of {', '.join(ACCELERATOR_MODES)}")
    if problem := rules.image_reference_problem(env.image):
        raise ValueError(f"image must name a release tag or an @sha256 digest, never latest: {problem}")
    for name, image in (("worker_image", env.worker_image), ("worker_cpu_image", env.worker_cpu_image)):
        if image is not None and (problem := rules.image_reference_problem(image)):
            raise ValueError(f"{name} must name a release tag or an @sha256 digest, never latest: {problem}")


def env_file(env: AgentEnv) -> str:
    """The non-secret `deploy/.env` for a node agent: no token, credential or Hub token, ever (P2)."""
    _check(env)

    def line(name: str, value: str) -> str:
        return f"{name}={_dotenv_value(name, value)}"

    def optional_line(name: str, value: str | None) -> str:
        return f"#{name}=" if value is None else line(name, value)

    lines = [
        "# ModelForge node agent settings from the console's enrol wizard (C4). Save as deploy/.env",
        "# next to docker-compose.node-agent.yml. Nothing secret belongs here (P2): the start command",
        "# reads the one-time enrolment token from a hidden prompt, and the Hugging Face token comes",
        "# from your shell's environment.",
        "",
        "# The control plane's API origin, as recorded with the enrolment (E3).",
        line("MODELFORGE_AGENT_CONTROL_PLANE_URL", env.control_plane_url),
        "# The name the console shows for this node.",
        line("MODELFORGE_AGENT_DISPLAY_NAME", env.display_name),
        "# The node's real host name: inside the container the agent only sees the container's own.",
        "# Left commented out, the start command fills it in from `uname -n` on the node.",
        "#MODELFORGE_AGENT_HOSTNAME=",
        "# nvidia: refuse to start without NVML and a readable GPU (exit 3); cpu; or auto.",
        line("MODELFORGE_AGENT_ACCELERATOR_MODE", env.accelerator_mode),
        "# Keep true; for a private CA use docker-compose.node-agent.private-ca.yml instead.",
        line("MODELFORGE_AGENT_TLS_VERIFY", "true"),
        "# The agent image: a release tag or an @sha256 digest, never latest.",
        line("MODELFORGE_NODE_AGENT_IMAGE", env.image),
        "# Four dedicated absolute host directories, owned by 65532:65532 (the agent's user).",
        "# The state directory holds the node identity and credential: keep it durable.",
        line("MODELFORGE_AGENT_STATE_VOLUME", env.state_volume),
        line("MODELFORGE_AGENT_HF_CACHE_VOLUME", env.hf_cache_volume),
        line("MODELFORGE_AGENT_ARTIFACT_VOLUME", env.artifact_volume),
        line("MODELFORGE_AGENT_QUARANTINE_VOLUME", env.quarantine_volume),
        "# The runtime worker (docker-compose.runtime-worker.yml; the .cpu.yml overlay uses the CPU",
        "# image): release tags or @sha256 digests, never latest. A line left commented out is",
        "# yours to fill in before you start the worker.",
        optional_line(WORKER_GPU.variable, env.worker_image),
        optional_line(WORKER_CPU.variable, env.worker_cpu_image),
    ]
    return "\n".join(lines) + "\n"


# The Bash lives in snippets/*.sh beside this module, each a file shellcheck reads. A template's
# header, everything up to its first empty line, says why its Bash reads as it does and is left
# out of the snippet. @@NAME@@ marks what is filled in: nothing in Bash or in the Go templates
# handed to `--format` ({{...}}) is written that way.
_MARKER = re.compile(r"^@@(?P<lines>[A-Z_]+)@@\n|@@(?P<word>[A-Z_]+)@@", re.MULTILINE)


@cache
def _template(name: str) -> str:
    """The text of snippets/`name` below its header."""
    text = (files(__package__) / "snippets" / name).read_text(encoding="utf-8")
    _header, blank_line, body = text.partition("\n\n")
    if not blank_line:
        raise ValueError(f"snippets/{name} needs a header comment and an empty line before its Bash")
    return body


def _fill(template: str, **values: str) -> str:
    """snippets/`template` with each @@NAME@@ marker replaced in one pass, so nothing inserted is
    ever scanned for markers. A marker alone on its line stands for whole lines: its value is empty
    or ends in a newline, and takes the marker's line."""
    unused = set(values)

    def value(marker: re.Match[str]) -> str:
        name = marker["lines"] or marker["word"]
        unused.discard(name)
        text = values[name]
        if marker["lines"] and text and not text.endswith("\n"):
            raise ValueError(f"@@{name}@@ in snippets/{template} stands for whole lines, each ending in a newline")
        return text

    filled = _MARKER.sub(value, _template(template))
    if unused:
        raise KeyError(f"snippets/{template} has no marker for {', '.join(sorted(unused))}")
    return filled


def _whole_snippet(template: str, **values: str) -> str:
    """A snippet as the admin copies it: it ends with its last command, not the file's newline."""
    return _fill(template, **values).removesuffix("\n")


def _preamble() -> str:
    return _fill("preamble.sh", COMPOSE=COMPOSE_FILE)


def _read_secret(variable: str, prompt: str, kind: str, prefix: str, outcome: str) -> str:
    """Bash lines that read one secret from a hidden prompt into `variable` and refuse a wrong one."""
    return _fill("read-secret.sh", VARIABLE=variable, PROMPT=prompt, KIND=kind, PREFIX=prefix, OUTCOME=outcome)


def _bash_literal(value: str) -> str:
    """`value` as one Bash word that expands to exactly itself.

    Plain single quotes where that reads well; a value holding `$`, a backquote or a newline is
    written as $'...' with those characters as escapes, so neither a reader nor shellcheck can take
    it for an expansion (manifest values are printable: no other control characters).
    """
    if not any(char in value for char in "$`\n"):
        return shlex.quote(value)
    escapes = {"\\": "\\\\", "'": "\\x27", "$": "\\x24", "`": "\\x60", "\n": "\\n"}
    return "$'" + "".join(escapes.get(char, char) for char in value) + "'"


def _expect(what: str, template: str, expected: str) -> str:
    return f"  expect_image {shlex.quote(what)} {_bash_literal(template)} {_bash_literal(expected)}\n"


def _listed(items: tuple[str, ...]) -> str:
    """What the list templates below print: the count, each item on its own line, then "." (so an
    empty last item is not lost to $(...)'s trimming of trailing newlines)."""
    return str(len(items)) + "".join(f"\n{item}" for item in items) + "\n."


# Go templates for the image config (D5). Slices and maps print the same through Docker's CLI and
# podman's; maps are visited in sorted key order, as the manifest stores them.
_LIST_TEMPLATES = {
    "entrypoint": r'{{len .Config.Entrypoint}}{{range .Config.Entrypoint}}{{"\n"}}{{.}}{{end}}{{"\n."}}',
    "cmd": r'{{len .Config.Cmd}}{{range .Config.Cmd}}{{"\n"}}{{.}}{{end}}{{"\n."}}',
    "env": r'{{len .Config.Env}}{{range .Config.Env}}{{"\n"}}{{.}}{{end}}{{"\n."}}',
    "volumes": r'{{len .Config.Volumes}}{{range $path, $unused := .Config.Volumes}}{{"\n"}}{{$path}}{{end}}{{"\n."}}',
    "exposed_ports": (
        r'{{len .Config.ExposedPorts}}{{range $port, $unused := .Config.ExposedPorts}}{{"\n"}}{{$port}}{{end}}'
        r'{{"\n."}}'
    ),
}
_STRING_TEMPLATES = {"user": "{{.Config.User}}", "working_dir": "{{.Config.WorkingDir}}"}


def _config_and_label_expectations(record: ImageRecord) -> str:
    """One `expect_image` line per config setting and label the release manifest records (D5)."""
    lines = []
    for name, template in _LIST_TEMPLATES.items():
        lines.append(_expect(f"config {name}", template, _listed(record.setting(name))))
    for name, template in _STRING_TEMPLATES.items():
        lines.append(_expect(f"config {name}", template, record.setting(name)))
    for key, value in record.labels:
        # _LABEL_KEY keeps quotes and backslashes out of the key, so it sits safely in the template;
        # label values are never empty, so a missing label (printed as "") cannot pass.
        lines.append(_expect(f"label {key}", '{{index .Config.Labels "' + key + '"}}', value))
    return "".join(lines)


def _release_check(record: ImageRecord, variable: str) -> str:
    """check-release-image.sh for one manifest entry; it exports `variable` naming the image (D5)."""
    return _fill(
        "check-release-image.sh",
        IMAGE=shlex.quote(record.tag),
        BUNDLE=f"modelforge-{record.version}-images.tar",
        ARCHITECTURE=record.architecture,  # record_from_json: [a-z0-9_]+, as is OS
        OS=record.os,
        LAYERS=" \\\n      ".join(record.rootfs_layers),
        EXPECTATIONS=_config_and_label_expectations(record),
        IMAGE_VARIABLE=variable,
    )


def _image_check(source: ImageSource) -> str:
    """What the start command checks about the image before it asks for the token (D5)."""
    if source.release is not None:
        return _release_check(source.release, "MODELFORGE_NODE_AGENT_IMAGE")
    if source.kind == "digest":
        return _fill("use-pinned-image.sh")
    return ""


# Start and recreate never build a release or pinned image, and never pull a release (D5, seed).
_UP_FLAGS = {"release": " --no-build --pull never", "digest": " --no-build", "local": ""}


def _start_agent(source: ImageSource) -> str:
    if source.release is not None:
        return _fill("create-check-start.sh", COMPOSE=COMPOSE_FILE)
    return _fill("up.sh", COMPOSE=COMPOSE_FILE, UP_FLAGS=_UP_FLAGS[source.kind])


def start_command(source: ImageSource = LOCAL_BUILD) -> str:
    """The Bash snippet that starts the agent with a token read from a hidden prompt (C4, D5)."""
    return _whole_snippet(
        "start.sh",
        PREAMBLE=_preamble(),
        IMAGE_CHECK=_image_check(source),
        READ_TOKEN=_read_secret("token", "the one-time enrolment token", "an enrolment token", "mfe_", "started"),
        START_AGENT=_start_agent(source),
    )


def recreate_command(source: ImageSource = LOCAL_BUILD) -> str:
    """The command that recreates the agent without the token, keeping its state volume (C4, I3).

    For a release or pinned image, a MODELFORGE_NODE_AGENT_IMAGE exported in the admin's shell is
    dropped too, so the image named in .env is the one that runs (Compose prefers the shell's).
    """
    unset_image = "" if source.kind == "local" else " -u MODELFORGE_NODE_AGENT_IMAGE"
    return _whole_snippet("recreate.sh", COMPOSE=COMPOSE_FILE, UNSET_IMAGE=unset_image, UP_FLAGS=_UP_FLAGS[source.kind])


def replace_credential_command() -> str:
    """The Bash snippet that installs a rotated credential into the agent's state directory (I5)."""
    return _whole_snippet(
        "replace-credential.sh",
        PREAMBLE=_preamble(),
        READ_CREDENTIAL=_read_secret("credential", "the new node credential", "a node credential", "mfn_", "changed"),
        COMPOSE=COMPOSE_FILE,
    )


def venv_start_command(env: AgentEnv) -> str:
    """The Bash snippet that starts the agent from a checkout's virtual environment, without Docker
    (C4, N4): its four data directories under one base, preflight first, the token from a hidden
    prompt unless the node is enrolled already. The settings are those of env_file() that the agent
    reads itself; the data directories' variables come from app.rules, as the README's block sets them."""
    _check(env)
    settings = [
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", shlex.quote(env.control_plane_url)),
        ("MODELFORGE_AGENT_DISPLAY_NAME", _bash_literal(env.display_name)),
        ("MODELFORGE_AGENT_ACCELERATOR_MODE", env.accelerator_mode),
        *((variable, f'"$agent_data/{name}"') for name, variable in rules.AGENT_DATA_DIR_VARIABLES.items()),
    ]
    return _whole_snippet(
        "start-venv.sh",
        MAKE_DIRS="".join(f' "$agent_data/{name}"' for name in rules.AGENT_DATA_DIR_VARIABLES),
        SETTINGS="".join(f"  export {variable}={value}\n" for variable, value in settings),
        # Inside the snippet's if/else, so two spaces deeper than read-secret.sh writes it.
        READ_TOKEN=textwrap.indent(
            _read_secret("token", "the one-time enrolment token", "an enrolment token", "mfe_", "started"), "  "
        ),
    )


def worker_start_command(source: ImageSource = LOCAL_BUILD, image: WorkerImage = WORKER_GPU) -> str:
    """The Bash snippet that starts the runtime worker beside the agent with its overlays (W3, D5).

    A release image whose worker entry was pasted with the manifest is checked as the agent's is
    and must be the image its container is created from; any other release or pinned image must be
    named in .env, and is never built or pulled against that. A local build builds it if missing.
    """
    record = source.worker(image)
    unset = [] if source.kind == "local" else ["MODELFORGE_NODE_AGENT_IMAGE"]
    if record is None and source.kind != "local":
        unset.append(image.variable)
    return _whole_snippet(
        "start-worker.sh",
        WHICH=image.which,
        FILE_NAMES=" ".join(image.compose_files),
        FILES="".join(f" -f {name}" for name in image.compose_files),
        IMAGE_CHECK=_release_check(record, image.variable) if record is not None else "",
        NEEDS_ENV_IMAGE=(
            _fill("needs-worker-image.sh", VARIABLE=image.variable) if record is None and source.kind != "local" else ""
        ),
        UNSET_IMAGES="".join(f" -u {variable}" for variable in unset),
        START=(
            _fill("create-check-start-worker.sh")
            if record is not None
            else _fill("up-worker.sh", UP_FLAGS=_UP_FLAGS[source.kind])
        ),
    )
