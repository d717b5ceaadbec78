"""Request bodies: strict JSON parsing, and the 400 that names a field (A5). The bodies: app/api/bodies.py."""

from __future__ import annotations

import json
from typing import Any

from flask import request

from app.api.errors import ApiError


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def json_object() -> dict[str, Any]:
    """The request body as a JSON object, or a 4xx naming what is wrong with it."""
    if request.mimetype != "application/json":
        raise ApiError(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            f"Expected Content-Type application/json, got {request.mimetype or 'none'}.",
            "Send the body as JSON with Content-Type: application/json.",
        )
    raw = request.get_data(cache=False)
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ApiError(
            400, "MALFORMED_JSON", "The request body is not valid UTF-8 JSON.", "Send a JSON object."
        ) from None
    if not isinstance(body, dict):
        raise ApiError(400, "BODY_NOT_OBJECT", "The request body must be a JSON object.", "Send a JSON object.")
    return body


def invalid(field: str, message: str) -> ApiError:
    """A 400 that names the offending field."""
    return ApiError(
        400,
        "VALIDATION_FAILED",
        f"{field}: {message}",
        f"Fix {field} and send the request again.",
        field=field,
    )
