"""Deployments (S2): create, place, list, stop, and the node's reports of what it loaded.

A deployment is desired state for one node: the heartbeat reply hands the node its list whenever
`node_leases.deployments_version` moved (the etag, as storage roots do, J1), and the node reports
each deployment's state back (`report`). The operator's delete only asks for `stopping`; the node
confirms `stopped`. Every change of state is audited once (`deployment.*`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from app import audit
from app.errors import DomainError
from app.extensions import db
from app.jobs import artifacts, runtime
from app.models import Artifact, Deployment, DeploymentState, NodeLease
from app.serving import placement
from app.timeutil import utcnow

log = logging.getLogger(__name__)

TIERS = ("lab", "production")
DEFAULT_TIER = "lab"
# S2: what an operator may ask for. The context's default is the model's own, capped at the top.
CONTEXT_LENGTH = runtime.Bound(16, 8192, 8192)
N_GPU_LAYERS = runtime.N_GPU_LAYERS  # -1: every layer on the GPU, as runtime jobs say it
IDLE_UNLOAD_SECONDS = runtime.Bound(0, 7 * 86_400, 900)  # 0 keeps the model loaded

# What the node may report, and what it is then asked for: `desired` in the heartbeat's list.
REPORTED = ("loading", "ready", "unloaded", "failed", "stopped")
# Desired ready: the node is to load (or keep) these; stopping: to stop them and confirm.
_DESIRED_READY = (
    DeploymentState.PENDING,
    DeploymentState.LOADING,
    DeploymentState.READY,
    DeploymentState.UNLOADED,
    DeploymentState.FAILED,
)
_ACTIVE_STATES = (*_DESIRED_READY, DeploymentState.STOPPING)

# S2: the next step for each error code a node reports; any other code gets the last words.
NEXT_STEPS = {
    "MODEL_LOAD_FAILED": "Pick another model_file or acquire the model again, then create the deployment anew.",
    "RUNTIME_ENGINE_CRASHED": "llama.cpp died loading or running this model; pick another model_file or acquire "
    "the model again, then create the deployment anew.",
    "RUNTIME_WORKER_UNAVAILABLE": "Start the runtime worker on the node (its container, or `make run-worker`) and "
    "check that it shares the socket with the agent; the node loads the deployment once it answers.",
}
OTHER_FAILURE = "Check the node agent's and runtime worker's logs, then delete the deployment and create it again."


@dataclass(frozen=True)
class Request:
    """What an operator asks for; the bounds above are checked by the API's body before it gets here."""

    name: str
    artifact_id: str
    model_file: str
    node_id: str | None = None
    tier: str = DEFAULT_TIER
    context_length: int | None = None
    n_gpu_layers: int | None = None
    idle_unload_seconds: int = IDLE_UNLOAD_SECONDS.default


@dataclass(frozen=True)
class Report:
    """What a node says of one of its deployments (the agent's status body, field for field)."""

    state: str
    error_code: str | None = None
    error_message: str | None = None
    measured: dict[str, object] | None = None


def _changed(node_id: str) -> None:
    # S2: the heartbeat reply hands this counter to the agent as `deployments_etag` (as J1's roots).
    db.session.execute(
        sa.update(NodeLease)
        .where(NodeLease.node_id == node_id)
        .values(deployments_version=NodeLease.deployments_version + 1)
    )


def _audit(deployment: Deployment, action: str, actor: str, **details: object) -> None:
    audit.record(
        actor,
        f"deployment.{action}",
        deployment.node_id,
        deployment_id=deployment.id,
        name=deployment.name,
        **details,
    )


def _name_taken(name: str) -> DomainError:
    return DomainError(
        "DEPLOYMENT_NAME_TAKEN",
        f"A deployment that is not stopped is already named {name!r}; clients use the name as `model`.",
        "Pick another name, or delete that deployment and wait for it to stop.",
        field="name",
    )


