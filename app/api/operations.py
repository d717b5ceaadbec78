"""Each operation of the API declared once, beside its view (A5).

`@operations.post(rule, summary, body=…, replies=…, errors=…)` registers the route with Flask and
records what the document says of it: its summary, the request model (app/api/bodies.py), the
reply model per status (app/api/replies.py) and the errors it may answer with. app/api/openapi.py
assembles the document from these records alone, so a view and its description sit together and a
route cannot be added without one (tests/unit/test_openapi.py compares them with Flask's routes).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Blueprint
from pydantic import BaseModel

from app import rules
from app.api import bp

# What a status answers with: a reply model (a JSON body), {media type: schema} for any other body
# (a file, text), or None for no body at all — and the words the document says of it.
Carried = type[BaseModel] | Mapping[str, dict] | None
Replies = Mapping[int, tuple[Carried, str]]

# A query value: printable text, as the API's before_request checks every one (P5).
TEXT = {"type": "string", "pattern": rules.TEXT_PATTERN}

_PATH_PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def openapi_path(rule: str) -> str:
    """A Flask rule as OpenAPI writes its path: `/jobs/<job_id>` → `/jobs/{job_id}`."""
    return _PATH_PARAMETER.sub(r"{\1}", rule)


@dataclass(frozen=True)
class Operation:
    """What the document says of one route and method."""

    path: str
    method: str
    summary: str
    description: str | None
    security: tuple[str, ...]
    body: type[BaseModel] | Mapping[str, dict] | None
    query: Mapping[str, dict]
    path_parameters: Mapping[str, dict]
    replies: Replies
    errors: tuple[int, ...]


OPERATIONS: list[Operation] = []


def route(
    blueprint: Blueprint,
    method: str,
    rule: str,
    summary: str,
    *,
    replies: Replies,
    errors: tuple[int, ...] = (),
    body: type[BaseModel] | Mapping[str, dict] | None = None,
    query: Mapping[str, dict] | None = None,
    path_parameters: Mapping[str, dict] | None = None,
    security: tuple[str, ...] | None = None,
    description: str | None = None,
) -> Callable:
    """Register `rule` on `blueprint` for `method`, and record the operation for the document.

    `body` is the request model, or {media type: schema} for a body that is not JSON (an upload);
    `errors` the error statuses, each in the one error shape (a `replies` entry of the same status
    says more about one); `query` and `path_parameters` the schema of each by name (a path parameter
    is text unless said otherwise); `security` the schemes that admit a caller — by default the one
    the view's own check names (`admin_required` sets `security_schemes`).
    """

    def register(view: Callable) -> Callable:
        names = _PATH_PARAMETER.findall(rule)
        OPERATIONS.append(
            Operation(
                path=openapi_path((blueprint.url_prefix or "") + rule),
                method=method.lower(),
                summary=summary,
                description=description,
                security=security if security is not None else getattr(view, "security_schemes", ()),
                body=body,
                query=dict(query or {}),
                path_parameters={name: (path_parameters or {}).get(name, {"type": "string"}) for name in names},
                replies=replies,
                errors=errors,
            )
        )
        return blueprint.route(rule, methods=[method])(view)

    return register


def get(rule: str, summary: str, **declared: Any) -> Callable:
    """A GET operation of the API blueprint (/api/v1); `declared` as `route` takes it."""
    return route(bp, "GET", rule, summary, **declared)


def post(rule: str, summary: str, **declared: Any) -> Callable:
    """A POST operation of the API blueprint (/api/v1); `declared` as `route` takes it."""
    return route(bp, "POST", rule, summary, **declared)


def delete(rule: str, summary: str, **declared: Any) -> Callable:
    """A DELETE operation of the API blueprint (/api/v1); `declared` as `route` takes it."""
    return route(bp, "DELETE", rule, summary, **declared)
