"""Agent API (A1, A2, A5): enrol, inventory, heartbeat. Outbound from the node only (P1)."""

from __future__ import annotations

from typing import NamedTuple

from flask import current_app

from app.api import bodies, bp, json_response, operations, replies
from app.api.auth import NODE_SCHEME, authenticate_publisher, bearer_credential
from app.api.errors import ApiError, error_response
from app.api.validation import invalid, json_object
from app.config import current_settings, normalize_origin
from app.extensions import db
from app.jobs import storage
from app.nodes import enrollment, publishing, rate_limits
from app.nodes.compat import COMPATIBLE, compatibility
from app.timeutil import utcnow


def versions_of(data: dict[str, object]) -> tuple[publishing.Versions, dict[str, object]]:
    """The request's versions and its compatibility answer (A1); a bad agent_version is a 400 first."""
    protocol_version = data.get("protocol_version")
    answer = compatibility(protocol_version)
    versions = publishing.Versions(
        agent_version=bodies.parse(bodies.AgentVersion, data).agent_version,
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
            "heartbeat_interval_seconds": current_settings().heartbeat_interval_seconds,
        },
        http_status,
    )


def refuse_if_incompatible(versions: publishing.Versions, answer: dict[str, object]) -> None:
    """A1: refuse an incompatible agent before reading its body further; its node remembers why."""
    if answer["answer"] != COMPATIBLE:
        publisher = publishing.authenticate(bearer_credential())
        publishing.note_versions(publisher.node_id, versions)
        raise _incompatible(answer)


class AgentRequest(NamedTuple):
    """An enrolled agent's request, read in the one order every agent endpoint keeps (A1, A5)."""

    versions: publishing.Versions
    answer: dict[str, object]
    body: bodies.Body
    publisher: publishing.Publisher


def agent_request(model: type[bodies.Body]) -> AgentRequest:
    """Versions first (426 for another protocol), then the whole body (400), authentication last.

    Validated first, authenticated last: on SQLite the write transaction, and its lock, starts with
    the credential lookup, so a bad body never queues behind other writers.
    """
    data = json_object()
    versions, answer = versions_of(data)
    refuse_if_incompatible(versions, answer)
    body = bodies.parse(model, data)
    return AgentRequest(versions, answer, body, authenticate_publisher(body))


@bp.errorhandler(rate_limits.NodeRateLimited)
def _rate_limited(error: rate_limits.NodeRateLimited):
    """429 in the one error shape, with Retry-After in whole seconds (A2, P5); nothing was stored."""
    db.session.rollback()
    response = error_response(429, error.code, error.message, error.next_step, **error.extra)
    response.headers["Retry-After"] = str(error.retry_after)
    return response


@operations.post(
    "/agent/enroll",
    "Claim an enrolment token once; returns the node credential once (E2)",
    description="A token is single use. One exception makes a lost reply harmless: the same node_id retrying "
    "the same token before it expires, while the credential that claim issued has never been presented, gets "
    "a fresh credential and the unused one is revoked (audited as credential.reissued). Any other second "
    "claim is refused as before (409 ENROLLMENT_TOKEN_CONSUMED).",
    body=bodies.EnrollRequest,
    replies={201: (replies.Enrolled, "Enrolled")},
    errors=(400, 401, 409, 410, 413, 415, 426),
)
def enroll():
    """Claim an enrolment token exactly once and receive the node credential (E2, E3, I2, I4)."""
    data = json_object()
    versions, answer = versions_of(data)
    if answer["answer"] != COMPATIBLE:
        raise _incompatible(answer)  # the token is not spent on an agent that cannot talk to us
    body = bodies.parse(bodies.EnrollRequest, data)
    origin = normalize_origin(body.control_plane_url)
    if origin is None:  # the body's pattern admits only URLs with an origin; kept as the last word
        raise invalid("control_plane_url", "must be an http(s) URL")
    result = enrollment.claim(
        enrollment.Claim(
            token=body.enrollment_token,
            node_id=body.node_id,
            hostname=body.hostname,
            origin=origin,
            agent_version=versions.agent_version,
            protocol_version=versions.protocol_version,
            compatibility=versions.compatibility,
        )
    )
    what = "re-issued its never-used credential (a lost reply's retry)" if result.reissued else "enrolled"
    current_app.logger.info("node %s %s (enrolment %s)", body.node_id, what, result.enrollment.id)
    return _reply(
        answer,
        201,
        status="enrolled",
        node_id=result.node.id,
        credential=result.credential_secret,
        display_name=result.node.display_name,
        enrollment_id=result.enrollment.id,
    )


@operations.post(
    "/agent/inventory",
    "Publish the node's inventory (N4)",
    security=(NODE_SCHEME,),
    body=bodies.InventoryRequest,
    replies={200: (replies.Accepted, "Stored")},
    errors=(400, 401, 403, 413, 415, 426, 429),
)
def inventory():
    """Store the node's latest inventory (N4)."""
    versions, answer, body, publisher = agent_request(bodies.InventoryRequest)
    rate_limits.admit_inventory(db.session.connection(), publisher.node_id, utcnow())
    gpus = [gpu.model_dump() for gpu in body.inventory.gpus]
    stored_facts = body.inventory.model_dump(exclude={"gpus"}, exclude_unset=True)
    worker = publishing.WorkerReport(
        facts=body.runtime_worker.model_dump() if body.runtime_worker else None,
        problem=body.runtime_worker_problem,
    )
    counts = publishing.record_inventory(publisher, versions, stored_facts, gpus, body.capabilities, worker)
    return _reply(answer, status="accepted", node_id=publisher.node_id, **counts)


@operations.post(
    "/agent/heartbeat",
    "Publish health and telemetry; the reply carries the next interval (A2)",
    security=(NODE_SCHEME,),
    body=bodies.HeartbeatRequest,
    replies={
        200: (
            replies.HeartbeatAccepted,
            "Recorded; `storage_roots` (J1) and `deployments` (S2) each only when the agent's etag is out of date",
        )
    },
    errors=(400, 401, 403, 413, 415, 426, 429),
)
def heartbeat():
    """Record liveness, health and telemetry; the reply carries the next interval (A2, L2)."""
    versions, answer, body, publisher = agent_request(bodies.HeartbeatRequest)
    samples = [sample.__dict__ for sample in body.telemetry]  # sampled_at is already a datetime
    observations = [
        storage.Observation(**{**seen.__dict__, "usage": seen.usage.model_dump() if seen.usage else None})
        for seen in body.storage_roots
    ]
    quarantine = body.quarantine_usage.model_dump() if body.quarantine_usage else None
    beat = publishing.record_heartbeat(
        publisher,
        versions,
        body.health.status,
        body.health.detail,
        samples,
        observations,
        body.storage_roots_etag,
        body.deployments_etag,
        quarantine,
    )
    roots = {} if beat.storage_roots is None else {"storage_roots": beat.storage_roots}
    if beat.deployments is not None:  # S2: only when the agent's copy is out of date
        roots["deployments"] = beat.deployments
    if beat.clock_warning is not None:  # issue 22: readings dropped or stale; the agent logs the words
        roots["clock_warning"] = beat.clock_warning.to_dict()
    if beat.finished_partial_jobs:  # J5: the agent removes these partial directories
        roots["finished_partial_jobs"] = beat.finished_partial_jobs
    return _reply(
        answer,
        status="accepted",
        node_status="online",
        node_id=publisher.node_id,
        jobs_waiting=beat.jobs_waiting,
        storage_roots_etag=beat.storage_roots_etag,
        deployments_etag=beat.deployments_etag,
        **roots,
    )
