"""Admin API for what nodes do: storage roots, jobs, artifacts (J1–J3)."""

from __future__ import annotations

from flask import request

from app.api import bodies, bp, json_response
from app.api.auth import admin_required
from app.api.validation import invalid, json_object
from app.jobs import artifacts, queue, runtime, storage
from app.models import JobState
from app.nodes import get as get_node


@bp.post("/admin/nodes/<node_id>/storage-roots")
@admin_required
def create_storage_root(node_id: str):
    """J1: register a root on a node."""
    body = bodies.parse(bodies.StorageRootCreate, json_object())
    root = storage.create(node_id, storage.RootRequest(**body.model_dump()))
    return json_response(root.to_dict(), 201)


@bp.get("/admin/nodes/<node_id>/storage-roots")
@admin_required
def list_storage_roots(node_id: str):
    """J1: a node's roots with what the agent last observed of each."""
    get_node(node_id)
    return json_response({"storage_roots": [root.to_dict() for root in storage.for_node(node_id)]})


@bp.delete("/admin/storage-roots/<root_id>")
@admin_required
def delete_storage_root(root_id: str):
    """J1: forget a root (its files stay on the node); 409 while a job uses it."""
    storage.delete(root_id)
    return json_response({"deleted": root_id})


@bp.post("/admin/jobs")
@admin_required
def create_job():
    """J2: queue a typed job for a node."""
    body = bodies.job_create(json_object())
    job = queue.create(body.type, body.node_id, body.params.model_dump(), body.max_attempts)
    return json_response(job.to_dict(), 201)


@bp.get("/admin/jobs")
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


@bp.get("/admin/jobs/<job_id>")
@admin_required
def get_job(job_id: str):
    """J2: one job."""
    return json_response(queue.get(job_id).to_dict())


@bp.post("/admin/jobs/<job_id>/cancel")
@admin_required
def cancel_job(job_id: str):
    """J2: cancel a queued job at once, or tell a running one to stop."""
    return json_response(queue.cancel(job_id).to_dict())


@bp.post("/admin/jobs/<job_id>/retry")
@admin_required
def retry_job(job_id: str):
    """J2: run a failed or cancelled job again, as a new attempt."""
    return json_response(queue.retry(job_id).to_dict())


@bp.get("/admin/nodes/<node_id>/artifacts")
@admin_required
def list_artifacts(node_id: str):
    """J3: what the node holds, verified."""
    get_node(node_id)
    return json_response({"artifacts": [artifact.to_dict() for artifact in artifacts.for_node(node_id)]})


@bp.get("/admin/nodes/<node_id>/runtime-results")
@admin_required
def runtime_results(node_id: str):
    """W2: the node's benchmark runs per model, newest first, and its last smoke test."""
    get_node(node_id)
    return json_response(runtime.results(node_id))
