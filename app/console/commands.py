"""The text the enrol wizard and the node page hand to the admin: a `.env` and Bash snippets (C4, I5, P2).

Pure functions: no Flask, no database. Nothing here ever sees a token or a credential; the
snippets read them on the node from a hidden prompt, so no secret is ever part of this text (P2).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.release_manifest import NODE_AGENT, ImageRecord, record_from_json

COMPOSE_FILE = "docker-compose.node-agent.yml"
ACCELERATOR_MODES = ("nvidia", "cpu", "auto")
LOCAL_IMAGE = f"{NODE_AGENT}:local"
# registry[:port]/path/name@sha256:<digest>, lower case as the distribution spec writes names.
_PINNED_REFERENCE = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}"
)


@dataclass(frozen=True)
class ImageSource:
    """Where the node's agent image comes from, and what the start command checks about it (C4, D5).

    release: the release bundle loaded with `docker image load`, checked against the manifest's
        images.modelforge-node-agent entry (tag, architecture, OS, RootFS layers, config, labels)
        before the token is read; the container must be created from exactly that image before it
        starts. Never pulled or built.
    digest: a registry image pinned by @sha256 digest; pulled if missing, never built.
    local: built from this checkout's Dockerfile (development).
    """

    kind: str
    reference: str
    release: ImageRecord | None = None

    def to_json(self) -> dict[str, object]:
        """What the enrolment keeps, so later steps give the same commands."""
        stored: dict[str, object] = {"kind": self.kind, "reference": self.reference}
        if self.release is not None:
            stored["release"] = self.release.to_json()
        return stored

    @classmethod
    def from_json(cls, stored: dict | None) -> ImageSource:
        if not stored:
            return LOCAL_BUILD
        if stored.get("kind") == "release":
            return release_image(record_from_json(stored["release"]))
        if stored.get("kind") == "digest":
            return pinned_image(stored["reference"])
        return LOCAL_BUILD


LOCAL_BUILD = ImageSource("local", LOCAL_IMAGE)


def release_image(record: ImageRecord) -> ImageSource:
    return ImageSource("release", record.tag, record)


def pinned_image(reference: str) -> ImageSource:
    """A registry image pinned by digest; ValueError when `reference` is not one."""
    if not _PINNED_REFERENCE.fullmatch(reference):
        raise ValueError("write the image as registry/path/name@sha256:<64 hex digits> (a tag before @ is optional)")
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
    last_part = env.image.rsplit("/", 1)[-1]
    if "@" not in last_part and (":" not in last_part or last_part.endswith(":latest")):
        # D2: never `latest`, and an image without a tag or digest means `latest`.
        raise ValueError("image must name a release tag or an @sha256 digest, never latest")


def env_file(env: AgentEnv) -> str:
    """The non-secret `deploy/.env` for a node agent: no token, credential or Hub token, ever (P2)."""
    _check(env)

    def line(name: str, value: str) -> str:
        return f"{name}={_dotenv_value(name, value)}"

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
    ]
    return "\n".join(lines) + "\n"


# Shared by both secret-reading snippets (C4, I5). It runs in a subshell so `set -e`, the traps
# and `exit` never touch the admin's interactive shell. Tracing goes off first, and that line is
# not traced itself. The traps remove the temporary secret file on success, on error and on
# HUP/INT/TERM (exit 128+signal); the file variable is empty until mktemp has made the file.
_PREAMBLE = """\
(
  { set +x; } 2>/dev/null
  set -euo pipefail
  umask 077
  secret_file=''
  trap 'if [[ -n "$secret_file" ]]; then rm -f -- "$secret_file"; fi' EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'echo "modelforge: stopped after an error; no secret file is left behind." >&2' ERR
  for required in .env __COMPOSE__; do
    if [[ ! -f "$required" ]]; then
      echo "modelforge: no $required in $PWD; cd to the deploy/ directory that holds .env and __COMPOSE__." >&2
      exit 1
    fi
  done
  if ! command -v docker >/dev/null; then
    echo "modelforge: docker is not on PATH; install Docker with Compose v2 first." >&2
    exit 1
  fi
"""


def _read_secret(variable: str, prompt: str, kind: str, prefix: str, outcome: str) -> str:
    """Bash lines that read one secret from a hidden prompt into `variable` and refuse a wrong one.

    One place for both snippets (C4, I5): no echo, pasted whitespace dropped, and the charset check
    also keeps the value a valid .env line (P2). The secret is never echoed back, even when refused.
    """
    return f"""\
  {variable}=''
  IFS= read -rs -p 'Paste {prompt} (input hidden): ' {variable} || true
  printf '\\n' >&2
  {variable}=${{{variable}//[[:space:]]/}}
  if [[ ! "${variable}" =~ ^{prefix}[[:alnum:]_-]+$ ]]; then
    echo "modelforge: that is not {kind} (they start with {prefix}); nothing was {outcome}." >&2
    exit 1
  fi
"""


# D5: before the token is asked for, the loaded image must be the release's: tag, architecture,
# OS, RootFS layers, what it runs (entrypoint, cmd, env, user, working dir, volumes, ports) and
# every recorded label (a Go template each, so Docker itself reads them).
# The image ID is not compared, since `docker image load` may rewrite it; it is captured instead,
# and the container must be created from exactly that image (checked before it starts, below).
_RELEASE_IMAGE_CHECK = """\
  image=__IMAGE__
  if ! image_id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null); then
    echo "modelforge: there is no image $image on this node. Check the release with sha256sum -c SHA256SUMS," \\
      "then load its bundle: docker image load -i __BUNDLE__" >&2
    exit 1
  fi
  mismatch=''
  expect_image() {
    local found
    found=$(docker image inspect --format "$2" "$image")
    if [[ "$found" != "$3" ]]; then mismatch+="  $1: expected '$3', found '$found'"$'\\n'; fi
  }
__EXPECTATIONS__
  if [[ -n "$mismatch" ]]; then
    printf 'modelforge: %s is not the release image in the manifest; nothing was started:\\n%s' "$image" "$mismatch" >&2
    exit 1
  fi
  export MODELFORGE_NODE_AGENT_IMAGE="$image"
"""

# The container is created, not started, and must have been created from exactly the image
# checked above; only then does it start, so a different image never runs with the token.
_CREATE_CHECK_START = """\
  docker compose --env-file "$secret_file" -f __COMPOSE__ up --no-start --no-build --pull never node-agent
  container_id=$(docker compose --env-file "$secret_file" -f __COMPOSE__ ps -a -q node-agent)
  created_from=$(docker inspect --format '{{.Image}}' "$container_id")
  if [[ "$created_from" != "$image_id" ]]; then
    docker compose --env-file "$secret_file" -f __COMPOSE__ rm -f -s node-agent
    echo "modelforge: node-agent was created from image $created_from, not the checked $image_id;" \\
      "it was removed before it started." >&2
    exit 1
  fi
  docker compose --env-file "$secret_file" -f __COMPOSE__ start node-agent
"""

# C4: the token goes from a hidden prompt into a mode-0600 temp file through the printf builtin,
# so it is never echoed, traced, in the shell history or in any process's argv. The temp file is
# the token line followed by .env (less any token line of its own), given to Compose as its only
# --env-file: every Compose v2 reads one env file, while a second --env-file is honoured only from
# 2.17 on (earlier ones silently use just the last). The token comes first so that a malformed
# .env line, which some Compose versions report with the rest of the file, is never reported with
# the token. The file is gone when the subshell ends. The charset check also keeps the token line
# parseable (P2).
_START_HOSTNAME = """\
  # I4: inside the container the agent sees only the container's name, which changes on every
  # recreate; the node's own name goes into .env once, so duplicate identities stay visible.
  hostname_setting='^[[:space:]]*(export[[:space:]]+)?MODELFORGE_AGENT_HOSTNAME[[:space:]]*=[[:space:]]*[^[:space:]#]'
  if ! grep -Eq "$hostname_setting" .env; then
    node_hostname=$(uname -n)
    if [[ ! "$node_hostname" =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]]; then
      echo "modelforge: set MODELFORGE_AGENT_HOSTNAME in .env to this node's host name first." >&2
      exit 1
    fi
    if [[ -s .env && -n "$(tail -c 1 .env)" ]]; then echo >>.env; fi
    echo "MODELFORGE_AGENT_HOSTNAME=$node_hostname" >>.env
    echo "modelforge: added MODELFORGE_AGENT_HOSTNAME=$node_hostname to .env." >&2
  fi
"""

_WRITE_TOKEN_FILE = """\
  secret_file=$(mktemp "${TMPDIR:-/tmp}/modelforge-enrol.XXXXXXXXXX")
  chmod 600 -- "$secret_file"
  builtin printf 'MODELFORGE_AGENT_ENROLLMENT_TOKEN=%s\\n' "$token" >"$secret_file"
  unset token MODELFORGE_AGENT_ENROLLMENT_TOKEN
  token_setting='^[[:space:]]*(export[[:space:]]+)?MODELFORGE_AGENT_ENROLLMENT_TOKEN[[:space:]]*='
  grep -Ev "$token_setting" .env >>"$secret_file" || true
  echo "modelforge: starting node-agent; the token is in a mode-0600 temp file, removed when this ends." >&2
"""

_UP = """\
  docker compose --env-file "$secret_file" -f __COMPOSE__ up -d__UP_FLAGS__ node-agent
"""

_START_DONE = """\
  echo "modelforge: started. When the console shows the node ready, run the recreate command." >&2
)"""

# Start and recreate never build a release or pinned image, and never pull a release (D5, seed).
_UP_FLAGS = {"release": " --no-build --pull never", "digest": " --no-build", "local": ""}

# I3: the state volume keeps identity and credential, so the container is recreated from .env
# alone; `env -u` also keeps a token still exported in the admin's shell out of it.
_RECREATE = (
    "# Recreate node-agent without the enrolment token; identity and credential stay in the state volume.\n"
    "env -u MODELFORGE_AGENT_ENROLLMENT_TOKEN__UNSET_IMAGE__ docker compose --env-file .env -f __COMPOSE__"
    " up -d --force-recreate__UP_FLAGS__ node-agent"
)

# I5, I2: after a rotation the new credential goes into <state>/node-credential exactly as the
# agent writes it (write_private_file: the text plus "\n", mode 0600, atomic rename; the agent's
# State._read_state strips the newline). The temp file is made inside the state directory so the
# rename is atomic, and is prepared (written, chmod, chown) before anything is stopped, so a
# failure leaves the node as it was. The state directory is taken from .env and exported, so
# Compose mounts exactly the directory written to. Only host paths: a named volume has no path
# the admin can write to here.
_REPLACE_CREDENTIAL = (
    "# ModelForge: install a rotated node credential into the agent's state directory. Paste in deploy/, as root.\n"
    + _PREAMBLE
    + """\
  state_dir=''
  setting='^[[:space:]]*(export[[:space:]]+)?MODELFORGE_AGENT_STATE_VOLUME[[:space:]]*[=:][[:space:]]*(.*)$'
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" =~ $setting ]]; then state_dir=${BASH_REMATCH[2]}; fi
  done <.env
  single_quoted="^'([^']*)'"
  double_quoted='^"([^"\\\\$]*)"'
  if [[ "$state_dir" =~ $single_quoted || "$state_dir" =~ $double_quoted ]]; then
    state_dir=${BASH_REMATCH[1]}
  elif [[ "$state_dir" == [\\'\\"]* || "$state_dir" == *'$'* ]]; then
    echo "modelforge: write MODELFORGE_AGENT_STATE_VOLUME in .env as a plain path (no \\$ or escapes)." >&2
    exit 1
  else
    state_dir=${state_dir%% #*}
    state_dir=${state_dir%"${state_dir##*[![:space:]]}"}
  fi
  if [[ "$state_dir" != /* || ! -d "$state_dir" ]]; then
    echo "modelforge: MODELFORGE_AGENT_STATE_VOLUME in .env must be the absolute path of an existing host" \\
      "directory (now: '${state_dir}'). Named Docker volumes are not supported here: use a host path." >&2
    exit 1
  fi
  if [[ -n "${MODELFORGE_AGENT_STATE_VOLUME:-}" && "$MODELFORGE_AGENT_STATE_VOLUME" != "$state_dir" ]]; then
    echo "modelforge: your shell exports MODELFORGE_AGENT_STATE_VOLUME=$MODELFORGE_AGENT_STATE_VOLUME but .env" \\
      "says $state_dir; unset it or make them agree." >&2
    exit 1
  fi
  export MODELFORGE_AGENT_STATE_VOLUME="$state_dir"
  unset MODELFORGE_AGENT_ENROLLMENT_TOKEN
"""
    + _read_secret("credential", "the new node credential", "a node credential", "mfn_", "changed")
    + """\
  secret_file=$(mktemp "$state_dir/.node-credential.XXXXXXXXXX")
  chmod 600 -- "$secret_file"
  builtin printf '%s\\n' "$credential" >"$secret_file"
  unset credential
  if ! chown -- 65532:65532 "$secret_file"; then
    echo "modelforge: cannot give the credential file to the agent's user (65532:65532); nothing was" \\
      "changed. Open a root shell (sudo -i), cd back to this directory and paste this again." >&2
    exit 1
  fi
  sync
  echo "modelforge: stopping node-agent, replacing $state_dir/node-credential, recreating node-agent." >&2
  docker compose --env-file .env -f __COMPOSE__ stop node-agent
  mv -f -- "$secret_file" "$state_dir/node-credential"
  secret_file=''
  sync
  docker compose --env-file .env -f __COMPOSE__ up -d --force-recreate node-agent
  echo "modelforge: done; the node should show online again in the console within a minute." >&2
)"""
)


def _fill(template: str, **values: str) -> str:
    """Replace each __NAME__ marker in one pass, so nothing inserted is ever scanned for markers."""
    return re.sub(r"__([A-Z_]+?)__", lambda marker: values[marker.group(1)], template)


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
    return f"  expect_image {shlex.quote(what)} {_bash_literal(template)} {_bash_literal(expected)}"


def _listed(items: tuple[str, ...]) -> str:
    """What the list templates below print: the count, each item on its own line, then "." (so an
    empty last item is not lost to $(...)'s trimming of trailing newlines)."""
    return str(len(items)) + "".join(f"\n{item}" for item in items) + "\n."


# Go templates for the image config (D5). Slices and maps print the same through Docker's CLI and
# podman's; maps are visited in sorted key order, as the manifest stores them.
_LIST_TEMPLATES = {
    "entrypoint": '{{len .Config.Entrypoint}}{{range .Config.Entrypoint}}{{"\\n"}}{{.}}{{end}}{{"\\n."}}',
    "cmd": '{{len .Config.Cmd}}{{range .Config.Cmd}}{{"\\n"}}{{.}}{{end}}{{"\\n."}}',
    "env": '{{len .Config.Env}}{{range .Config.Env}}{{"\\n"}}{{.}}{{end}}{{"\\n."}}',
    "volumes": '{{len .Config.Volumes}}{{range $path, $unused := .Config.Volumes}}{{"\\n"}}{{$path}}{{end}}{{"\\n."}}',
    "exposed_ports": (
        '{{len .Config.ExposedPorts}}{{range $port, $unused := .Config.ExposedPorts}}{{"\\n"}}{{$port}}{{end}}'
        '{{"\\n."}}'
    ),
}
_STRING_TEMPLATES = {"user": "{{.Config.User}}", "working_dir": "{{.Config.WorkingDir}}"}


def _release_expectations(record: ImageRecord) -> str:
    """One `expect_image` line per fact the release manifest records about the image (D5)."""
    layers = " \\\n".join(f"      {layer}" for layer in record.rootfs_layers)
    lines = [
        f"  expect_image architecture '{{{{.Architecture}}}}' {record.architecture}",  # [a-z0-9_]+
        f"  expect_image os '{{{{.Os}}}}' {record.os}",
        "  expect_image 'RootFS layers' '{{range .RootFS.Layers}}{{.}} {{end}}' \"$(printf '%s ' \\\n" + layers + ')"',
    ]
    for name, template in _LIST_TEMPLATES.items():
        lines.append(_expect(f"config {name}", template, _listed(record.setting(name))))
    for name, template in _STRING_TEMPLATES.items():
        lines.append(_expect(f"config {name}", template, record.setting(name)))
    for key, value in record.labels:
        # _LABEL_KEY keeps quotes and backslashes out of the key, so it sits safely in the template;
        # label values are never empty, so a missing label (printed as "") cannot pass.
        lines.append(_expect(f"label {key}", f'{{{{index .Config.Labels "{key}"}}}}', value))
    return "\n".join(lines) + "\n"


def start_command(source: ImageSource = LOCAL_BUILD) -> str:
    """The Bash snippet that starts the agent with a token read from a hidden prompt (C4, D5)."""
    parts = [
        "# ModelForge: start the node agent with the one-time enrolment token. Paste in deploy/.\n",
        _fill(_PREAMBLE, COMPOSE=COMPOSE_FILE),
    ]
    if source.release is not None:
        parts.append(_fill(
            _RELEASE_IMAGE_CHECK,
            IMAGE=shlex.quote(source.reference),
            BUNDLE=f"modelforge-{source.release.version}-images.tar",
            EXPECTATIONS=_release_expectations(source.release).rstrip("\n"),
        ))  # fmt: skip
    elif source.kind == "digest":
        parts.append("  unset MODELFORGE_NODE_AGENT_IMAGE  # the pinned image in .env is the one that runs\n")
    parts += [
        _fill(_START_HOSTNAME),
        _read_secret("token", "the one-time enrolment token", "an enrolment token", "mfe_", "started"),
        _WRITE_TOKEN_FILE,
        _fill(_CREATE_CHECK_START if source.release is not None else _UP, COMPOSE=COMPOSE_FILE,
              UP_FLAGS=_UP_FLAGS[source.kind]),
        _START_DONE,
    ]  # fmt: skip
    return "".join(parts)


def recreate_command(source: ImageSource = LOCAL_BUILD) -> str:
    """The command that recreates the agent without the token, keeping its state volume (C4, I3).

    For a release or pinned image, a MODELFORGE_NODE_AGENT_IMAGE exported in the admin's shell is
    dropped too, so the image named in .env is the one that runs (Compose prefers the shell's).
    """
    unset_image = "" if source.kind == "local" else " -u MODELFORGE_NODE_AGENT_IMAGE"
    return _fill(_RECREATE, COMPOSE=COMPOSE_FILE, UNSET_IMAGE=unset_image, UP_FLAGS=_UP_FLAGS[source.kind])


def replace_credential_command() -> str:
    """The Bash snippet that installs a rotated credential into the agent's state directory (I5)."""
    return _fill(_REPLACE_CREDENTIAL, COMPOSE=COMPOSE_FILE)
