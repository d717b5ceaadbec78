"""J2: what another attempt can do about a job that ended badly, by its error code — the one list.

The agent classes each failure as it happens (retryable or not) for the automatic retries; this
is the operator's side once the job has ended: would pressing Retry, with the same params, help?
The console offers Retry only where it can, and for the rest points at what to change.
"""

from __future__ import annotations

import enum


class Remedy(enum.StrEnum):
    """What helps a job that failed (or was cancelled) with a given code."""

    # Transient (network, Hub 5xx, agent or worker lost, a stall or timeout): the same job again.
    RETRY = "retry"
    # The node's setup must change first (a Hub token, free space, a newer agent); then the same job can succeed.
    FIX_THEN_RETRY = "fix_then_retry"
    # The job's own params are wrong (a repository typo, an unusable root, a file that is not a GGUF
    # model): the same job fails the same way every time; change them and start a new one.
    NEW_JOB = "new_job"


REMEDIES: dict[str, Remedy] = {
    # artifact.acquire.v1
    "HUB_UNAVAILABLE": Remedy.RETRY,
    "ARTIFACT_VERIFICATION_FAILED": Remedy.RETRY,  # a corrupted download: the next attempt fetches again
    "HUB_AUTH_REQUIRED": Remedy.FIX_THEN_RETRY,
    "STORAGE_CAPACITY_GUARD": Remedy.FIX_THEN_RETRY,
    "HUB_TREE_INVALID": Remedy.FIX_THEN_RETRY,  # the Hub's (or the mirror's, HF_ENDPOINT) file list
    "HUB_REPO_NOT_FOUND": Remedy.NEW_JOB,
    "HUB_REVISION_NOT_FOUND": Remedy.NEW_JOB,
    "STORAGE_ROOT_UNAVAILABLE": Remedy.NEW_JOB,
    "STORAGE_ROOT_NOT_FOUND": Remedy.NEW_JOB,
    "ARTIFACT_PATH_UNSAFE": Remedy.NEW_JOB,  # the repository itself lists paths that cannot be stored safely
    # runtime.benchmark.v1, runtime.generate.v1
    "RUNTIME_WORKER_UNAVAILABLE": Remedy.RETRY,
    "WORKER_BUSY": Remedy.RETRY,
    "WORKER_INTERNAL_ERROR": Remedy.RETRY,
    "RUNTIME_FAILED": Remedy.RETRY,
    "MODEL_FILE_INVALID": Remedy.NEW_JOB,
    "MODEL_LOAD_FAILED": Remedy.NEW_JOB,
    "RUNTIME_ENGINE_CRASHED": Remedy.NEW_JOB,
    "PROMPT_TOO_LONG": Remedy.NEW_JOB,
    "ARTIFACT_NOT_FOUND": Remedy.NEW_JOB,
    "ARTIFACT_NOT_ON_NODE": Remedy.NEW_JOB,
    # every type
    "JOB_LEASE_LOST": Remedy.RETRY,
    "AGENT_INTERNAL_ERROR": Remedy.RETRY,
    "JOB_CANCELLED": Remedy.RETRY,  # the operator stopped it: it can run again as it was
    "JOB_TYPE_UNSUPPORTED": Remedy.FIX_THEN_RETRY,
    "JOB_PARAMS_INVALID": Remedy.NEW_JOB,
}


def remedy(code: object) -> Remedy:
    """The remedy for an error code; a code not listed (a newer agent's) keeps Retry on offer."""
    return REMEDIES.get(code, Remedy.RETRY) if isinstance(code, str) else Remedy.RETRY
