"""S3: which node serves a deployment, or why none can.

Every node is judged, in this order, and the first rule it fails is its reason:

1. it may receive work: online, enabled, not draining, a compatible agent (liveness.may_receive_work);
2. it is eligible for the tier: `lab` needs `lab_eligible`, `production` needs `production_eligible`,
   named node or not;
3. its runtime worker answers and is compatible (W1);
4. it holds the model: an artifact of the same repository at the same commit, not being deleted,
   with the model file in it;
5. the model fits: the estimate's peak (app/serving/estimate.py, corrected by the node's history)
   against what it has free — for a CUDA worker each GPU's memory less its latest fresh reading and
   what deployments still loading will take; for a CPU worker its memory (the cgroup's limit where
   there is one) less what its other deployments hold.

Of the nodes that pass, the preference is documented and fixed: one that already serves this very
model (its weights are in the page cache and shared), then the most memory left after placement.
A named node is judged by the same rules and is the only candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import sqlalchemy as sa

from app.config import current_settings
from app.console.formatting import human_bytes
from app.errors import DomainError
from app.extensions import db
from app.jobs import artifacts
from app.jobs.runtime import COMPATIBLE
from app.models import Artifact, Deployment, DeploymentState, Gpu, Node, NodeInventory, NodeLease
from app.models.telemetry import TelemetrySample
from app.nodes import get as get_node
from app.nodes import node_name, refuse_if_draining
from app.nodes.liveness import may_receive_work
from app.serving import estimate as estimates
from app.timeutil import utcnow

ELIGIBILITY = {"lab": "lab_eligible", "production": "production_eligible"}
# Deployments that hold (or will take back) their memory on a node; an unloaded one reloads on demand.
_HOLDING = (
    DeploymentState.PENDING,
    DeploymentState.LOADING,
    DeploymentState.READY,
    DeploymentState.UNLOADED,
    DeploymentState.STOPPING,
)


def gib(size: int) -> str:
    """A size in a reason, in the console's units (57.0 MiB, 15.2 GiB)."""
    return human_bytes(size)


@dataclass(frozen=True)
class Ask:
    """What is to be placed: the model (as one artifact names it) and how it is to be loaded."""

    artifact: Artifact
    model_file: str
    tier: str
    context_length: int | None
    n_gpu_layers: int | None
    exclude_deployment: str | None = None  # a deployment being moved does not count against its node
    exclude_node: str | None = None  # ... and does not go back to the node it leaves


@dataclass
class Verdict:
    """One node judged: whether the model fits there and why (or why not)."""

    node_id: str
    name: str
    fits: bool = False
    reason: str = ""
    artifact_id: str | None = None
    estimate: estimates.Estimate | None = None
    raw_resident_bytes: int | None = None
    free_bytes: int | None = None
    serves_model: bool = False
    gpu: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    def left_after(self) -> int:
        return (self.free_bytes or 0) - (self.estimate.peak_bytes if self.estimate else 0)

    def to_dict(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "name": self.name,
            "fits": self.fits,
            "reason": self.reason,
            "artifact_id": self.artifact_id,
            "needs_bytes": self.estimate.peak_bytes if self.estimate else None,
            "free_bytes": self.free_bytes,
        }


def _facts(artifact: Artifact, model_file: str) -> dict[str, object] | None:
    models = artifact.models if isinstance(artifact.models, dict) else None
    facts = models.get(model_file) if models else None
    return facts if isinstance(facts, dict) else None


def _backend(lease: NodeLease | None) -> tuple[str | None, list[dict]]:
    """The worker's backend ("cpu" or "cuda") and its devices, as it reported them (W1)."""
    reported = lease.runtime_worker if lease is not None and isinstance(lease.runtime_worker, dict) else {}
    engines = [engine for engine in reported.get("engines") or [] if isinstance(engine, dict)]
    backend = next((str(engine.get("backend") or "cpu").lower() for engine in engines), None)
    devices = [device for device in reported.get("devices") or [] if isinstance(device, dict)]
    return backend, devices


