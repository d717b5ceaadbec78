"""Admin API for acceptance evidence (V1): the checklist, production eligibility, evidence, the bundle."""

from __future__ import annotations

from flask import request

from app import acceptance, audit
from app.acceptance import responses, uploads
from app.api import bodies, json_response, operations, replies
from app.api.auth import admin_required
from app.api.errors import ApiError
from app.api.validation import json_object

FILE = {"type": "string", "format": "binary"}
# V1: one file in the multipart field `file`, of at most the screenshot limit.
SCREENSHOT_UPLOAD = {
    "type": "object",
    "properties": {"file": {**FILE, "maxLength": uploads.MAX_SCREENSHOT_BYTES}},
    "required": ["file"],
}


@operations.get(
    "/admin/nodes/<node_id>/acceptance",
    "The node's acceptance checklist, item by item, and whether it is validated (V1)",
    replies={200: (replies.Acceptance, "The checklist")},
    errors=(401, 404),
)
@admin_required
def get_acceptance(node_id: str):
    """V1: the node's checklist, item by item, and whether it is validated."""
    return json_response(acceptance.evaluate(node_id).to_dict())


@operations.post(
    "/admin/nodes/<node_id>/production-eligibility",
    "Set or clear production_eligible; true only on a validated node (V1)",
    body=bodies.ProductionEligibility,
    replies={
        200: (replies.Acceptance, "Set; the checklist"),
        409: (replies.Error, "NODE_NOT_VALIDATED: `missing` and `contradicted` name the items that are not observed"),
    },
    errors=(400, 401, 404, 413, 415),
)
@admin_required
def set_production_eligibility(node_id: str):
    """V1: production_eligible may become true only on a validated node (409 NODE_NOT_VALIDATED)."""
    body = bodies.parse(bodies.ProductionEligibility, json_object())
    return json_response(
        acceptance.set_production_eligible(node_id, body.production_eligible, audit.OPERATOR).to_dict()
    )


@operations.post(
    "/admin/nodes/<node_id>/acceptance/container-status",
    "Check and keep a pasted `docker inspect` of the node-agent container; environment values and anything "
    "secret-looking are dropped before it is stored (V1)",
    body=bodies.ContainerStatus,
    replies={201: (replies.AcceptanceItem, "Checked and kept; `state` says whether every check passed")},
    errors=(400, 401, 404, 413, 415),
)
@admin_required
def post_container_status(node_id: str):
    """V1: check and keep a pasted `docker inspect` of the node-agent container (values of its env dropped)."""
    body = bodies.parse(bodies.ContainerStatus, json_object())
    item = acceptance.record_container_status(node_id, body.inspect, audit.OPERATOR)
    return json_response(item.to_dict(), 201)


@operations.post(
    "/admin/nodes/<node_id>/acceptance/screenshots",
    f"Upload one PNG or JPEG screenshot of at most {uploads.MAX_SCREENSHOT_BYTES} bytes (V1)",
    description="The file is checked to be a PNG or JPEG by its bytes (signature and structure, down to its "
    "dimensions), never by its name or content type.",
    body={"multipart/form-data": SCREENSHOT_UPLOAD},
    replies={201: (replies.Screenshot, "Kept (the same bytes uploaded again return the kept one)")},
    errors=(400, 401, 404, 413, 415),
)
@admin_required
def post_screenshot(node_id: str):
    """V1: upload one PNG or JPEG screenshot (multipart field `file`)."""
    # The upload route alone reads more than MODELFORGE_MAX_REQUEST_BYTES: a whole screenshot.
    request.max_content_length = uploads.MAX_UPLOAD_REQUEST_BYTES
    if request.content_length is not None and request.content_length > uploads.MAX_UPLOAD_REQUEST_BYTES:
        raise uploads.too_large(request.content_length)
    if request.mimetype != "multipart/form-data":
        raise ApiError(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            f"Expected Content-Type multipart/form-data, got {request.mimetype or 'none'}.",
            "Upload the screenshot as multipart/form-data in the field `file`.",
        )
    upload = request.files.get("file")
    if upload is None:
        raise ApiError(
            400,
            "VALIDATION_FAILED",
            "file: is required",
            "Upload the screenshot as multipart/form-data in the field `file`.",
            field="file",
        )
    try:
        data = upload.read(uploads.MAX_SCREENSHOT_BYTES + 1)
    finally:
        for part in request.files.values():  # the parser's spooled temporary files, at once
            part.close()
    shot = acceptance.add_screenshot(node_id, upload.filename or "", data, audit.OPERATOR)
    return json_response(shot.to_dict(), 201)


@operations.get(
    "/admin/nodes/<node_id>/acceptance/screenshots/<int:screenshot_id>",
    "One uploaded screenshot's file, to the operator only (V1)",
    path_parameters={"screenshot_id": {"type": "integer", "minimum": 1, "maximum": uploads.MAX_SCREENSHOT_ID}},
    replies={200: ({content_type: FILE for content_type in uploads.EXTENSIONS}, "The image")},
    errors=(401, 404),
)
@admin_required
def get_screenshot(node_id: str, screenshot_id: int):
    """V1: one uploaded screenshot's file, to the operator only."""
    return responses.screenshot_response(node_id, screenshot_id)


@operations.get(
    "/admin/nodes/<node_id>/acceptance/export",
    "The node's evidence bundle: a zip of report.json, report.html and screenshots/ (V1)",
    replies={200: ({"application/zip": FILE}, "The bundle")},
    errors=(401, 404),
)
@admin_required
def export_acceptance(node_id: str):
    """V1: the node's evidence as one zip (report.json, report.html, screenshots/)."""
    return responses.bundle_response(node_id)
