"""Agent API for jobs (J2): claim, progress, complete, fail — each report fenced by its attempt."""

from __future__ import annotations

from flask import Response, request

from app.api import bodies, bp, json_response
from app.api.agent import agent_request
from app.config import current_settings
from app.jobs import queue, runtime


def _report(job_id: str, model: type[bodies.Body]) -> tuple[queue.Report, bodies.Body]:
    sent = agent_request(model)
    return queue.Report(node_id=sent.publisher.node_id, job_id=job_id, attempt=sent.body.attempt), sent.body


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
    return json_response(queue.progress(report, body.progress.stored(), current_settings()))


@bp.post("/agent/jobs/<job_id>/complete")
def job_complete(job_id: str):
    """The attempt succeeded; an acquire's artifact is recorded, a runtime result kept per node and model.

    The result's shape follows the job's type, so it is checked once the fenced job is known: a
    stale attempt hears 409 first, and a result of the wrong shape is a 400 that changes nothing.
    """
    # W2: sixteen outputs of up to 64 KiB each outgrow the general body limit; this route reads more.
    request.max_content_length = max(current_settings().max_request_bytes, runtime.MAX_COMPLETE_BYTES)
    report, body = _report(job_id, bodies.CompleteRequest)
    result = bodies.result_of(queue.running(report).type, body.result)
    return json_response({"job": queue.complete(report, result.model_dump()).to_dict()})


@bp.post("/agent/jobs/<job_id>/fail")
def job_fail(job_id: str):
    """The attempt failed; retried with backoff while attempts remain and the failure allows it."""
    report, body = _report(job_id, bodies.FailRequest)
    job = queue.fail(report, body.error.code, body.error.message, body.retryable)
    return json_response({"job": job.to_dict()})
