"""S3: a benchmark without a node runs on every benchmark-eligible node that holds the model, and
the runs of one model are read back side by side, node by node.

"The same model" on another node is a copy of it: an artifact of the same repository (type and id)
at the same commit. `fan_out` queues one runtime.benchmark.v1 job on each node that qualifies, on
that node's own copy; every other node is named with the first rule it fails, in this order:

1. it is benchmark-eligible (`benchmark_eligible`) — the operator's choice, asked first, so a fleet
   of thousands costs a liveness query per eligible node only;
2. it may receive work: online, enabled, not draining, a compatible agent (liveness.may_receive_work, L4);
3. it runs the type: a compatible runtime worker answers (W1) and its agent advertises it (J2);
4. it holds the model: a copy not being deleted (J5), with the model file in it where the acquire
   read the copy's GGUF files (S3).

With no node left, `409 NO_NODE_FITS` names each node and why, and nothing is queued; otherwise
every job is queued in one transaction. The words of rules 2–4 are placement's (app/serving/placement.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa

from app.config import current_settings
from app.errors import DomainError
from app.extensions import db
from app.jobs import artifacts, queue, runtime
from app.models import Artifact, Gpu, Job, JobState, Node, NodeLease
from app.nodes import liveness, node_name
from app.nodes.compat import COMPATIBLE
from app.serving import placement

BENCHMARK = runtime.BENCHMARK
# The comparison reads at most this many of a model's runs, newest first.
RUNS_LIMIT = 1000


@dataclass(frozen=True)
class Considered:
    """One node judged for a fan-out: its own copy of the model, and why it is skipped (None: it is not)."""

    node_id: str
    name: str
    artifact_id: str | None
    reason: str | None

    def to_dict(self) -> dict[str, object]:
        """The node as the API names it (a fan-out's `skipped`, NO_NODE_FITS's `nodes`)."""
        return {"node_id": self.node_id, "name": self.name, "artifact_id": self.artifact_id, "reason": self.reason}


def _node_reason(node: Node, lease: NodeLease | None, settings) -> str | None:
    """Rules 1–3 (module docstring): the first the node fails, or None."""
    if not node.benchmark_eligible:
        return "not benchmark-eligible (benchmark_eligible is false)"
    allowed, why = liveness.may_receive_work(node.id, settings)
    if not allowed:
        return why
    if lease is None or lease.worker_compatibility != COMPATIBLE:
        return "no compatible runtime worker answers on the node"
    if not isinstance(lease.capabilities, list) or BENCHMARK not in lease.capabilities:
        return f"its agent does not advertise {BENCHMARK}"
    return None


def _copy_reason(node_id: str, copies: artifacts.Copies, model_file: str | None) -> str | None:
    """Rule 4: why the node holds no copy to run (None: it holds one, with the file where that is known)."""
    held = copies.held.get(node_id)
    if held is None:
        if node_id in copies.deleting:
            return f"its copy of {copies.repo_id} is being deleted"
        return f"does not hold {copies.repo_id} at {copies.commit[:12]}"
    if model_file is not None and isinstance(held.models, dict) and model_file not in held.models:
        return f"its copy has no GGUF file “{model_file}”"
    return None


def _fit_reason(
    node: Node, lease: NodeLease | None, copy: Artifact, model_file: str, params: dict, settings
) -> str | None:
    """Rule 5: the run's model at its context (prompt and generated tokens) fits the node's memory by
    the header's estimate, as a deployment's must (app/serving/placement.py). A copy without header
    facts (an older agent's) is not refused on a guess: measuring it is what a benchmark is for."""
    if not isinstance(copy.models, dict) or not isinstance(copy.models.get(model_file), dict):
        return None
    prompt = int(params.get("prompt_tokens") or runtime.PROMPT_TOKENS.default)
    generate = int(params.get("generate_tokens") or runtime.GENERATE_TOKENS.default)
    layers = params.get("n_gpu_layers", runtime.N_GPU_LAYERS.default)
    ask = placement.Ask(copy, model_file, tier="lab", context_length=prompt + generate, n_gpu_layers=layers)
    verdict = placement.Verdict(node.id, node_name(node))
    return None if placement.fit(verdict, node, lease, copy, ask, settings) else verdict.reason


def judge_all(copies: artifacts.Copies, model_file: str | None, params: dict | None = None) -> list[Considered]:
    """Every node judged for a benchmark of `model_file` of the model (None: no file asked), by name;
    with the run's `params`, whether it fits the node's memory too."""
    settings = current_settings()
    rows = db.session.execute(
        sa.select(Node, NodeLease)
        .outerjoin(NodeLease, NodeLease.node_id == Node.id)
        .order_by(Node.display_name, Node.hostname, Node.id)
    )
    considered = []
    for node, lease in rows:
        copy = copies.held.get(node.id)
        reason = _node_reason(node, lease, settings) or _copy_reason(node.id, copies, model_file)
        if reason is None and copy is not None and model_file is not None and params is not None:
            reason = _fit_reason(node, lease, copy, model_file, params, settings)
        considered.append(Considered(node.id, node_name(node), copy.id if copy else None, reason))
    return considered


def no_node_fits(model: Artifact, model_file: str, considered: list[Considered]) -> DomainError:
    """409 NO_NODE_FITS naming each node and why, as placement's (app/serving/placement.py)."""
    reasons = "; ".join(f"{each.name}: {each.reason}" for each in considered) or "no node is enrolled"
    return DomainError(
        "NO_NODE_FITS",
        f"No node can benchmark {model.repo_id} at {model.commit[:12]} ({model_file}) — {reasons}.",
        "Fix what a node's reason says (mark it benchmark-eligible, bring it online, enable or undrain it, start "
        "its runtime worker, or acquire the model onto it), or name one node with node_id.",
        field="node_id",
        nodes=[each.to_dict() for each in considered],
    )


@dataclass(frozen=True)
class FanOut:
    """What a benchmark without a node queued, and every node it skipped with why."""

    model: Artifact
    model_file: str
    jobs: list[Job]
    skipped: list[Considered]

    def to_dict(self) -> dict[str, object]:
        """The API's reply (replies.BenchmarkFanOut)."""
        return {
            "model": {
                "repo_id": self.model.repo_id,
                "repo_type": self.model.repo_type,
                "commit": self.model.commit,
                "model_file": self.model_file,
            },
            "jobs": [job.to_dict() for job in self.jobs],
            "skipped": [each.to_dict() for each in self.skipped],
        }


def fan_out(params: dict[str, object], max_attempts: int = queue.DEFAULT_MAX_ATTEMPTS) -> FanOut:
    """S3: one benchmark job on every node that qualifies, each on its own copy of the model that
    `params["artifact_id"]` names (any node's copy names it); NO_NODE_FITS when none does."""
    model = artifacts.get(str(params["artifact_id"]))
    model_file = str(params["model_file"])
    considered = judge_all(artifacts.copies_of(model.repo_type, model.repo_id, model.commit), model_file, params)
    taking = [each for each in considered if each.reason is None]
    if not taking:
        raise no_node_fits(model, model_file, considered)
    # queue.add checks each node again (draining, its own copy, not being deleted) in this transaction.
    jobs = [
        queue.add(BENCHMARK, each.node_id, {**params, "artifact_id": each.artifact_id}, max_attempts) for each in taking
    ]
    db.session.commit()
    return FanOut(model, model_file, jobs, [each for each in considered if each.reason is not None])


# --------------------------------------------------------------------------- side by side


@dataclass
class Row:
    """One node in a model file's comparison."""

    node_id: str
    name: str
    # Its newest succeeded run, and that run as the node's history reads it (runtime.benchmark_row);
    # None: no run yet.
    job: Job | None = None
    latest: dict[str, object] | None = None
    # The models of the GPUs that run used ([]: the CPU), or with no run those its worker reports
    # (None: not said, or not readable). A GPU no longer in the inventory is named by its UUID.
    gpus: list[str] | None = None
    runs: int = 0
    # The newest run queued, running, failed or cancelled since that success (or with none).
    since: Job | None = None
    # Why a benchmark without a node would skip the node now (None: it would run there).
    reason: str | None = None


@dataclass
class Table:
    """Every node's runs of one model file: the newest success first, then the nodes without one."""

    model_file: str
    rows: list[Row] = field(default_factory=list)


@dataclass
class Comparison:
    """S3: the benchmark runs of one model (a repository at a commit), a table per model file."""

    repo_id: str
    commit: str
    tables: list[Table]
    holders: int  # nodes that hold a copy now

    @property
    def live(self) -> bool:
        """Whether a run shown is still queued or running (the page polls until none is)."""
        return any(
            row.since is not None and row.since.state in (JobState.QUEUED, JobState.RUNNING)
            for table in self.tables
            for row in table.rows
        )


def _model_file(job: Job) -> str | None:
    """The model file a run measured: its result's, else its params' (a run that has not finished)."""
    for source in (job.result, job.params):
        named = source.get("model_file") if isinstance(source, dict) else None
        if isinstance(named, str):
            return named
    return None


def _worker_gpus(lease: NodeLease | None) -> list[str] | None:
    """The models of the GPUs the node's worker reports ([]: a CPU worker), or None when none has reported."""
    reported = lease.runtime_worker if lease is not None and isinstance(lease.runtime_worker, dict) else None
    if reported is None or not isinstance(reported.get("devices"), list):
        return None
    devices = [device for device in reported["devices"] if isinstance(device, dict)]
    return [str(device.get("name") or device.get("uuid") or "unknown GPU") for device in devices]


def _finished(job: Job) -> datetime:
    return job.finished_at or job.created_at


def _runs_of(repo_id: str, commit: str, copies: list[Artifact]) -> list[Job]:
    """The model's benchmark runs, newest first: by its copies while they exist, and by the name a
    finished run keeps in its result, which outlives the artifact row (W2, J5)."""
    named = sa.and_(Job.result["repo_id"].as_string() == repo_id, Job.result["commit"].as_string() == commit)
    of_model = sa.or_(named, Job.artifact_id.in_([copy.id for copy in copies])) if copies else named
    return list(
        db.session.scalars(
            sa.select(Job)
            .where(Job.type == BENCHMARK, of_model)
            .order_by(Job.created_at.desc(), Job.id.desc())
            .limit(RUNS_LIMIT)
        )
    )


def _row(node: Node, lease: NodeLease | None, jobs: list[Job], gpu_names: dict[tuple[str, str], str | None]) -> Row:
    """A node's runs of one model file (newest first) as one row."""
    row = Row(node.id, node_name(node))
    succeeded = [job for job in jobs if job.state == JobState.SUCCEEDED]
    row.runs = len(succeeded)
    if not succeeded:
        row.gpus = _worker_gpus(lease)
        row.since = jobs[0] if jobs else None
        return row
    row.job = max(succeeded, key=lambda job: (_finished(job), job.id))
    row.latest = runtime.benchmark_row(row.job)
    result = row.job.result if isinstance(row.job.result, dict) else {}
    if isinstance(result.get("gpu_uuids"), list):  # P3: an unreadable list of GPUs is not "the CPU"
        row.gpus = [gpu_names.get((node.id, uuid)) or uuid for uuid in row.latest["gpu_uuids"]]
    row.since = next(
        (job for job in jobs if job.state != JobState.SUCCEEDED and job.created_at > row.job.created_at), None
    )
    return row


def comparison(repo_id: str, commit: str, repo_type: str = "model") -> Comparison:
    """The runs of this model on every node that ran it or holds it, a table per model file: each
    node's newest success with the GPUs it ran on, or no run yet, and what has happened since."""
    copies = artifacts.copies_of(repo_type, repo_id, commit)
    runs = _runs_of(repo_id, commit, copies.every)
    by_file: dict[str, dict[str, list[Job]]] = {}
    for job in runs:
        if (model_file := _model_file(job)) is not None:
            by_file.setdefault(model_file, {}).setdefault(job.node_id, []).append(job)
    for copy in copies.every:  # S3: a copy's GGUF files, as its acquire read them, are there to be run
        for model_file in copy.models if isinstance(copy.models, dict) else {}:
            by_file.setdefault(model_file, {})
    node_ids = set(copies.held) | {job.node_id for job in runs}
    nodes = {
        node.id: (node, lease)
        for node, lease in db.session.execute(
            sa.select(Node, NodeLease).outerjoin(NodeLease, NodeLease.node_id == Node.id).where(Node.id.in_(node_ids))
        )
    }
    gpu_names = {
        (node_id, uuid): name
        for node_id, uuid, name in db.session.execute(
            sa.select(Gpu.node_id, Gpu.uuid, Gpu.name).where(Gpu.node_id.in_(node_ids))
        )
    }
    settings = current_settings()
    node_reasons = {node_id: _node_reason(node, lease, settings) for node_id, (node, lease) in nodes.items()}
    tables = []
    for model_file, jobs_by_node in sorted(by_file.items()):
        rows = []
        for node_id in set(jobs_by_node) | set(copies.held):
            node, lease = nodes[node_id]
            row = _row(node, lease, jobs_by_node.get(node_id, []), gpu_names)
            row.reason = node_reasons[node_id] or _copy_reason(node_id, copies, model_file)
            rows.append(row)
        ran = sorted((row for row in rows if row.job), key=lambda row: (_finished(row.job), row.job.id), reverse=True)
        tables.append(Table(model_file, ran + sorted((row for row in rows if not row.job), key=_by_name)))
    return Comparison(repo_id, commit, tables, holders=len(copies.held))


def _by_name(row: Row) -> tuple[str, str]:
    return row.name, row.node_id
