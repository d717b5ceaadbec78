"""Agent API for jobs (J2): claim, progress, complete, fail — each report fenced by its attempt."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Response, request

from app.api import bodies, json_response, operations, replies
from app.api.agent import agent_request
from app.api.auth import NODE_SCHEME, bearer_credential
from app.config import current_settings
from app.db import begin_read_only
from app.extensions import db
from app.jobs import queue, runtime
from app.models import Job, JobState
from app.nodes import publishing, rate_limits
from app.timeutil import utcnow

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
    errors=(400, 401, 403, 413, 415, 426, 429),
)
def claim_job():
    """The node's next job of a type it advertised, or 204; the one it already runs comes back."""
    _, _, body, publisher = agent_request(bodies.ClaimRequest)
    settings = current_settings()
    rate_limits.admit_claim(db.session.connection(), publisher.node_id, utcnow())  # 429 (issue 22)
    job = queue.claim(publisher.node_id, body.capabilities, settings)
    if job is None:
        db.session.commit()  # the claim's slot (its time) is kept: the next claim is measured from it
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
    errors=(*FENCED, 429),
)
def job_progress(job_id: str):
    """Progress renews the lease; the reply says whether the operator cancelled the job."""
    report, body = _report(job_id, bodies.ProgressRequest)
    settings = current_settings()
    rate_limits.admit_progress(  # 429 sooner than the progress interval allows (issue 22)
        db.session.connection(), report.job_id, report.node_id, report.attempt, utcnow(), settings
    )
    return json_response(queue.progress(report, body.progress.stored(), settings))


# Issue 22: the running job a credential's node holds, read before its body is (no write, no SQLite writer lock).
_RUNS = sa.select(Job.id).where(Job.id == sa.bindparam("job_id"), Job.node_id == sa.bindparam("node_id"))


def _allow_a_large_result(job_id: str) -> None:
    """Authenticate before the body is read, and raise the body limit only for a node that runs this job.

    Issue 22: the credential was checked after the body had been read, depth-scanned, parsed and
    validated, so anyone could make a worker spend seconds of CPU on 4 MiB. Now a request without a
    valid credential is refused (401, 403) unread, and one whose node does not run this job keeps the
    general limit (413 above it); the report's own checks (426, 400, the fence) follow as before. The
    lookup runs as a reader and its transaction ends before the body is read.
    """
    begin_read_only()
    publisher = publishing.authenticate(bearer_credential(), first_use=False)
    runs = db.session.scalar(
        _RUNS.where(Job.state == JobState.RUNNING), {"job_id": job_id, "node_id": publisher.node_id}
    )
    db.session.rollback()
    if runs is not None:
        # W2: sixteen outputs of up to 64 KiB each outgrow the general body limit; this route reads more.
        request.max_content_length = max(current_settings().max_request_bytes, runtime.MAX_COMPLETE_BYTES)


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
    _allow_a_large_result(job_id)
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
