"""The JSON API under /api/v1, and /healthz."""

from __future__ import annotations

import importlib

from flask import Blueprint, Flask, jsonify, request

from app import rules
from app.db import begin_read_only
from app.extensions import csrf

bp = Blueprint("api", __name__, url_prefix="/api/v1")


@bp.before_request
def _before_api_request():
    """Refuse undocumented query parameters (A5); start GETs as readers, not writers."""
    from app.api.openapi import query_parameters
    from app.api.operations import openapi_path
    from app.api.validation import invalid

    if request.args and request.url_rule is not None:
        path = openapi_path(request.url_rule.rule)
        unknown = sorted(set(request.args) - query_parameters(path, request.method.lower()))
        if unknown:
            raise invalid(unknown[0][:100], "is not a known query parameter")
        for name, value in request.args.items():
            if not rules.is_text(value):  # NUL cannot even be compared in PostgreSQL text (P5)
                raise invalid(name, f"must be {rules.TEXT_RULE}")
    if request.method in ("GET", "HEAD"):
        begin_read_only()


# The API's view modules, one per resource: importing one registers its routes and declares its
# operations (app/api/operations.py), which app/api/openapi.py assembles into the document.
VIEW_MODULES = (
    "acceptance",
    "agent",
    "agent_deployments",
    "agent_relay",
    "agent_jobs",
    "api_keys",
    "audit_events",
    "deployments",
    "enrollments",
    "health",
    "jobs",
    "nodes",
    "openapi",
)


def import_views() -> None:
    """Import every view module (once; later calls cost a dictionary lookup each)."""
    for name in VIEW_MODULES:
        importlib.import_module(f"app.api.{name}")


def init_app(app: Flask) -> None:
    """Register the API blueprints (their errors are answered by app.web_errors)."""
    import_views()
    from app.api import health, openai

    csrf.exempt(bp)  # STYLE 6: the API authenticates by header, never by cookie.
    csrf.exempt(health.bp)
    app.register_blueprint(bp)
    app.register_blueprint(health.bp)
    openai.init_app(app)  # S4: /v1, OpenAI's paths and error shape


def json_response(payload: object, status: int = 200):
    """A JSON response that no cache keeps (replies may carry a secret shown once)."""
    response = jsonify(payload)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    return response
