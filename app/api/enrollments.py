"""Admin API for enrolment tokens (E1, E5)."""

from __future__ import annotations

from flask import request

from app.api import bodies, bp, json_response
from app.api.auth import admin_required
from app.api.validation import invalid, json_object
from app.config import current_settings
from app.models import EnrollmentState
from app.nodes import enrollment, readiness
from app.public_origin import current_api_origin


@bp.post("/admin/node-enrollments")
@admin_required
def create_enrollment():
    """Mint a one-time enrolment token; the token appears in this response only."""
    body = bodies.parse(bodies.EnrollmentCreate, json_object())
    minted, token = enrollment.create(
        enrollment.EnrollmentRequest(api_origin=current_api_origin(), **body.model_dump())
    )
    return json_response({**minted.to_dict(), "token": token}, 201)


@bp.get("/admin/node-enrollments")
@admin_required
def list_enrollments():
    """Enrolments, newest first, without tokens; `?state=` filters."""
    state = request.args.get("state")
    if state is not None and state not in set(EnrollmentState):
        raise invalid("state", "must be one of " + ", ".join(EnrollmentState))
    return json_response({"enrollments": [item.to_dict() for item in enrollment.list_all(state)]})


@bp.get("/admin/node-enrollments/<enrollment_id>")
@admin_required
def get_enrollment(enrollment_id: str):
    """One enrolment, without its token."""
    return json_response(enrollment.get(enrollment_id).to_dict())


@bp.post("/admin/node-enrollments/<enrollment_id>/revoke")
@admin_required
def revoke_enrollment(enrollment_id: str):
    """Revoke an unused token."""
    return json_response(enrollment.revoke(enrollment_id).to_dict())


@bp.get("/admin/node-enrollments/<enrollment_id>/readiness")
@admin_required
def enrollment_readiness(enrollment_id: str):
    """R2: readiness of the node that consumed this enrolment, for the wizard to poll."""
    return json_response(readiness.for_enrollment(enrollment.get(enrollment_id), current_settings()))