def place(request: Request, artifact: Artifact, exclude_deployment: str | None = None) -> placement.Verdict:
    """S3: the node that will serve the request (named, or placed), or NO_NODE_FITS naming each node and why."""
    ask = placement.Ask(
        artifact=artifact,
        model_file=request.model_file,
        tier=request.tier,
        context_length=request.context_length,
        n_gpu_layers=request.n_gpu_layers,
        exclude_deployment=exclude_deployment,
    )
    return placement.choose(ask, request.node_id)


def _placement_record(chosen: placement.Verdict, named: bool) -> dict[str, object]:
    """What the deployment keeps of its placement: where, why, and the estimate (S3)."""
    return {
        "node_id": chosen.node_id,
        "why": ("named by the operator; " if named else "placed; ") + chosen.reason,
        "estimate": chosen.estimate.to_dict() if chosen.estimate else None,
        "raw_resident_bytes": chosen.raw_resident_bytes,
        "free_bytes": chosen.free_bytes,
    }


def create(request: Request, actor: str = audit.OPERATOR) -> Deployment:
    """Create a deployment in `pending` on its node; the node's next heartbeat reply lists it."""
    artifact = artifacts.get(request.artifact_id)
    artifacts.refuse_if_deleting(artifact)
    chosen = place(request, artifact)
    if db.session.scalar(
        sa.select(Deployment.id).where(Deployment.name == request.name, Deployment.state != DeploymentState.STOPPED)
    ):
        raise _name_taken(request.name)
    now = utcnow()
    deployment = Deployment(
        name=request.name,
        node_id=chosen.node_id,
        artifact_id=chosen.artifact_id or artifact.id,
        model_file=request.model_file,
        tier=request.tier,
        context_length=request.context_length,
        n_gpu_layers=request.n_gpu_layers,
        idle_unload_seconds=request.idle_unload_seconds,
        state=DeploymentState.PENDING,
        placement=_placement_record(chosen, request.node_id is not None),
        created_at=now,
        updated_at=now,
    )
    db.session.add(deployment)
    try:
        db.session.flush()
    except IntegrityError:  # another request took the name between the check and the insert
        db.session.rollback()
        raise _name_taken(request.name) from None
    _changed(chosen.node_id)
    _audit(
        deployment,
        "created",
        actor,
        artifact_id=deployment.artifact_id,
        model_file=request.model_file,
        tier=request.tier,
    )
    db.session.commit()
    return deployment


def _not_found(deployment_id: str) -> DomainError:
    return DomainError(
        "DEPLOYMENT_NOT_FOUND",
        f"No deployment has id {deployment_id!r}.",
        "List deployments with GET /api/v1/admin/deployments.",
    )


def get(deployment_id: str, lock: bool = False) -> Deployment:
    """The deployment with this id, or DEPLOYMENT_NOT_FOUND; `lock` holds its row until the commit."""
    deployment = db.session.get(Deployment, deployment_id, with_for_update=lock or None)
    if deployment is None:
        raise _not_found(deployment_id)
    return deployment


def serving(name: str) -> Deployment:
    """S4: the deployment a client names as `model`, ready to generate; 404 `model_not_found` when
    no deployment that is not stopped has the name, 503 DEPLOYMENT_NOT_READY while it loads or
    after it failed (with its error)."""
    deployment = db.session.scalars(
        sa.select(Deployment).where(
            Deployment.name == name,
            Deployment.state.not_in([str(DeploymentState.STOPPING), str(DeploymentState.STOPPED)]),
        )
    ).first()
    if deployment is None:
        raise DomainError(
            "model_not_found",
            f"No model is deployed under the name {name[:200]!r}.",
            "GET /v1/models lists the names; an operator deploys a model on the console's Deployments page.",
            param="model",
        )
    # S2: an unloaded model, or one loading again after it was unloaded, is loaded for this request
    # while the client waits (keep-alive comments); only a first load or a failure refuses.
    reloading = deployment.state == DeploymentState.LOADING and deployment.measured is not None
    if deployment.state not in (DeploymentState.READY, DeploymentState.UNLOADED) and not reloading:
        why = f": {deployment.error_message}" if deployment.state == DeploymentState.FAILED else ""
        raise DomainError(
            "DEPLOYMENT_NOT_READY",
            f"The model {name!r} is {deployment.state}{why}.",
            deployment.error_next_step or "Retry when its deployment is ready (the console's Deployments page).",
        )
    return deployment


