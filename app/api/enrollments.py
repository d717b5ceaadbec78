"""Admin API for enrolment tokens (E1, E5)."""

from __future__ import annotations

from flask import request

from app.api import bodies, json_response, operations, replies
from app.api.auth import admin_required
from app.api.validation import invalid, json_object
from app.config import current_settings
from app.models import EnrollmentState
from app.nodes import enrollment, readiness
from app.public_origin import current_api_origin


@operations.post(
    "/admin/node-enrollments",
    "Mint a one-time enrolment token (E1)",
    body=bodies.EnrollmentCreate,
    replies={201: (replies.MintedEnrollment, "Created; `token` appears here only")},
    errors=(400, 401, 413, 415),
)
@admin_required
def create_enrollment():
    """Mint a one-time enrolment token; the token appears in this response only."""
    body = bodies.parse(bodies.EnrollmentCreate, json_object())
    minted, token = enrollment.create(
        enrollment.EnrollmentRequest(api_origin=current_api_origin(), **body.model_dump())
    )
    return json_response({**minted.to_dict(), "token": token}, 201)


@operations.get(
    "/admin/node-enrollments",
    "List enrolments, newest first, without tokens",
    query={"state": {"enum": list(EnrollmentState)}},
    replies={200: (replies.Enrollments, "Enrolments")},
    errors=(400, 401),
)
@admin_required
def list_enrollments():
    """Enrolments, newest first, without tokens; `?state=` filters."""
    state = request.args.get("state")
    if state is not None and state not in set(EnrollmentState):
        raise invalid("state", "must be one of " + ", ".join(EnrollmentState))
    return json_response({"enrollments": [item.to_dict() for item in enrollment.list_all(state)]})


@operations.get(
    "/admin/node-enrollments/<enrollment_id>",
    "One enrolment",
    replies={200: (replies.Enrollment, "The enrolment")},
    errors=(401, 404),
)
@admin_required
def get_enrollment(enrollment_id: str):
    """One enrolment, without its token."""
    return json_response(enrollment.get(enrollment_id).to_dict())


@operations.post(
    "/admin/node-enrollments/<enrollment_id>/revoke",
    "Revoke an unused token",
    replies={200: (replies.Enrollment, "Revoked")},
    errors=(401, 404, 409),
)
@admin_required
def revoke_enrollment(enrollment_id: str):
    """Revoke an unused token."""
    return json_response(enrollment.revoke(enrollment_id).to_dict())


@operations.get(
    "/admin/node-enrollments/<enrollment_id>/readiness",
    "Readiness of the node that consumed this enrolment (R2)",
    replies={200: (replies.Readiness, "Readiness")},
    errors=(401, 404),
)
@admin_required
def enrollment_readiness(enrollment_id: str):
    """R2: readiness of the node that consumed this enrolment, for the wizard to poll."""
    return json_response(readiness.for_enrollment(enrollment.get(enrollment_id), current_settings()))
