"""Agent API (A1, A2, A5): enrol, inventory, heartbeat. Outbound from the node only (P1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flask import current_app

from app import enrollment, publishing
from app.api import bp, json_response, settings
from app.api.auth import bearer_credential
from app.api.errors import ApiError
from app.api.validation import Fields, invalid, json_object
from app.compat import COMPATIBLE, compatibility
from app.config import normalize_origin
from app.timeutil import parse_rfc3339, utcnow

MAX_GPUS = 64
MAX_CLOCK_AHEAD = timedelta(minutes=10)
EARLIEST_SAMPLE = datetime(2020, 1, 1, tzinfo=UTC)
HEALTH_STATES = ("ok", "degraded", "failing")
METRICS = ("utilization_gpu_percent", "memory_used_bytes", "temperature_c", "power_w")
GPU_FIELDS = ("name", "driver_version", "cuda_driver_version", "pci_bus_id")


def _versions(fields: Fields) -> tuple[publishing.Versions, dict[str, object]]:
    """The request's versions and its compatibility answer (A1)."""
    protocol_version = fields.data.get("protocol_version")
    answer = compatibility(protocol_version)
    agent_version = fields.string("agent_version", max_length=64)
    versions = publishing.Versions(
        agent_version=agent_version,
        protocol_version=protocol_version if answer["answer"] != "UNKNOWN" else None,
        compatibility=answer["answer"],
    )
    return versions, answer


def _incompatible(answer: dict[str, object]) -> ApiError:
    """A1: refuse with 426 and the compatibility answer in the body."""
    return ApiError(
        426,
        "PROTOCOL_INCOMPATIBLE",
        f"This control plane speaks agent protocol {answer['supported']}; the agent sent "
        f"{answer['protocol_version']!r} ({answer['answer']}).",
        str(answer["action"]),
        compatibility=answer,
    )


def _reply(answer: dict[str, object], http_status: int = 200, **payload: object):
    return json_response(
        {
            **payload,
            "compatibility": answer,
            "heartbeat_interval_seconds": settings().heartbeat_interval_seconds,
        },
        http_status,
    )


def _refuse_if_incompatible(versions: publishing.Versions, answer: dict[str, object]) -> None:
    """A1: refuse an incompatible agent before reading its body further; its node remembers why."""
    if answer["answer"] != COMPATIBLE:
        publisher = publishing.authenticate(bearer_credential())
        publishing.note_versions(publisher.node_id, versions)
        raise _incompatible(answer)


@bp.post("/agent/enroll")
def enroll():
    """Claim an enrolment token exactly once and receive the node credential (E2, E3, I2, I4)."""
    fields = Fields(json_object())
    versions, answer = _versions(fields)
    if answer["answer"] != COMPATIBLE:
        raise _incompatible(answer)  # the token is not spent on an agent that cannot talk to us
    token = fields.string("enrollment_token", max_length=200)
    node_id = fields.uuid("node_id")
    hostname = fields.string("hostname", max_length=255)
    control_plane_url = fields.string("control_plane_url", max_length=2000)
    fields.string("display_name", required=False)
    origin = normalize_origin(control_plane_url)
    if origin is None:
        raise invalid("control_plane_url", "must be an http(s) URL")
    result = enrollment.claim(
        enrollment.Claim(
            token=token,
            node_id=node_id,
            hostname=hostname,
            origin=origin,
            agent_version=versions.agent_version,
            protocol_version=versions.protocol_version,
            compatibility=versions.compatibility,
        )
    )
    current_app.logger.info("node %s enrolled (enrolment %s)", node_id, result.enrollment.id)
    return _reply(
        answer,
        201,
        status="enrolled",
        node_id=result.node.id,
        credential=result.credential_secret,
        display_name=result.node.display_name,
        enrollment_id=result.enrollment.id,
    )