@dataclass(frozen=True)
class Served:
    """One answered request, as app/serving/answers.py saw it (S2)."""

    generated_tokens: int
    time_to_first_token_seconds: float | None
    tokens_per_second: float | None


def note_served(deployment_id: str, served: Served) -> None:
    """Count an answered request and keep its figures; the row is locked so that requests ending
    together each count. Never raises: a client's answer is not failed by its bookkeeping."""
    try:
        deployment = db.session.get(Deployment, deployment_id, with_for_update=True)
        if deployment is None:
            db.session.rollback()
            return
        before = deployment.served or {}
        deployment.served = {
            "requests": int(before.get("requests", 0)) + 1,
            "generated_tokens": int(before.get("generated_tokens", 0)) + served.generated_tokens,
            "time_to_first_token_seconds": served.time_to_first_token_seconds,
            "tokens_per_second": served.tokens_per_second,
        }
        deployment.last_request_at = utcnow()
        db.session.commit()
    except SQLAlchemyError:
        db.session.rollback()
        log.warning("deployment %s: its request could not be counted (database busy)", deployment_id)


def list_all(node_id: str | None = None) -> list[Deployment]:
    """Deployments newest first, stopped ones too (their history), optionally one node's."""
    query = sa.select(Deployment).order_by(Deployment.created_at.desc(), Deployment.id.desc())
    if node_id is not None:
        query = query.where(Deployment.node_id == node_id)
    return list(db.session.scalars(query))


def delete(deployment_id: str, actor: str = audit.OPERATOR) -> Deployment:
    """Ask the node to stop it (`stopping`); one already stopping or stopped comes back unchanged."""
    deployment = get(deployment_id, lock=True)
    if deployment.state in (DeploymentState.STOPPING, DeploymentState.STOPPED):
        db.session.rollback()
        return get(deployment_id)
    previous = deployment.state
    deployment.state = DeploymentState.STOPPING
    deployment.updated_at = utcnow()
    _changed(deployment.node_id)
    _audit(deployment, "stopping", actor, previous=previous)
    db.session.commit()
    return deployment


def _not_movable(deployment: Deployment) -> DomainError:
    return DomainError(
        "DEPLOYMENT_NOT_MOVABLE",
        f"The deployment {deployment.name!r} is {deployment.state}; only one that is not stopping or stopped moves.",
        "Create a new deployment instead.",
    )


def move(deployment_id: str, node_id: str | None = None, actor: str = audit.OPERATOR) -> Deployment:
    """S3: serve the deployment from another node (a draining one's, before maintenance): placed by
    the same rules on any node but its own (or on the named one), pending there; its old node no
    longer lists it, so its agent frees the model. Its name, settings and history stay with it."""
    deployment = get(deployment_id, lock=True)
    if deployment.state in (DeploymentState.STOPPING, DeploymentState.STOPPED):
        db.session.rollback()
        raise _not_movable(deployment)
    if node_id == deployment.node_id:
        db.session.rollback()
        raise DomainError(
            "DEPLOYMENT_NOT_MOVABLE",
            f"The deployment {deployment.name!r} is already on node {node_id}.",
            "Name another node, or leave node_id out to place it on the best other node.",
            field="node_id",
        )
    request = Request(
        name=deployment.name,
        artifact_id=deployment.artifact_id,
        model_file=deployment.model_file,
        node_id=node_id,
        tier=deployment.tier,
        context_length=deployment.context_length,
        n_gpu_layers=deployment.n_gpu_layers,
        idle_unload_seconds=deployment.idle_unload_seconds,
    )
    ask = placement.Ask(
        artifact=artifacts.get(deployment.artifact_id),
        model_file=deployment.model_file,
        tier=deployment.tier,
        context_length=deployment.context_length,
        n_gpu_layers=deployment.n_gpu_layers,
        exclude_deployment=deployment.id,
        exclude_node=deployment.node_id,
    )
    try:
        chosen = placement.choose(ask, node_id)
    except DomainError:
        db.session.rollback()
        raise
    previous_node, previous_state = deployment.node_id, deployment.state
    deployment.node_id = chosen.node_id
    deployment.artifact_id = chosen.artifact_id or deployment.artifact_id
    deployment.state = DeploymentState.PENDING
    deployment.placement = _placement_record(chosen, request.node_id is not None)
    deployment.measured = deployment.ready_at = None
    deployment.error_code = deployment.error_message = deployment.error_next_step = None
    deployment.updated_at = utcnow()
    _changed(previous_node)  # it leaves the old node's list: its agent stops it there
    _changed(chosen.node_id)
    _audit(deployment, "moved", actor, previous=previous_state, from_node_id=previous_node)
    db.session.commit()
    return deployment