def _held_by_deployments(node_id: str, ask: Ask) -> tuple[int, list[Deployment]]:
    """What the node's other deployments hold in memory (measured once loaded, else their estimate),
    and those still on their way to loading."""
    held, loading = 0, []
    for deployment in db.session.scalars(
        sa.select(Deployment).where(
            Deployment.node_id == node_id, Deployment.state.in_([str(state) for state in _HOLDING])
        )
    ):
        if deployment.id == ask.exclude_deployment:
            continue
        planned = (deployment.placement or {}).get("estimate") or {}
        measured = (deployment.measured or {}).get("memory_bytes")
        compute = int(planned.get("peak_bytes", 0)) - int(planned.get("resident_bytes", 0))
        if deployment.state in (DeploymentState.PENDING, DeploymentState.LOADING) and not measured:
            loading.append(deployment)
        held += int(measured) + max(compute, 0) if measured else int(planned.get("peak_bytes", 0))
    return held, loading


def _history(node_id: str, on_gpu: bool) -> tuple[float, int]:
    """The node's past (raw estimate, measured) pairs, newest first, into a correction."""
    pairs = []
    for placement, measured in db.session.execute(
        sa.select(Deployment.placement, Deployment.measured)
        .where(Deployment.node_id == node_id, Deployment.measured.is_not(None))
        .order_by(Deployment.ready_at.desc().nullslast(), Deployment.created_at.desc())
        .limit(estimates.CORRECTION_HISTORY * 4)
    ):
        planned = (placement or {}).get("estimate") or {}
        raw = (placement or {}).get("raw_resident_bytes")
        memory = (measured or {}).get("memory_bytes")
        if raw and memory and bool(planned.get("on_gpu")) == on_gpu:
            pairs.append((int(raw), int(memory)))
    return estimates.correction_from(pairs)


def _gpu_free(node_id: str, devices: list[dict], settings) -> list[int] | str:
    """Each of the worker's GPUs' free memory from its latest reading, or why it is not known."""
    fresh_after = utcnow() - timedelta(seconds=settings.node_stale_after_seconds)
    free = []
    for device in devices:
        row = db.session.execute(
            sa.select(Gpu.memory_total_bytes, TelemetrySample.memory_used_bytes, TelemetrySample.sampled_at)
            .join(TelemetrySample, TelemetrySample.gpu_id == Gpu.id)
            .where(Gpu.node_id == node_id, Gpu.uuid == str(device.get("uuid")))
            .order_by(TelemetrySample.sampled_at.desc())
            .limit(1)
        ).one_or_none()
        total = (row.memory_total_bytes if row else None) or device.get("memory_total_bytes")
        if row is None or row.memory_used_bytes is None or total is None or row.sampled_at < fresh_after:
            return f"no fresh memory reading for GPU {str(device.get('uuid'))[:40]}"
        free.append(max(int(total) - int(row.memory_used_bytes), 0))
    return free


def judge(node: Node, lease: NodeLease | None, held: Artifact | None, deleting: bool, ask: Ask, settings) -> Verdict:
    """One node against every rule, the first it fails its reason."""
    verdict = Verdict(node_id=node.id, name=node_name(node))
    allowed, why = may_receive_work(node.id, settings)
    if not allowed:
        verdict.reason = why
        return verdict
    flag = ELIGIBILITY[ask.tier]
    if not getattr(node, flag):
        verdict.reason = f"not eligible for the {ask.tier} tier ({flag} is false)"
        return verdict
    if lease is None or lease.worker_compatibility != COMPATIBLE:
        verdict.reason = "no compatible runtime worker answers on the node"
        return verdict
    if held is None and deleting:
        verdict.reason = f"its copy of {ask.artifact.repo_id} is being deleted"
        return verdict
    if held is None:
        verdict.reason = f"does not hold {ask.artifact.repo_id} at {ask.artifact.commit[:12]}"
        return verdict
    verdict.artifact_id = held.id
    if held.models is not None and ask.model_file not in held.models:
        verdict.reason = f"its artifact has no GGUF file {ask.model_file!r}"
        return verdict
    if not fit(verdict, node, lease, held, ask, settings):
        return verdict
    verdict.serves_model = (
        db.session.scalar(
            sa.select(sa.func.count())
            .select_from(Deployment)
            .where(
                Deployment.node_id == node.id,
                Deployment.artifact_id == held.id,
                Deployment.model_file == ask.model_file,
                Deployment.state == DeploymentState.READY,
            )
        )
        > 0
    )
    verdict.reason += ", already serves this model" if verdict.serves_model else ""
    return verdict


