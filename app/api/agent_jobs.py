"""Agent API for jobs (J2): claim, progress, complete, fail — each report fenced by its attempt."""

from __future__ import annotations

from flask import Response

from app.api import bodies, bp, json_response
from app.api.agent import agent_request
from app.config import current_settings
from app.jobs import queue


def _report(job_id: str, model: type[bodies.Body]) -> tuple[queue.Report, bodies.Body]:
    request = agent_request(model)
    return queue.Report(node_id=request.publisher.node_id, job_id=job_id, attempt=request.body.attempt), request.body


@bp.post("/agent/jobs/claim")
def claim_job():
    """The node's next job of a type it advertised, or 204; the one it already runs comes back."""
    _, _, body, publisher = agent_request(bodies.ClaimRequest)
    settings = current_settings()
    job = queue.claim(publisher.node_id, body.capabilities, settings)
    if job is None:
        return Response(status=204)
    return json_response(
        {
            "job": {
                **job,
                "lease_seconds": settings.job_lease_seconds,
                "progress_interval_seconds": settings.job_progress_interval_seconds,
            }
        }
    )


@bp.post("/agent/jobs/<job_id>/progress")
def job_progress(job_id: str):
    """Progress renews the lease; the reply says whether the operator cancelled the job."""
    report, body = _report(job_id, bodies.ProgressRequest)
    return json_response(queue.progress(report, body.progress.model_dump(), current_settings()))


@bp.post("/agent/jobs/<job_id>/complete")
def job_complete(job_id: str):
    """The attempt succeeded; an acquire's artifact is recorded."""
    report, body = _report(job_id, bodies.CompleteRequest)
    return json_response({"job": queue.complete(report, body.result.model_dump()).to_dict()})


@bp.post("/agent/jobs/<job_id>/fail")
def job_fail(job_id: str):
    """The attempt failed; retried with backoff while attempts remain and the failure allows it."""
    report, body = _report(job_id, bodies.FailRequest)
    job = queue.fail(report, body.error.code, body.error.message, body.retryable)
    return json_response({"job": job.to_dict()})
