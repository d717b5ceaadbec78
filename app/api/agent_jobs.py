"""Agent API for jobs (J2): claim, progress, complete, fail — each report fenced by its attempt."""

from __future__ import annotations

from flask import Response, request

from app.api import bodies, json_response, operations, replies
from app.api.agent import agent_request
from app.api.auth import NODE_SCHEME
from app.config import current_settings
from app.jobs import queue, runtime

# J2: what refuses a report fenced by its attempt; one from an attempt the job moved past is 409 JOB_LEASE_LOST.
FENCED = (400, 401, 403, 404, 409, 413, 415, 426)


def _report(job_id: str, model: type[bodies.Body]) -> tuple[queue.Report, bodies.Body]:
    sent = agent_request(model)
    return queue.Report(node_id=sent.publisher.node_id, job_id=job_id, attempt=sent.body.attempt), sent.body


@operations.post(
    "/agent/jobs/claim",
    "The node's next job of an advertised type, or the one it runs (J2)",
    security=(NODE_SCHEME,),
    body=bodies.ClaimRequest,
    replies={200: (replies.Claimed, "Claimed, with a lease"), 204: (None, "Nothing to do")},
    errors=(400, 401, 403, 413, 415, 426),
)
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


@operations.post(
    "/agent/jobs/<job_id>/progress",
    "Report progress and renew the lease; fenced by the attempt (J2)",
    security=(NODE_SCHEME,),
    body=bodies.ProgressRequest,
    replies={200: (replies.LeaseRenewed, "Renewed")},
    errors=FENCED,
)
def job_progress(job_id: str):
    """Progress renews the lease; the reply says whether the operator cancelled the job."""
    report, body = _report(job_id, bodies.ProgressRequest)
    return json_response(queue.progress(report, body.progress.stored(), current_settings()))


@operations.post(
    "/agent/jobs/<job_id>/complete",
    "The attempt succeeded (J2, J3)",
    security=(NODE_SCHEME,),
    body=bodies.CompleteRequest,
    replies={200: (replies.JobOutcome, "Finished")},
    errors=FENCED,
)
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


@operations.post(
    "/agent/jobs/<job_id>/fail",
    "The attempt failed; retried while attempts remain and the class allows (J2)",
    security=(NODE_SCHEME,),
    body=bodies.FailRequest,
    replies={200: (replies.JobOutcome, "Recorded")},
    errors=FENCED,
)
def job_fail(job_id: str):
    """The attempt failed; retried with backoff while attempts remain and the failure allows it."""
    report, body = _report(job_id, bodies.FailRequest)
    job = queue.fail(report, body.error.code, body.error.message, body.retryable)
    return json_response({"job": job.to_dict()})
