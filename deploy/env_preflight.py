#!/usr/bin/env python3
"""Check a node agent .env before `docker compose up`: `python3 deploy/env_preflight.py path/to/.env`.

Standard library only, so it runs on any host with Python 3 (Unraid included), from the checkout. Exit 2 with one
line per problem, each naming the variable; exit 0 when nothing is refused (warnings go to stderr).
"""

from __future__ import annotations

import posixpath
import sys
from pathlib import Path
from urllib.parse import urlsplit

from app_modules import load

rules = load("rules")  # the wizard's own image rule (app/rules.py)

EXIT_OK = 0
EXIT_REFUSED = 2

VOLUME_VARIABLES = (
    "MODELFORGE_AGENT_STATE_VOLUME",
    "MODELFORGE_AGENT_HF_CACHE_VOLUME",
    "MODELFORGE_AGENT_ARTIFACT_VOLUME",
    "MODELFORGE_AGENT_QUARANTINE_VOLUME",
)
# Mounting one of these (or, except /root, anything inside one) would hand the agent the host's
# operating system or a non-durable pseudo filesystem instead of a dedicated data directory.
SYSTEM_DIRECTORIES = (
    "/",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/boot",
    "/proc",
    "/sys",
    "/dev",
    "/var/run",
    "/run",
    "/root",
)
SYSTEM_TREES = tuple(d for d in SYSTEM_DIRECTORIES if d not in {"/", "/root"})
# The hosts our examples use; the agent refuses them too (exit 2), better to hear it now.
PLACEHOLDER_HOSTS = ("modelforge.example", "example.internal", "example.com")
URL_VARIABLE = "MODELFORGE_AGENT_CONTROL_PLANE_URL"
TLS_VARIABLE = "MODELFORGE_AGENT_TLS_VERIFY"
IMAGE_VARIABLE = "MODELFORGE_NODE_AGENT_IMAGE"
# The runtime worker overlays' images (W3): the same rule as the agent's.
IMAGE_VARIABLES = (IMAGE_VARIABLE, "MODELFORGE_RUNTIME_WORKER_IMAGE", "MODELFORGE_RUNTIME_WORKER_CPU_IMAGE")
TOKEN_VARIABLE = "MODELFORGE_AGENT_ENROLLMENT_TOKEN"


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines as Compose reads them: comments, blanks and `export ` ignored, quotes stripped."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            # An unquoted value ends at an inline comment.
            value = value.split(" #", 1)[0].rstrip()
        values[key] = value
    return values


def _is_named_volume(value: str) -> bool:
    """Compose reads a source without a slash (and not starting with '.' or '~') as a named volume."""
    return "/" not in value and not value.startswith((".", "~"))


def _inside(path: str, parent: str) -> bool:
    return parent == "/" or path == parent or path.startswith(parent + "/")


def _system_directory(path: str) -> str | None:
    """The system directory `path` is (or lies inside), else None."""
    if path in SYSTEM_DIRECTORIES:
        return path
    return next((d for d in SYSTEM_TREES if _inside(path, d)), None)


def check_volumes(env: dict[str, str]) -> list[str]:
    """Refuse volume sources that are relative, system directories, or shared between volumes."""
    problems: list[str] = []
    absolute: dict[str, str] = {}
    for name in VOLUME_VARIABLES:
        value = env.get(name, "").strip()
        if not value or _is_named_volume(value):
            continue
        if not value.startswith("/"):
            problems.append(f"{name}={value} is a relative path; use a dedicated absolute host directory")
            continue
        # normpath keeps a leading "//" (POSIX allows it to mean something else); Linux does not.
        path = "/" + posixpath.normpath(value).lstrip("/")
        if path == "/":
            problems.append(f"{name}={value} is the host root; use a dedicated directory")
            continue
        system = _system_directory(path)
        if system is not None:
            problems.append(f"{name}={value} is the system directory {system} or inside it; use a dedicated directory")
            continue
        absolute[name] = path
    names = list(absolute)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            a, b = absolute[first], absolute[second]
            if a == b:
                problems.append(f"{second}={env[second]} is the same directory as {first}; give each volume its own")
            elif _inside(a, b) or _inside(b, a):
                inner, outer = (first, second) if _inside(a, b) else (second, first)
                problems.append(f"{inner}={env[inner]} is inside {outer}={env[outer]}; give each volume its own")
    return problems


def check_url(env: dict[str, str]) -> list[str]:
    """Refuse a missing, malformed or example control plane URL."""
    value = env.get(URL_VARIABLE, "").strip()
    if not value:
        return [f"{URL_VARIABLE} is not set; set it to the control plane's https:// address"]
    try:
        parts = urlsplit(value)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return [f"{URL_VARIABLE}={value} is not a valid URL"]
    if parts.scheme not in {"http", "https"} or not host:
        return [f"{URL_VARIABLE}={value} must be an http(s) URL such as https://modelforge.lan:8000"]
    if any(host == example or host.endswith("." + example) for example in PLACEHOLDER_HOSTS):
        return [f"{URL_VARIABLE}={value} is still the example placeholder ({host}); set your control plane's address"]
    return []


def check_image(env: dict[str, str]) -> list[str]:
    """Refuse `latest`, named or implied (D2, W3): an upgrade should be a decision, not a pull."""
    problems = []
    for name in IMAGE_VARIABLES:
        value = env.get(name, "").strip()
        if value and (problem := rules.image_reference_problem(value)):
            problems.append(f"{name}={value}: {problem}")
    return problems


def warnings_for(env: dict[str, str]) -> list[str]:
    """Settings that work but deserve a second look."""
    found: list[str] = []
    if env.get(TLS_VARIABLE, "").strip().lower() in {"0", "false", "no", "off"}:
        found.append(
            f"{TLS_VARIABLE}=false: the control plane's certificate will NOT be verified; "
            "use docker-compose.node-agent.private-ca.yml with MODELFORGE_AGENT_CA_CERT_PATH instead"
        )
    if env.get(TOKEN_VARIABLE, "").strip():
        found.append(
            f"{TOKEN_VARIABLE} is set in this file; remove it once the node is online and recreate the container"
        )
    return found


def main(argv: list[str] | None = None) -> int:
    """Check one .env file; print problems and warnings; return the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in {"-h", "--help"}:
        print("usage: python3 deploy/env_preflight.py path/to/.env", file=sys.stderr)
        return EXIT_REFUSED
    path = Path(args[0])
    try:
        env = parse_env(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        print(f"env_preflight: cannot read {path}: {error}", file=sys.stderr)
        return EXIT_REFUSED
    problems = check_url(env) + check_volumes(env) + check_image(env)
    for warning in warnings_for(env):
        print(f"env_preflight: warning: {warning}", file=sys.stderr)
    for problem in problems:
        print(f"env_preflight: refused: {problem}", file=sys.stderr)
    if problems:
        return EXIT_REFUSED
    print(f"env_preflight: {path} looks right")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
