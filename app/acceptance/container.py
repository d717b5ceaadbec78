"""V1 container status: the admin pastes `docker inspect` (or `podman inspect`) of the node-agent container.

The control plane checks the hardening the compose file asks for (D2) and, when the node was enrolled
from a release manifest (D5), that the container runs that image. Only a projection of the document
is stored — the fields the checks read, environment variable names without their values, labels
without secret-looking values, no command line — and what is kept (label values, the image
reference, mount sources and binds, what each check saw) is scrubbed like the read-back: the node's
known secrets and every shape of app.redaction (Hub and provider tokens, a URL's password), so
nothing secret in the paste is ever kept.
"""

from __future__ import annotations

import json
import posixpath
import re

import sqlalchemy as sa

from app.acceptance import checklist, secrets_scan
from app.errors import DomainError
from app.extensions import db
from app.models import Enrollment, EnrollmentState
from app.timeutil import utcnow

# One fact: the body's limit (app/api/bodies.py ContainerStatusRequest) and this check's. A real
# `docker inspect` of one container is 5–15 KiB.
MAX_INSPECT_CHARS = 128 * 1024
# deploy/docker-compose.node-agent.yml's file and service (app/console/commands.py COMPOSE_FILE).
COMPOSE_FILE = "docker-compose.node-agent.yml"
SERVICE = "node-agent"
RESTART_POLICIES = ("unless-stopped", "always")
SOCKETS = ("docker.sock", "podman.sock", "containerd.sock")
# Where the engines keep their sockets ("*" is a user's id): mounting one of these paths or any
# directory above it (/run, /var/run, /run/podman, /run/user/1000, /var/run/docker, / …) hands the
# container the socket as surely as mounting the socket itself.
SOCKET_PATHS = (
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/docker/containerd/containerd.sock",
    "/var/run/docker/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/var/run/podman/podman.sock",
    "/run/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
    "/run/user/*/docker.sock",
    "/run/user/*/podman/podman.sock",
)
_USER_RUN = re.compile(r"^/run/user/[0-9]+(?=/|$)")
MAX_LISTED = 64
# The capabilities Docker and podman grant by default (podman already drops the first three): a
# container that dropped all of these and added none runs with none.
DEFAULT_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "MKNOD",
        "NET_RAW",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
MAX_VALUE = 500


def inspect_command(node_id: str) -> str:
    """The command the admin runs on the node's host, in the deploy directory (podman works the same).

    Compose names the container; asking it for the id works whatever the project directory is called.
    """
    del node_id  # one command for every node: the compose file names its one service
    return f'docker inspect "$(docker compose --env-file .env -f {COMPOSE_FILE} ps -q {SERVICE})"'


def _invalid(message: str) -> DomainError:
    return DomainError(
        "INSPECT_INVALID",
        f"The pasted text is not the inspect output of one container: {message}.",
        "Paste the whole output of the command the checklist shows (a JSON array with one container).",
    )


def parse(text: str) -> dict[str, object]:
    """The one container document in pasted inspect output; INSPECT_INVALID or INSPECT_TOO_LARGE otherwise."""
    if len(text) > MAX_INSPECT_CHARS:
        raise DomainError(
            "INSPECT_TOO_LARGE",
            f"The pasted text is {len(text)} characters; at most {MAX_INSPECT_CHARS} are accepted.",
            "Paste the inspect output of the node-agent container only.",
        )
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        raise _invalid("it is not valid JSON") from None
    if isinstance(document, list):
        if len(document) != 1:
            raise _invalid(f"it lists {len(document)} containers, not one")
        document = document[0]
    if not isinstance(document, dict):
        raise _invalid("it is not a JSON object")
    for key in ("Id", "State", "HostConfig", "Config"):
        if not isinstance(document.get(key), dict if key != "Id" else str):
            raise _invalid(f"it has no {key}")
    if "Architecture" in document or "RootFS" in document:
        raise _invalid("it describes an image, not a container")
    return document


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _short(value: object) -> object:
    if isinstance(value, str):
        return value[:MAX_VALUE]
    return value if isinstance(value, bool | int | float) or value is None else str(value)[:MAX_VALUE]


def _said(value: object, shown: str, missing: str) -> str:
    """What the inspect said of a field, in words: `shown` with the value, or `missing` when it said nothing."""
    return missing if value in (None, "") else shown.format(value)


def _yes_no(value: object, yes: str, no: str) -> str:
    """A true/false field in words; anything else is reported as it came, never as a Python repr."""
    if value is True:
        return yes
    if value is False:
        return no
    return _said(value, "{} (not true or false)", "not reported")


