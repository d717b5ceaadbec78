"""One JSON error shape for the whole API (P5): {"error": {code, message, next_step}}."""

from __future__ import annotations

from flask import Response, jsonify


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
