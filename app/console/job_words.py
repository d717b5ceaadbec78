"""How the console words a job (J4): its title, its params with names instead of ids, why it
failed in a few words, and what to do next — Retry only where another attempt can help
(app/jobs/failures.py), otherwise a link to the form that starts the job that can succeed."""

from __future__ import annotations

from dataclasses import dataclass

from flask import url_for
from markupsafe import Markup

from app.console.formatting import plain, short_commit
from app.jobs import failures, queue
from app.jobs.failures import Remedy
from app.models import Artifact, Job, JobState, Node, StorageRoot

# Where each form and table lives: the node page's tab, and the section's id on it.
SECTIONS = {
    "acquire": ("console.node_storage", "node-acquire"),
    "roots": ("console.node_storage", "node-roots"),
    "artifacts": ("console.node_storage", "node-artifacts"),
    "run": ("console.node_work", "node-runtime-jobs"),
}


def section_url(node_id: str, section: str, anchor: str | None = None) -> str:
    """The node page's tab at one of its sections (SECTIONS), or at `anchor` on that tab."""
    endpoint, section_id = SECTIONS[section]
    return url_for(endpoint, node_id=node_id, _anchor=anchor or section_id)


# --------------------------------------------------------------------------- title


# What each type does, in a word, for the list and its filter (the type itself stays beside it).
KINDS = {
    queue.ACQUIRE: "Download",
    queue.BENCHMARK: "Benchmark",
    queue.GENERATE: "Smoke test",
    queue.DELETE: "Delete",
}


def kind(job_type: str) -> str:
    """'Download' for artifact.acquire.v1; an unknown type is its own name."""
    return KINDS.get(job_type, job_type)


def _model_name(job: Job, artifact: Artifact | None) -> str:
    """The repository a runtime or delete job is about: its artifact's, else the one its result
    kept (the name outlives the artifact)."""
    if artifact is not None:
        return artifact.repo_id
    result = job.result if isinstance(job.result, dict) else {}
    return result["repo_id"] if isinstance(result.get("repo_id"), str) else "a deleted artifact"


def title(job: Job, node: Node | None, artifact: Artifact | None) -> str:
    """What the job does, in words: 'Download model owner/name to GPU Node'."""
    params = job.params if isinstance(job.params, dict) else {}
    where = node.display_name if node is not None else "a deleted node"
    if job.type == queue.ACQUIRE:
        kind = "dataset" if params.get("repo_type") == "dataset" else "model"
        return f"Download {kind} {plain(params.get('repo_id'))} to {where}"
    model = _model_name(job, artifact)
    if job.type == queue.BENCHMARK:
        return f"Benchmark model {model} on {where}"
    if job.type == queue.GENERATE:
        return f"Run model {model} on {where}"
    if job.type == queue.DELETE:
        return f"Delete model {model} from {where}"
    return f"{job.type} on {where}"


# --------------------------------------------------------------------------- attempts


def attempts(job: Job) -> str | None:
    """'Attempt 2 of 3', shown only when it says something: a later attempt, or a retry on its
    way; a first attempt (running, done or not yet started) says nothing."""
    retrying = job.state == JobState.QUEUED and bool(job.error) and job.attempt >= 1
    if retrying:
        return f"Attempt {job.attempt} of {job.max_attempts} failed; attempt {job.attempt + 1} is next"
    if job.attempt > 1:
        return f"Attempt {job.attempt} of {job.max_attempts}"
    return None


# --------------------------------------------------------------------------- params


@dataclass(frozen=True)
class Param:
    """One param as the job page shows it: a label and its value (already escaped)."""

    key: str
    label: str
    value: Markup


_LABELS = {
    "repo_id": "Repository",
    "revision": "Revision",
    "repo_type": "Type",
    "storage_root_id": "Storage root",
    "allow_patterns": "Only files matching",
    "ignore_patterns": "Skip files matching",
    "artifact_id": "Artifact",
    "model_file": "Model file",
    "n_gpu_layers": "GPU layers",
    "prompt_tokens": "Prompt tokens",
    "generate_tokens": "Generated tokens",
    "repetitions": "Repetitions",
    "prompts": "Prompts",
    "max_tokens": "Max tokens",
}


def _code(value: object) -> Markup:
    return Markup("<code>{}</code>").format(plain(value))


def _listed(value: object) -> Markup:
    if isinstance(value, list) and value:
        return Markup(", ").join(_code(item) for item in value)
    return Markup("none") if value in (None, []) else _code(value)


def _gpu_layers(value: object) -> Markup:
    if value == -1:
        return Markup("all")
    if value == 0:
        return Markup("none (CPU only)")
    return _code(value)


def _root(job: Job, root: StorageRoot | None) -> Markup:
    if root is None:
        return Markup("deleted since")
    return Markup('<a href="{}">{}</a> <code>{}</code> (host <code>{}</code>)').format(
        section_url(job.node_id, "roots"), root.name, root.container_path, root.host_path
    )


def _artifact(artifact: Artifact | None) -> Markup:
    if artifact is None:
        return Markup("deleted since")
    href = section_url(artifact.node_id, "artifacts", f"artifact-{artifact.id}")
    return Markup('<a href="{}">{} @ {}</a>').format(href, artifact.repo_id, short_commit(artifact.commit))


