"""Request bodies: strict JSON parsing, and the 400 that names a field (A5). The bodies: app/api/bodies.py."""

from __future__ import annotations

import json
import operator
import re
from itertools import accumulate, chain
from typing import Any

from flask import request

from app.api.errors import ApiError

# No body the API declares nests deeper than a handful of levels; a deeper one is refused before
# parsing, because Python's parser takes ~990 levels and everything after it (validation, storage,
# rendering) recurses again and fails with a 500 (P5).
MAX_JSON_DEPTH = 32
# The brackets, mapped to one opening and one closing byte; the quotes kept to find the strings.
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'[]{}"'))
_RUN = re.compile(rb"\(+|\)+")


def too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text nests arrays and objects more than `limit` deep.

    Exact for well-formed JSON (anything else is refused by the parser after it) and linear, at C
    speed throughout (issue 22: a per-token Python loop took 3.4 s on a 4 MiB `[[],[],…]`):
    escapes go first (`\\\\` then `\\"`, left to right as JSON reads them), then every byte but
    brackets and quotes, then what lies between quotes (every other piece of a split). Of the
    bracket text, removing every `()` takes exactly one level off the deepest nesting, at once for
    all the shallow ones; when that stops paying, the depth of what is left is counted over runs of
    `(` and `)` by `accumulate`, never per byte in Python. A body with no more brackets than the
    limit cannot be deeper, which two counts tell: the heartbeat's common case costs no scan at all.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = raw.translate(_BRACKETS, _NOT_STRUCTURE)
    if b'"' in brackets:
        brackets = b"".join(brackets.split(b'"')[0::2])
    while brackets and limit > 0:
        shallower = brackets.replace(b"()", b"")
        long_runs = len(shallower) * 4 > len(brackets) * 3  # a quarter or less went: count the runs instead
        brackets, limit = shallower, limit - 1
        if long_runs:
            break
    if not brackets:
        return False
    runs = _RUN.findall(b"(" + brackets + b")")  # opens first, closes last: they alternate in pairs
    opened, closed = map(len, runs[0::2]), map(operator.neg, map(len, runs[1::2]))
    return max(accumulate(chain.from_iterable(zip(opened, closed, strict=True)))) > limit + 1


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
