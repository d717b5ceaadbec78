"""Request bodies: strict JSON parsing, and the 400 that names a field (A5). The bodies: app/api/bodies.py."""

from __future__ import annotations

import json
import re
from typing import Any

from flask import request

from app.api.errors import ApiError

# No body the API declares nests deeper than a handful of levels; a deeper one is refused before
# parsing, because Python's parser takes ~990 levels and everything after it (validation, storage,
# rendering) recurses again and fails with a 500 (P5).
MAX_JSON_DEPTH = 32
# A string (skipped whole, so brackets inside it do not count) or one bracket.
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[][{}]')


def too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text nests arrays and objects more than `limit` deep.

    A body with no more brackets than the limit cannot be deeper, which two C-speed counts tell:
    the heartbeat's common case costs no scan at all.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for token in _JSON_TOKEN.finditer(raw):
        bracket = token[0]
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif bracket in (b"]", b"}"):
            depth -= 1
    return False


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
    if too_deep(raw):
        raise ApiError(
            400,
            "JSON_TOO_DEEP",
            f"The request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep.",
            "Send the body as the API documents it.",
        )
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