def params(job: Job, root: StorageRoot | None, artifact: Artifact | None) -> list[Param]:
    """The job's params labelled, in the order the forms ask them; ids as the names they stand
    for, linked to where those live; anything else after, in words."""
    stored = job.params if isinstance(job.params, dict) else {}
    shown = {
        "storage_root_id": lambda _: _root(job, root),
        "artifact_id": lambda _: _artifact(artifact),
        "allow_patterns": _listed,
        "ignore_patterns": _listed,
        "prompts": _listed,
        "n_gpu_layers": _gpu_layers,
    }
    known = [key for key in _LABELS if key in stored]
    others = sorted(key for key in stored if key not in _LABELS)
    return [
        Param(key, _LABELS.get(key, key.replace("_", " ").capitalize()), shown.get(key, _code)(stored[key]))
        for key in known + others
    ]


# --------------------------------------------------------------------------- failure


# A few words on why, for the jobs list; a code not listed shows its message.
_REASONS = {
    "HUB_REPO_NOT_FOUND": "repository not found",
    "HUB_REVISION_NOT_FOUND": "revision not found",
    "HUB_AUTH_REQUIRED": "the Hub wants a token",
    "HUB_UNAVAILABLE": "the Hub or the network failed",
    "HUB_TREE_INVALID": "the Hub's file list could not be trusted",
    "STORAGE_CAPACITY_GUARD": "not enough free space",
    "STORAGE_ROOT_UNAVAILABLE": "storage root unusable",
    "STORAGE_ROOT_NOT_FOUND": "storage root deleted",
    "ARTIFACT_VERIFICATION_FAILED": "a file failed verification",
    "ARTIFACT_PATH_UNSAFE": "unsafe path in the repository",
    "JOB_LEASE_LOST": "the agent stopped reporting",
    "JOB_PARAMS_INVALID": "bad job settings",
    "JOB_TYPE_UNSUPPORTED": "the agent cannot run this type",
    "AGENT_INTERNAL_ERROR": "the agent hit an error",
    "RUNTIME_WORKER_UNAVAILABLE": "no runtime worker answered",
    "WORKER_BUSY": "the runtime worker was busy",
    "MODEL_FILE_INVALID": "model file missing",
    "MODEL_LOAD_FAILED": "the model did not load",
    "RUNTIME_ENGINE_CRASHED": "llama.cpp crashed",
    "ARTIFACT_NOT_FOUND": "artifact gone",
    "ARTIFACT_NOT_ON_NODE": "artifact on another node",
}
MAX_REASON = 120


def cancelled(job: Job) -> bool:
    """An operator's cancel: an outcome they asked for, shown in neutral words, not as an error."""
    return job.state == JobState.CANCELLED


def reason(job: Job) -> str | None:
    """Why a failed job failed (or why a queued one is being retried), in a few words."""
    error = job.error if isinstance(job.error, dict) else None
    if error is None or job.state not in (JobState.FAILED, JobState.QUEUED):
        return None
    code = error.get("code")
    if isinstance(code, str) and code in _REASONS:
        return _REASONS[code]
    message = plain(error.get("message")) if error.get("message") is not None else plain(code)
    return message if len(message) <= MAX_REASON else message[: MAX_REASON - 1] + "…"


@dataclass(frozen=True)
class NextStep:
    """What the job page offers after a failure or a cancel: Retry (primary when it is the fix,
    secondary when something must change first), or no Retry and a link to the form that can."""

    retry: str | None  # None, "primary" or "secondary"
    fix_text: str | None = None
    fix_url: str | None = None


# NEW_JOB codes: what to change, and where on the node page it is changed.
_FIXES = {
    "HUB_REPO_NOT_FOUND": ("Fix the repository name and acquire again", "acquire"),
    "HUB_REVISION_NOT_FOUND": ("Fix the revision and acquire again", "acquire"),
    "ARTIFACT_PATH_UNSAFE": ("Acquire another repository", "acquire"),
    "STORAGE_ROOT_UNAVAILABLE": ("Fix the storage root (or register another) and acquire again", "roots"),
    "STORAGE_ROOT_NOT_FOUND": ("Register a storage root and acquire again", "roots"),
    "MODEL_FILE_INVALID": ("Pick a model file the artifact holds and run it again", "run"),
    "MODEL_LOAD_FAILED": ("Pick a GGUF model file of the artifact and run it again", "run"),
    "RUNTIME_ENGINE_CRASHED": ("Pick another model file, or acquire the model again", "run"),
    "PROMPT_TOO_LONG": ("Shorten the prompts and run it again", "run"),
    "ARTIFACT_NOT_FOUND": ("Acquire the model onto this node, then run it", "acquire"),
    "ARTIFACT_NOT_ON_NODE": ("Acquire the model onto this node, then run it", "acquire"),
}


def _form_of(job: Job) -> str:
    if job.type == queue.ACQUIRE:
        return "acquire"
    return "artifacts" if job.type == queue.DELETE else "run"


def next_step(job: Job) -> NextStep | None:
    """Retry where it can help; otherwise the fix, linked (None for a job that has not ended badly)."""
    if job.state not in (JobState.FAILED, JobState.CANCELLED):
        return None
    error = job.error if isinstance(job.error, dict) else {}
    code = "JOB_CANCELLED" if job.state == JobState.CANCELLED else error.get("code")
    found = failures.remedy(code)
    if found == Remedy.RETRY:
        return NextStep(retry="secondary" if job.state == JobState.CANCELLED else "primary")
    if found == Remedy.FIX_THEN_RETRY:
        return NextStep(retry="secondary")
    words, section = _FIXES.get(code, ("Change the job's settings and start it again", _form_of(job)))
    return NextStep(retry=None, fix_text=words, fix_url=section_url(job.node_id, section))