def fit(verdict: Verdict, node: Node, lease: NodeLease | None, held: Artifact, ask: Ask, settings) -> bool:
    """Rule 5 on its own: whether the model fits the node's memory, the estimate and the figures
    set on `verdict` and, when it does not, its reason (runtime jobs ask it too)."""
    facts = _facts(held, ask.model_file)
    backend, devices = _backend(lease)
    verdict.gpu = backend not in (None, "cpu") and bool(devices) and ask.n_gpu_layers != 0
    gpu_free: list[int] | None = None
    if verdict.gpu:
        measured_free = _gpu_free(node.id, devices, settings)
        if isinstance(measured_free, str):
            verdict.reason = measured_free
            return False
        gpu_free = measured_free
    try:
        raw = estimates.estimate(facts, ask.context_length, ask.n_gpu_layers, gpu_free)
    except estimates.NotEstimable as error:
        verdict.reason = f"no estimate: {error}"
        return False
    correction, based_on = _history(node.id, verdict.gpu)
    verdict.estimate = estimates.corrected(raw, correction, based_on)
    verdict.raw_resident_bytes = raw.resident_bytes
    held_bytes, loading = _held_by_deployments(node.id, ask)
    if verdict.gpu:
        pending = sum(int(((d.placement or {}).get("estimate") or {}).get("peak_bytes", 0)) for d in loading)
        free_each = list(gpu_free or [])
        free_each[0] -= pending
        verdict.free_bytes = sum(free_each)
        short = [
            index
            for index, (need, free) in enumerate(zip(verdict.estimate.per_gpu_bytes, free_each, strict=True))
            if need > free
        ]
        if short:
            index = short[0]
            verdict.reason = (
                f"needs {gib(verdict.estimate.per_gpu_bytes[index])} on GPU {index}, which has "
                f"{gib(max(free_each[index], 0))} free"
            )
            return False
    else:
        facts_row = db.session.get(NodeInventory, node.id)
        total = (facts_row.facts or {}).get("memory_total_bytes") if facts_row else None
        if not isinstance(total, int) or total <= 0:
            verdict.reason = "its memory is unknown (no inventory)"
            return False
        verdict.free_bytes = total - held_bytes
        if verdict.estimate.peak_bytes > verdict.free_bytes:
            verdict.reason = f"needs {gib(verdict.estimate.peak_bytes)}, has {gib(max(verdict.free_bytes, 0))} free"
            return False
    verdict.fits = True
    verdict.reason = f"fits: needs {gib(verdict.estimate.peak_bytes)} of {gib(verdict.free_bytes or 0)} free"
    return True


def judge_all(ask: Ask, node_id: str | None = None) -> list[Verdict]:
    """Every node (or only the named one) judged, the best first: fitting nodes by preference, then
    the rest by name."""
    settings = current_settings()
    copies = artifacts.copies_of(ask.artifact.repo_type, ask.artifact.repo_id, ask.artifact.commit)
    query = sa.select(Node, NodeLease).outerjoin(NodeLease, NodeLease.node_id == Node.id).order_by(Node.id)
    if node_id is not None:
        query = query.where(Node.id == node_id)
    if ask.exclude_node is not None:
        query = query.where(Node.id != ask.exclude_node)
    verdicts = [
        judge(node, lease, copies.held.get(node.id), node.id in copies.deleting, ask, settings)
        for node, lease in db.session.execute(query)
    ]
    return sorted(verdicts, key=lambda v: (not v.fits, not v.serves_model, -v.left_after(), v.name, v.node_id))


def no_node_fits(ask: Ask, verdicts: list[Verdict], node_id: str | None) -> DomainError:
    reasons = "; ".join(f"{verdict.name}: {verdict.reason}" for verdict in verdicts) or "no node is enrolled"
    where = f"Node {node_id}" if node_id else "No node"
    return DomainError(
        "NO_NODE_FITS",
        f"{where} can serve {ask.artifact.repo_id} ({ask.model_file}) in the {ask.tier} tier — {reasons}.",
        "Fix what a node's reason says (bring it online, undrain it, set its eligibility, acquire the model onto it, "
        "or free memory), or ask for a shorter context_length.",
        field="node_id" if node_id else "artifact_id",
        nodes=[verdict.to_dict() for verdict in verdicts],
    )


def choose(ask: Ask, node_id: str | None = None) -> Verdict:
    """The node that will serve `ask` (named or placed), or NO_NODE_FITS naming every node and why."""
    if node_id is not None:
        refuse_if_draining(get_node(node_id))  # NODE_NOT_FOUND, NODE_DRAINING: as a job naming it is told
    verdicts = judge_all(ask, node_id)
    if verdicts and verdicts[0].fits:
        return verdicts[0]
    raise no_node_fits(ask, verdicts, node_id)
