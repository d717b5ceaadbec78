"""J3: artifacts — repository revisions acquired and verified on a node, where they lie on it; J5:
deleted by an artifact.delete.v1 job once nothing uses them."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import sqlalchemy as sa

from app import audit
from app.errors import DomainError
from app.extensions import db
from app.models import Artifact, Deployment, DeploymentState, Job, JobState, StorageRoot
from app.timeutil import utcnow

DELETE = "artifact.delete.v1"  # J5: the agent removes the artifact's directory, inside its root only
_ACTIVE_JOB_STATES = (JobState.QUEUED, JobState.RUNNING)


def _inside(path: str, root: str) -> str | None:
    """`path` relative to `root` when it lies inside it (POSIX paths as the agent sees them), else None."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    relative = posixpath.relpath(path, root)
    if relative == "." or relative.startswith("../") or relative == ".." or posixpath.isabs(relative):
        return None
    return relative


def record(job: Job, result: dict[str, object]) -> Artifact:
    """Store (or refresh) the artifact a finished acquire left; its host path follows from the root's."""
    root = db.session.get(StorageRoot, job.storage_root_id) if job.storage_root_id else None
    if root is None:
        raise DomainError(
            "STORAGE_ROOT_NOT_FOUND",
            "The job's storage root was deleted while it ran.",
            "Register the root again and retry the job.",
        )
    relative = _inside(str(result["container_path"]), root.container_path)
    if relative is None:
        raise DomainError(
            "ARTIFACT_OUTSIDE_ROOT",
            "The reported artifact path is not inside the job's storage root.",
            "Run an official node agent release.",
            field="result.container_path",
        )
    params = job.params
    place = {
        "storage_root_id": root.id,
        "repo_type": params.get("repo_type", "model"),
        "repo_id": params["repo_id"],
        "commit": result["commit"],
    }
    artifact = db.session.scalar(sa.select(Artifact).filter_by(**place))
    if artifact is None:
        artifact = Artifact(node_id=job.node_id, **place)
        db.session.add(artifact)
    artifact.revision = str(params.get("revision", "main"))
    artifact.container_path = posixpath.normpath(str(result["container_path"]))
    artifact.host_path = posixpath.join(root.host_path, relative)
    artifact.files = int(result["files"])
    artifact.total_bytes = int(result["total_bytes"])
    reported = result.get("models")  # S3: None from an agent older than the estimate
    artifact.models = (
        {path: {key: value for key, value in facts.items() if value is not None} for path, facts in reported.items()}
        if isinstance(reported, dict)
        else None
    )
    artifact.verified_at = utcnow()
    artifact.job_id = job.id
    db.session.flush()
    return artifact


def get(artifact_id: str) -> Artifact:
    """The artifact with this id, or ARTIFACT_NOT_FOUND (runtime jobs and deployments read models from one)."""
    artifact = db.session.get(Artifact, artifact_id)
    if artifact is None:
        raise DomainError(
            "ARTIFACT_NOT_FOUND",
            f"No artifact has id “{artifact_id[:100]}”.",
            "Acquire the model onto the node first, then list its artifacts (GET /api/v1/admin/nodes/{id}/artifacts).",
        )
    return artifact


def model_files(artifact: Artifact) -> list[tuple[str, str | None]] | None:
    """W2, S3: the artifact's GGUF files as its acquire job read them on the node, each with why
    its header cannot be believed (None when it can), readable ones first; None when the agent
    that acquired it listed none (a release from before header reads)."""
    if not isinstance(artifact.models, dict):
        return None
    found = [
        (path, facts.get("problem") if isinstance(facts, dict) and isinstance(facts.get("problem"), str) else None)
        for path, facts in artifact.models.items()
        if isinstance(path, str)
    ]
    return sorted(found, key=lambda entry: (entry[1] is not None, entry[0]))


def for_node(node_id: str) -> list[Artifact]:
    """A node's artifacts, newest verification first."""
    return list(
        db.session.scalars(
            sa.select(Artifact).where(Artifact.node_id == node_id).order_by(Artifact.verified_at.desc(), Artifact.id)
        )
    )


def deleting(artifact_ids: list[str]) -> dict[str, str]:
    """J5: artifact id -> the id of its delete job still queued or running, for those that have one."""
    if not artifact_ids:
        return {}
    rows = db.session.execute(
        sa.select(Job.artifact_id, Job.id).where(
            Job.type == DELETE, Job.state.in_(_ACTIVE_JOB_STATES), Job.artifact_id.in_(artifact_ids)
        )
    )
    return {artifact_id: job_id for artifact_id, job_id in rows}


@dataclass(frozen=True)
class Copies:
    """Every node's copies of one model: all of them, each node's newest not being deleted, and the
    nodes whose every copy is being deleted (J5)."""

    repo_type: str
    repo_id: str
    commit: str
    every: list[Artifact]
    held: dict[str, Artifact]
    deleting: set[str]


def copies_of(repo_type: str, repo_id: str, commit: str) -> Copies:
    """The model's copies on every node, newest verification first."""
    every = list(
        db.session.scalars(
            sa.select(Artifact)
            .where(Artifact.repo_type == repo_type, Artifact.repo_id == repo_id, Artifact.commit == commit)
            .order_by(Artifact.verified_at.desc(), Artifact.id)
        )
    )
    going = deleting([copy.id for copy in every])
    held: dict[str, Artifact] = {}
    being_deleted: set[str] = set()
    for copy in every:
        if copy.id in going:
            being_deleted.add(copy.node_id)
        else:
            held.setdefault(copy.node_id, copy)
    return Copies(repo_type, repo_id, commit, every, held, being_deleted - set(held))


def refuse_if_deleting(artifact: Artifact) -> None:
    """J5: nothing new starts on an artifact whose files are being removed."""
    if deleting([artifact.id]):
        raise DomainError(
            "ARTIFACT_DELETING",
            f"Artifact {artifact.id} ({artifact.repo_id}) is being deleted from its node.",
            "Acquire the model again once its delete job has finished, or cancel that job.",
        )


def refuse_if_in_use(artifact: Artifact) -> None:
    """J5: 409 ARTIFACT_IN_USE while a deployment that is not stopped, or a runtime job that has not
    finished, reads it; the message names them."""
    deployed = db.session.scalars(
        sa.select(Deployment.name).where(
            Deployment.artifact_id == artifact.id, Deployment.state != DeploymentState.STOPPED
        )
    ).all()
    jobs = db.session.scalars(
        sa.select(Job.id).where(Job.artifact_id == artifact.id, Job.type != DELETE, Job.state.in_(_ACTIVE_JOB_STATES))
    ).all()
    if deployed or jobs:
        users = [f"deployment {name}" for name in deployed] + [f"job {job_id}" for job_id in jobs]
        raise DomainError(
            "ARTIFACT_IN_USE",
            f"Artifact {artifact.id} ({artifact.repo_id}) is in use by " + ", ".join(users) + ".",
            "Stop its deployments (and let its jobs finish or cancel them), then delete it.",
        )


def forget(artifact: Artifact, job: Job) -> None:
    """J5: the agent removed the files; the artifact leaves the node's list (the job keeps its result)."""
    audit.record(
        audit.agent_actor(job.node_id), "artifact.deleted", job.node_id,
        artifact_id=artifact.id, repo_id=artifact.repo_id, commit=artifact.commit, job_id=job.id,
    )  # fmt: skip
    db.session.delete(artifact)