def agent_view(node_id: str) -> list[dict[str, object]]:
    """S2: the node's deployments as its agent is told them: what to load (ready) and what to stop."""
    rows = db.session.execute(
        sa.select(Deployment, Artifact.container_path)
        .join(Artifact, Artifact.id == Deployment.artifact_id)
        .where(Deployment.node_id == node_id, Deployment.state.in_([str(state) for state in _ACTIVE_STATES]))
        .order_by(Deployment.created_at, Deployment.id)
    )
    return [
        {
            "id": deployment.id,
            "name": deployment.name,
            "desired": "stopped" if deployment.state == DeploymentState.STOPPING else "ready",
            "container_path": container_path,
            "model_file": deployment.model_file,
            "context_length": deployment.context_length,
            "n_gpu_layers": deployment.n_gpu_layers,
            "idle_unload_seconds": deployment.idle_unload_seconds,
        }
        for deployment, container_path in rows
    ]


def _next_state(current: str, reported: str) -> str:
    """S2: where a node's report takes a deployment; the operator's stop always wins."""
    if current == DeploymentState.STOPPED:
        return current  # history: nothing a node says brings it back
    if current == DeploymentState.STOPPING:
        return DeploymentState.STOPPED if reported == "stopped" else current  # the node will stop it
    if reported == "stopped":
        return current  # still wanted: the node is to load it again, and says so with `loading`
    return reported


def report(node_id: str, deployment_id: str, sent: Report) -> Deployment:
    """Apply a node's report on one of its own deployments; the same report twice changes nothing.

    Another node's deployment is not found, exactly as an unknown id: a node learns nothing of the
    others'.
    """
    deployment = db.session.get(Deployment, deployment_id, with_for_update=True)
    if deployment is None or deployment.node_id != node_id:
        raise _not_found(deployment_id)
    state = _next_state(deployment.state, sent.state)
    if state == deployment.state:
        db.session.rollback()
        return get(deployment_id)
    now = utcnow()
    actor = audit.agent_actor(node_id)
    details: dict[str, object] = {"previous": deployment.state}
    deployment.state = state
    deployment.updated_at = now
    if state == DeploymentState.READY:
        deployment.ready_at = now
        deployment.measured = sent.measured
        deployment.error_code = deployment.error_message = deployment.error_next_step = None
    elif state == DeploymentState.LOADING:
        deployment.ready_at = None
    elif state == DeploymentState.FAILED:
        deployment.ready_at = None
        deployment.error_code = sent.error_code or "DEPLOYMENT_FAILED"
        deployment.error_message = sent.error_message or "The node reported the deployment failed without a reason."
        deployment.error_next_step = NEXT_STEPS.get(deployment.error_code, OTHER_FAILURE)
        details["error_code"] = deployment.error_code
    elif state == DeploymentState.STOPPED:
        deployment.ready_at = None
        _changed(node_id)  # it leaves the node's list
    _audit(deployment, state, actor, **details)
    db.session.commit()
    return deployment