def project(document: dict[str, object]) -> dict[str, object]:
    """What is kept of the paste: the checked fields, env names (no values), labels without secret values."""
    config, host, state = _dict(document.get("Config")), _dict(document.get("HostConfig")), _dict(document.get("State"))
    env_names = []
    for entry in _list(config.get("Env"))[:MAX_LISTED]:
        if isinstance(entry, str):
            env_names.append(entry.split("=", 1)[0][:200])
    labels = {}
    for key, value in list(_dict(config.get("Labels")).items())[:MAX_LISTED]:
        key = str(key)[:200]
        labels[key] = secrets_scan.REMOVED if secrets_scan.secret_looking_name(key) else _short(value)
    mounts = [
        {
            "type": _short(mount.get("Type")),
            "source": _short(mount.get("Source")),
            "destination": _short(mount.get("Destination")),
            "rw": _short(mount.get("RW")),
        }
        for mount in _list(document.get("Mounts"))[:MAX_LISTED]
        if isinstance(mount, dict)
    ]
    ports = _dict(_dict(document.get("NetworkSettings")).get("Ports"))
    restart = _dict(host.get("RestartPolicy"))
    projected = {
        "engine": "podman" if "EffectiveCaps" in document or "ImageName" in document else "docker",
        "id": _short(document.get("Id")),
        "name": _short(document.get("Name")),
        "image": _short(document.get("ImageName") or config.get("Image")),
        "image_id": _short(document.get("Image")),
        "image_digest": _short(document.get("ImageDigest")),
        "state": {
            "status": _short(state.get("Status")),
            "running": _short(state.get("Running")),
            "started_at": _short(state.get("StartedAt")),
            "restart_count": _short(document.get("RestartCount")),
        },
        "restart_policy": _short(restart.get("Name")),
        "readonly_rootfs": _short(host.get("ReadonlyRootfs")),
        "privileged": _short(host.get("Privileged")),
        "cap_add": [_short(cap) for cap in _list(host.get("CapAdd"))[:MAX_LISTED]],
        "cap_drop": [_short(cap) for cap in _list(host.get("CapDrop"))[:MAX_LISTED]],
        "effective_caps": (
            [_short(cap) for cap in document["EffectiveCaps"][:MAX_LISTED]]
            if isinstance(document.get("EffectiveCaps"), list)
            else None
        ),
        "security_opt": [_short(opt) for opt in _list(host.get("SecurityOpt"))[:MAX_LISTED]],
        "network_mode": _short(host.get("NetworkMode")),
        "port_bindings": {
            str(port)[:64]: _short(json.dumps(bound))
            for port, bound in list(_dict(host.get("PortBindings")).items())[:MAX_LISTED]
        },
        "published_ports": {
            str(port)[:64]: _short(json.dumps(bound)) for port, bound in list(ports.items())[:MAX_LISTED] if bound
        },
        "binds": [_short(bind) for bind in _list(host.get("Binds"))[:MAX_LISTED]],
        "mounts": mounts,
        "env_names": env_names,
        "labels": labels,
    }
    return projected


def _exposes_socket(where: object) -> bool:
    """Whether a mount source or bind ("src:dst[:opts]") is an engine's socket or a directory holding one."""
    if not isinstance(where, str) or not where.strip():
        return False
    source = where.split(":")[0].strip()
    if source.rstrip("/").endswith(SOCKETS):
        return True
    if not source.startswith("/"):
        return False  # a named volume
    source = _USER_RUN.sub("/run/user/*", posixpath.normpath("/" + source.lstrip("/")))
    return any(path == source or path.startswith(source.rstrip("/") + "/") for path in SOCKET_PATHS)


def _release_image(node_id: str) -> dict[str, object] | None:
    """The agent image the node's enrolment named from a release manifest or a pinned digest, if any (D5)."""
    stored = db.session.scalar(
        sa.select(Enrollment.agent_image)
        .where(Enrollment.node_id == node_id, Enrollment.state == EnrollmentState.CONSUMED)
        .order_by(Enrollment.consumed_at.desc())
        .limit(1)
    )
    if isinstance(stored, dict) and stored.get("kind") in ("release", "digest"):
        return stored
    return None


def _capability(name: object) -> str:
    return str(name).upper().removeprefix("CAP_")


def _bare_id(value: object) -> str:
    return str(value or "").removeprefix("sha256:")


def _image_check(seen: dict[str, object], expected: dict[str, object] | None) -> dict[str, object]:
    """D5: the container runs the image the enrolment named (release tag and image id, or pinned digest)."""
    if expected is None:
        return {
            "check": "image",
            "passed": True,
            "applies": False,
            "seen": f"{seen['image']} (the enrolment named no release manifest or digest)",
        }
    image = str(seen["image"] or "")
    if expected["kind"] == "release":
        release = _dict(expected.get("release"))
        tag = str(release.get("tag") or expected.get("reference") or "")
        passed = bool(tag) and (image == tag or image.endswith("/" + tag))
        if release.get("image_id"):
            passed = passed and _bare_id(seen["image_id"]) == _bare_id(release["image_id"])
        wanted = f"{tag}" + (f" (image {release['image_id']})" if release.get("image_id") else "")
    else:
        reference = str(expected.get("reference") or "")
        digest = reference.rpartition("@")[2]
        passed = image == reference or (bool(digest) and str(seen.get("image_digest") or "") == digest)
        wanted = reference
    return {
        "check": "image",
        "passed": passed,
        "applies": True,
        "seen": f"{image} (image {seen['image_id']})",
        "expected": wanted,
    }


