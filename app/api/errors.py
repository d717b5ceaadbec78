"""One JSON error shape for the whole API (P5): {"error": {code, message, next_step}}."""

from __future__ import annotations

from flask import Response, jsonify

from app.errors import DomainError

STATUS_BY_CODE = {
    "ENROLLMENT_NOT_FOUND": 404,
    "NODE_NOT_FOUND": 404,
    "ENROLLMENT_NOT_PENDING": 409,
    "ENROLLMENT_TOKEN_INVALID": 401,
    "ENROLLMENT_TOKEN_CONSUMED": 409,
    "ENROLLMENT_TOKEN_REVOKED": 410,
    "ENROLLMENT_TOKEN_EXPIRED": 410,
    "API_ORIGIN_MISMATCH": 409,
    "NODE_ALREADY_ENROLLED": 409,
    "CREDENTIAL_INVALID": 401,
    "CREDENTIAL_REVOKED": 401,
    "NODE_DISABLED": 403,
    "NO_ACTIVE_CREDENTIAL": 409,
}


class ApiError(Exception):
    """An HTTP-level refusal raised inside a view."""

    def __init__(self, status: int, code: str, message: str, next_step: str, **extra: object):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.next_step = next_step
        self.extra = extra


def error_response(status: int, code: str, message: str, next_step: str, **extra: object) -> Response:
    """The JSON error body every API refusal uses; `extra` keys sit beside `error`."""
    body: dict[str, object] = {"error": {"code": code, "message": message, "next_step": next_step}}
    for key, value in extra.items():
        if key == "field":
            body["error"]["field"] = value
        else:
            body[key] = value
    response = jsonify(body)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    return response


def domain_error_response(error: DomainError) -> Response:
    """Map a domain refusal to its HTTP status."""
    status = STATUS_BY_CODE.get(error.code, 400)
    response = error_response(status, error.code, error.message, error.next_step, **error.extra)
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response
