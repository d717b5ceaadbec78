"""The JSON API under /api/v1, and /healthz."""

from __future__ import annotations

import re

from flask import Blueprint, Flask, current_app, jsonify, request
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from werkzeug.exceptions import HTTPException

from app import rules
from app.api.errors import ApiError, domain_error_response, error_response
from app.db import begin_read_only
from app.errors import DomainError
from app.extensions import csrf, db

bp = Blueprint("api", __name__, url_prefix="/api/v1")


def _is_api_request() -> bool:
    return request.path.startswith("/api/") or request.path == "/healthz"


_HTTP_CODES = {
    400: ("BAD_REQUEST", "Send a well-formed request."),
    404: ("NOT_FOUND", "Check the path against GET /api/v1/openapi.json."),
    405: ("METHOD_NOT_ALLOWED", "Check the method against GET /api/v1/openapi.json."),
    413: ("REQUEST_TOO_LARGE", "Send a smaller body."),
    415: ("UNSUPPORTED_MEDIA_TYPE", "Send Content-Type: application/json."),
}


@bp.before_request
def _before_api_request():
    """Refuse undocumented query parameters (A5); start GETs as readers, not writers."""
    from app.api.openapi import query_parameters
    from app.api.validation import invalid

    if request.args and request.url_rule is not None:
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", request.url_rule.rule)
        unknown = sorted(set(request.args) - query_parameters(path, request.method.lower()))
        if unknown:
            raise invalid(unknown[0][:100], "is not a known query parameter")
        for name, value in request.args.items():
            if not rules.is_text(value):  # NUL cannot even be compared in PostgreSQL text (P5)
                raise invalid(name, f"must be {rules.TEXT_RULE}")
    if request.method in ("GET", "HEAD"):
        begin_read_only()


def init_app(app: Flask) -> None:
    """Register the API blueprints and their JSON error handlers."""
    from app.api import agent, audit_events, enrollments, health, nodes, openapi  # noqa: F401

    csrf.exempt(bp)  # STYLE 6: the API authenticates by header, never by cookie.
    csrf.exempt(health.bp)
    app.register_blueprint(bp)
    app.register_blueprint(health.bp)

    @app.errorhandler(ApiError)
    def on_api_error(error: ApiError):
        db.session.rollback()
        return error_response(error.status, error.code, error.message, error.next_step, **error.extra)

    @app.errorhandler(DomainError)
    def on_domain_error(error: DomainError):
        db.session.rollback()
        if not _is_api_request():
            from app.console import render_domain_error

            return render_domain_error(error)
        return domain_error_response(error)

    @app.errorhandler(HTTPException)
    def on_http_error(error: HTTPException):
        if not _is_api_request():
            from app.console import render_http_error

            return render_http_error(error)
        code, next_step = _HTTP_CODES.get(error.code or 500, ("HTTP_ERROR", "See the message."))
        response = error_response(error.code or 500, code, error.description or error.name, next_step)
        if error.code == 405 and error.valid_methods:
            response.headers["Allow"] = ", ".join(error.valid_methods)
        return response

    @app.errorhandler(OperationalError)
    def on_database_unavailable(error: OperationalError):
        db.session.rollback()
        current_app.logger.warning("database unavailable: %s", type(error.orig).__name__)
        response = error_response(
            503,
            "DATABASE_UNAVAILABLE",
            "The database is busy or unreachable; nothing was changed.",
            "Retry shortly; if it persists, check the database server and MODELFORGE_DATABASE_URL.",
        )
        response.headers["Retry-After"] = "2"
        return response

    @app.errorhandler(SQLAlchemyError)
    @app.errorhandler(500)
    def on_internal_error(error):
        # The 500 handler rolls the session back (microblog); the body never echoes input.
        db.session.rollback()
        original = getattr(error, "original_exception", error)
        current_app.logger.error(
            "unhandled %s on %s %s", type(original).__name__, request.method, request.path, exc_info=original
        )
        if not _is_api_request():
            return "Internal server error", 500
        return error_response(
            500, "INTERNAL_ERROR", "The control plane hit an unexpected error.", "Check the server log."
        )


def json_response(payload: object, status: int = 200):
    """A JSON response that no cache keeps (replies may carry a secret shown once)."""
    response = jsonify(payload)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    return response