def checks(seen: dict[str, object], expected_image: dict[str, object] | None) -> list[dict[str, object]]:
    """Each hardening check with what was seen and whether it passed (D2)."""
    dropped = {_capability(cap) for cap in seen["cap_drop"]}
    effective = seen["effective_caps"]
    # Docker lists ["ALL"]; podman lists each capability it dropped (at least its default set) and,
    # when it knows it, the effective set, which must then be empty.
    all_dropped = (
        not seen["cap_add"]
        and ("ALL" in dropped or DEFAULT_CAPABILITIES <= dropped)
        and (effective is None or not effective)
    )
    cap_drop = sorted(dropped)
    no_new_privileges = any(
        str(opt).replace("=", ":") in ("no-new-privileges", "no-new-privileges:true") for opt in seen["security_opt"]
    )
    sockets = [
        where
        for where in [mount["source"] for mount in seen["mounts"]] + [str(bind) for bind in seen["binds"]]
        if _exposes_socket(where)
    ]
    ports = {port: bound for port, bound in seen["port_bindings"].items() if bound not in ("null", "[]")}
    ports |= seen["published_ports"]
    running = seen["state"]["running"] is True or seen["state"]["status"] == "running"
    return [
        {
            "check": "running",
            "passed": running,
            "seen": _said(seen["state"]["status"], "status {}", "no status reported"),
        },
        {
            "check": "restart_policy",
            "passed": seen["restart_policy"] in RESTART_POLICIES,
            "seen": str(seen["restart_policy"] or "none"),
            "expected": " or ".join(RESTART_POLICIES),
        },
        {
            "check": "read_only_root",
            "passed": seen["readonly_rootfs"] is True,
            "seen": _yes_no(seen["readonly_rootfs"], "read-only root", "writable root"),
        },
        {
            "check": "capabilities_dropped",
            "passed": all_dropped,
            "seen": f"CapDrop {', '.join(cap_drop) or 'none'}; CapAdd {', '.join(map(str, seen['cap_add'])) or 'none'}",
        },
        {
            "check": "no_new_privileges",
            "passed": no_new_privileges,
            "seen": ", ".join(map(str, seen["security_opt"])) or "no security options",
        },
        {
            "check": "not_privileged",
            "passed": seen["privileged"] is not True,
            "seen": _yes_no(seen["privileged"], "privileged", "not privileged"),
        },
        {"check": "no_published_ports", "passed": not ports, "seen": ", ".join(sorted(ports)) or "none"},
        {"check": "no_container_socket", "passed": not sockets, "seen": ", ".join(sockets) or "none mounted"},
        _image_check(seen, expected_image),
    ]


def record_container_status(node_id: str, inspect_text: str, actor: str) -> checklist.Item:
    """Check and keep a pasted inspect of the node-agent container; INSPECT_INVALID / INSPECT_TOO_LARGE on bad input.

    Any failed check makes the item contradicted; a node no longer validated loses production_eligible
    (checklist.recheck, audited).
    """
    node = checklist.lock_node(node_id)
    document = parse(inspect_text)
    seen = project(document)
    results = checks(seen, _release_image(node_id))
    failed = [result["check"] for result in results if not result["passed"]]
    # P2: what is kept (label values, mount sources, the image, what each check saw) is scrubbed of
    # the node's known secrets and anything secret-shaped, as the read-back is; where is said.
    evidence, removed = secrets_scan.scrub_evidence({"checks": results, "failed": failed, "container": seen}, node_id)
    evidence["removed"] = removed
    seen = evidence["container"]
    item = checklist.Item(
        checklist.CONTAINER_STATUS,
        checklist.TITLES[checklist.CONTAINER_STATUS],
        checklist.CONTRADICTED if failed else checklist.OBSERVED,
        utcnow(),
        "operator paste",
        (
            f"{seen['engine'].capitalize()} inspect of {seen['name'] or seen['id']}: failed " + ", ".join(failed) + "."
            if failed
            else f"{seen['engine'].capitalize()} inspect of {seen['name'] or seen['id']}: running, "
            f"{seen['restart_policy']}, read-only root, all capabilities dropped, no-new-privileges, "
            "no published ports, no container-engine socket"
            + (", the enrolled image." if results[-1]["applies"] else ".")
        ),
        evidence,
    )
    checklist.store(node_id, item, actor)
    checklist.capture_node_api_output(node_id)
    checklist.recheck(node, actor, [f"container_status failed {', '.join(failed)}"] if failed else [])
    db.session.commit()
    return item