def _gpu(fields: Fields, index: int, value: object) -> dict[str, object]:
    gpu = fields.item("gpus", index, value)
    parsed: dict[str, object] = {"uuid": gpu.string("uuid", max_length=96)}
    for key in GPU_FIELDS:
        parsed[key] = gpu.string(key, required=False, max_length=200)
    parsed["memory_total_bytes"] = gpu.integer("memory_total_bytes", required=False, minimum=0, maximum=2**62)
    return parsed


@bp.post("/agent/inventory")
def inventory():
    """Store the node's latest inventory (N4)."""
    fields = Fields(json_object())
    versions, answer = _versions(fields)
    _refuse_if_incompatible(versions, answer)
    facts = fields.obj("inventory")
    facts.string("hostname", required=False, max_length=255)
    gpus = [_gpu(facts, index, value) for index, value in enumerate(facts.array("gpus", max_items=MAX_GPUS))]
    if len({gpu["uuid"] for gpu in gpus}) != len(gpus):
        raise invalid("inventory.gpus", "lists one GPU UUID twice")
    stored_facts = {key: value for key, value in facts.data.items() if key != "gpus"}
    # Validated first, authenticated last: the write transaction (and its lock) starts here.
    publisher = publishing.authenticate(bearer_credential())
    counts = publishing.record_inventory(publisher, versions, stored_facts, gpus)
    return _reply(answer, status="accepted", node_id=publisher.node_id, **counts)


def _sample(fields: Fields, index: int, value: object) -> dict[str, object]:
    sample = fields.item("telemetry", index, value)
    for metric in METRICS:
        # P3: an unreadable metric is sent as null, never left out or made up.
        if metric not in sample.data:
            raise invalid(sample.name(metric), "is required (send null when NVML cannot read it)")
    sampled_at_text = sample.string("sampled_at", max_length=64)
    sampled_at = parse_rfc3339(sampled_at_text)
    if sampled_at is None:
        raise invalid(sample.name("sampled_at"), "must be an RFC 3339 time with an offset")
    if not EARLIEST_SAMPLE <= sampled_at <= utcnow() + MAX_CLOCK_AHEAD:
        # A sample from the far future would stay the "latest" one forever (R1, P3).
        raise invalid(
            sample.name("sampled_at"),
            f"is outside the accepted range (after 2020, at most {MAX_CLOCK_AHEAD.seconds // 60} minutes ahead "
            "of the control plane's clock); check the node's clock",
        )
    return {
        "gpu_uuid": sample.string("gpu_uuid", max_length=96),
        "sampled_at": sampled_at,
        "utilization_gpu_percent": sample.number("utilization_gpu_percent", minimum=0, maximum=100),
        "memory_used_bytes": sample.integer("memory_used_bytes", required=False, minimum=0, maximum=2**62),
        "temperature_c": sample.number("temperature_c", minimum=-100, maximum=200),
        "power_w": sample.number("power_w", minimum=0, maximum=100_000),
    }


@bp.post("/agent/heartbeat")
def heartbeat():
    """Record liveness, health and telemetry; the reply carries the next interval (A2, L2)."""
    fields = Fields(json_object())
    versions, answer = _versions(fields)
    _refuse_if_incompatible(versions, answer)
    health = fields.obj("health")
    health_status = health.string("status", max_length=16)
    if health_status not in HEALTH_STATES:
        raise invalid(health.name("status"), "must be one of " + ", ".join(HEALTH_STATES))
    health_detail = health.string("detail", required=False, max_length=1000)
    samples = [
        _sample(fields, index, value)
        for index, value in enumerate(fields.array("telemetry", max_items=MAX_GPUS, required=False))
    ]
    # Validated first, authenticated last: the write transaction (and its lock) starts here.
    publisher = publishing.authenticate(bearer_credential())
    publishing.record_heartbeat(publisher, versions, health_status, health_detail, samples)
    return _reply(answer, status="accepted", node_status="online", node_id=publisher.node_id)
