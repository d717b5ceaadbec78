"""Admin API for what nodes do: storage roots, jobs, artifacts (J1–J3, J5)."""

from __future__ import annotations

from flask import request

from app.api import bodies, json_response, operations, replies
from app.api.auth import admin_required
from app.api.validation import invalid, json_object
from app.jobs import artifacts, benchmarks, queue, runtime, storage
from app.models import JobState
from app.nodes import get as get_node


@operations.post(
    "/admin/nodes/<node_id>/storage-roots",
    "Register a storage root on a node (J1)",
    body=bodies.StorageRootCreate,
    replies={201: (replies.StorageRootCreated, "Registered; `checked_against` says what the path was checked against")},
    errors=(400, 401, 404, 409, 413, 415),
)
@admin_required
def create_storage_root(node_id: str):
    """J1: register a root on a node; a container path outside the node's artifact directory is a 400."""
    body = bodies.parse(bodies.StorageRootCreate, json_object())
    registered = storage.create(node_id, storage.RootRequest(**body.model_dump()))
    return json_response({**registered.root.to_dict(), "checked_against": registered.checked_against}, 201)


@operations.get(
    "/admin/nodes/<node_id>/storage-roots",
    "A node's storage roots, with what the agent last observed (J1)",
    replies={200: (replies.StorageRoots, "Roots")},
    errors=(401, 404),
)
@admin_required
def list_storage_roots(node_id: str):
    """J1: a node's roots with what the agent last observed of each."""
    get_node(node_id)
    return json_response({"storage_roots": [root.to_dict() for root in storage.for_node(node_id)]})


@operations.delete(
    "/admin/storage-roots/<root_id>",
    "Forget a storage root; refused while a job uses it (J1)",
    replies={200: (replies.Deleted, "Deleted")},
    errors=(401, 404, 409),
)
@admin_required
def delete_storage_root(root_id: str):
    """J1: forget a root (its files stay on the node); 409 while a job uses it."""
    storage.delete(root_id)
    return json_response({"deleted": root_id})


@operations.post(
    "/admin/jobs",
    "Queue a typed job for a node (J2), or a benchmark on every node that qualifies (S3)",
    body=bodies.JobCreate,
    replies={
        201: (replies.JobCreated, "The job; a benchmark without `node_id`: its jobs and the nodes skipped, with why"),
        409: (replies.NoNodeFits, "Conflict with the current state; NO_NODE_FITS names every node and why (S3)"),
    },
    errors=(400, 401, 404, 409, 413, 415),
)
@admin_required
def create_job():
    """J2: queue a typed job for a node; S3: a benchmark without one runs on every node that qualifies."""
    body = bodies.job_create(json_object())
    if body.node_id is None:  # only a benchmark may leave it out (bodies.BenchmarkJobCreate)
        fanned = benchmarks.fan_out(body.params.model_dump(), body.max_attempts)
        return json_response(fanned.to_dict(), 201)
    job = queue.create(body.type, body.node_id, body.params.model_dump(), body.max_attempts)
    return json_response(job.to_dict(), 201)


@operations.get(
    "/admin/jobs",
    "Jobs newest first, filtered; `next_before` pages on (J2, J4)",
    query={
        "node_id": operations.TEXT,
        "type": {"enum": list(queue.TYPES)},
        "state": {"enum": list(JobState)},
        "before": {"type": "string", "format": "uuid", "pattern": bodies.UUID_PATTERN},
    },
    replies={200: (replies.JobsPage, "Jobs")},
    errors=(400, 401),
)
@admin_required
def list_jobs():
    """J2: jobs newest first, filtered by node, type and state, a page at a time."""
    state = request.args.get("state")
    if state is not None and state not in set(JobState):
        raise invalid("state", "must be one of " + ", ".join(JobState))
    job_type = request.args.get("type")
    if job_type is not None and job_type not in queue.TYPES:
        raise invalid("type", "must be one of " + ", ".join(queue.TYPES))
    # Keyset paging: `before` is the last job of the previous page (its id; 404 if there is none).
    before = request.args.get("before")
    found = queue.list_jobs(
        request.args.get("node_id"), job_type, state, queue.get(before) if before is not None else None
    )
    next_before = found[-1].id if len(found) == queue.PAGE_SIZE else None
    return json_response({"jobs": [job.to_dict() for job in found], "next_before": next_before})


@operations.get("/admin/jobs/<job_id>", "One job (J2)", replies={200: (replies.Job, "The job")}, errors=(401, 404))
@admin_required
def get_job(job_id: str):
    """J2: one job."""
    return json_response(queue.get(job_id).to_dict())


@operations.post(
    "/admin/jobs/<job_id>/cancel",
    "Cancel a queued job, or tell a running one to stop (J2)",
    replies={200: (replies.Job, "The job")},
    errors=(401, 404, 409),
)
@admin_required
def cancel_job(job_id: str):
    """J2: cancel a queued job at once, or tell a running one to stop."""
    return json_response(queue.cancel(job_id).to_dict())


@operations.post(
    "/admin/jobs/<job_id>/retry",
    "Run a failed or cancelled job again as a new attempt (J2)",
    replies={200: (replies.Job, "The job")},
    errors=(401, 404, 409),
)
@admin_required
def retry_job(job_id: str):
    """J2: run a failed or cancelled job again, as a new attempt."""
    return json_response(queue.retry(job_id).to_dict())


@operations.get(
    "/admin/nodes/<node_id>/artifacts",
    "The node's verified artifacts (J3)",
    replies={200: (replies.Artifacts, "Artifacts")},
    errors=(401, 404),
)
@admin_required
def list_artifacts(node_id: str):
    """J3: what the node holds, verified."""
    get_node(node_id)
    found = artifacts.for_node(node_id)
    deleting = artifacts.deleting([artifact.id for artifact in found])
    return json_response(
        {"artifacts": [{**artifact.to_dict(), "deleting_job_id": deleting.get(artifact.id)} for artifact in found]}
    )


@operations.delete(
    "/admin/artifacts/<artifact_id>",
    "Delete an artifact: the agent removes its directory, inside its root only (J5)",
    replies={202: (replies.Job, "Its artifact.delete.v1 job (new, or the one already under way)")},
    errors=(401, 404, 409),
)
@admin_required
def delete_artifact(artifact_id: str):
    """J5: 409 ARTIFACT_IN_USE while a deployment that is not stopped or an unfinished runtime job
    uses it; otherwise the agent removes the files and the artifact leaves the node's list."""
    job = queue.request_delete(artifact_id)
    return json_response(job.to_dict(), 202)


@operations.get(
    "/admin/nodes/<node_id>/runtime-results",
    "The node's benchmark runs per model, newest first, and its last smoke test (W2)",
    replies={200: (replies.RuntimeResults, "Results")},
    errors=(401, 404),
)
@admin_required
def runtime_results(node_id: str):
    """W2: the node's benchmark runs per model, newest first, and its last smoke test."""
    get_node(node_id)
    return json_response(runtime.results(node_id))
