"""Every app-wide error handler (P5): the API's JSON error shape on API paths, the console's page elsewhere.

The API and the console each own how an error looks (`app.api.errors.error_response`,
`app.console.render_error`); this module owns which status and words each error gets, so
neither package needs the other.
"""

from __future__ import annotations

from flask import Flask, current_app, make_response, request
from flask_wtf.csrf import CSRFError
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from werkzeug.exceptions import HTTPException

from app.api.errors import ApiError, error_response
from app.console import render_error
from app.errors import DomainError
from app.extensions import db
from app.metrics import PATH as METRICS_PATH

# P5: the HTTP status of each domain refusal; any other code is a 400.
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
    "STORAGE_ROOT_NOT_FOUND": 404,
    "STORAGE_ROOT_EXISTS": 409,
    "STORAGE_ROOT_IN_USE": 409,
    "STORAGE_ROOT_NOT_ON_NODE": 409,
    "STORAGE_ROOT_UNAVAILABLE": 409,  # J1: the agent reports it cannot use the root
    "JOB_NOT_FOUND": 404,
    "JOB_FINISHED": 409,
    "JOB_NOT_RETRYABLE": 409,
    "JOB_LEASE_LOST": 409,
    "ARTIFACT_NOT_FOUND": 404,
    "ARTIFACT_NOT_ON_NODE": 409,
    "NODE_RATE_LIMITED": 429,
    "NODE_NOT_VALIDATED": 409,
    "INSPECT_TOO_LARGE": 413,
    "SCREENSHOT_TOO_LARGE": 413,
    "SCREENSHOT_NOT_FOUND": 404,
    "SCHEMA_OUT_OF_DATE": 503,  # issue 22: the database is not at the code's revision
    "DATABASE_NOT_WRITABLE": 503,  # issue 22: GET /healthz's write probe failed
    "API_KEY_NOT_FOUND": 404,
    "API_KEY_INVALID": 401,  # S1: unknown, revoked or expired client key
    "DEPLOYMENT_NOT_FOUND": 404,
    "NODE_DRAINING": 409,  # S3: it finishes what runs and takes no new job or deployment
    "ARTIFACT_IN_USE": 409,  # J5: a deployment that is not stopped, or an unfinished runtime job, reads it
    "ARTIFACT_DELETING": 409,  # J5: its files are being removed
    "DEPLOYMENT_NAME_TAKEN": 409,  # S2: a deployment that is not stopped holds the name
    "NO_NODE_FITS": 409,
    "DEPLOYMENT_NOT_MOVABLE": 409,  # S3: stopping or stopped, or already on the node named
    "model_not_found": 404,  # S4: OpenAI's own code, as its clients expect it
    "DEPLOYMENT_NOT_READY": 503,  # S4: loading, or failed; the message says which
    "NODE_UNAVAILABLE": 503,  # S5: the serving node has no relay connection now
    "TOO_MANY_STREAMS": 429,  # S5: a deployment's or the process's bound on streams in flight
    "INVALID_PARAMETER": 400,  # S4: a field of an OpenAI request
    # S4: a generation the node refused or could not finish, in the worker's own codes.
    "WORKER_BUSY": 429,
    "WORKER_DEPLOYMENT_NOT_READY": 503,
    "WORKER_DEPLOYMENT_UNKNOWN": 503,
    "GENERATION_FAILED": 502,  # S3: no node can serve it; the message names each node and why
}

# The API's code and next step for errors Werkzeug raises before or instead of a view.
_HTTP_CODES = {
    400: ("BAD_REQUEST", "Send a well-formed request."),
    404: ("NOT_FOUND", "Check the path against GET /api/v1/openapi.json."),
    405: ("METHOD_NOT_ALLOWED", "Check the method against GET /api/v1/openapi.json."),
    413: ("REQUEST_TOO_LARGE", "Send a smaller body."),
    415: ("UNSUPPORTED_MEDIA_TYPE", "Send Content-Type: application/json."),
}

# C5: the console's words for an error's status: the page's heading, over the refusal's message.
HTML_TITLES = {
    400: "Request refused",
    401: "Not signed in",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed here",
    409: "Not possible now",
    410: "No longer valid",
    413: "Too large",
    415: "Unsupported content",
    422: "Request refused",
    429: "Too many requests",
    502: "The node could not do it",
    503: "Unavailable",
}
# Werkzeug's own texts talk about "the server" and "the URL"; a console reader gets these instead.
_HTML_HTTP_WORDS = {
    404: ("There is no console page at this address.", "Check the address, or start again from Hardware → Nodes."),
    405: ("This address does not take that kind of request.", "Use the console's own links and buttons."),
}

DATABASE_UNAVAILABLE = (
    "The database is busy or unreachable; nothing was changed.",
    "Retry shortly; if it persists, check the database server and MODELFORGE_DATABASE_URL.",
)
INTERNAL_ERROR = ("The control plane hit an unexpected error.", "Check the server log.")
RETRY_AFTER_SECONDS = "2"


def is_api_request() -> bool:
    """Whether this request is the API's (JSON errors) rather than the console's (HTML errors)."""
    return request.path.startswith(("/api/", "/v1/")) or request.path in ("/healthz", METRICS_PATH)


def on_api_error(error: ApiError):
    """An HTTP-level refusal raised by an API view."""
    db.session.rollback()
    if not is_api_request():
        return _render_refusal(error.status, error.code, error.message, error.next_step)
    return error_response(error.status, error.code, error.message, error.next_step, **error.extra)


def on_domain_error(error: DomainError):
    """A domain refusal, with the status its code maps to."""
    db.session.rollback()
    status = STATUS_BY_CODE.get(error.code, 400)
    if not is_api_request():
        return _render_refusal(status, error.code, error.message, error.next_step)
    response = error_response(status, error.code, error.message, error.next_step, **error.extra)
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def on_http_error(error: HTTPException):
    """404, 405, 413… raised by Werkzeug or `abort()`."""
    if not is_api_request():
        if error.code and error.code < 400:
            return error
        status = error.code or 500
        message, next_step = _HTML_HTTP_WORDS.get(status, (error.description or error.name, "Go back and try again."))
        response = make_response(render_error(status, HTML_TITLES.get(status, error.name), message, next_step))
        if status == 405 and error.valid_methods:
            response.headers["Allow"] = ", ".join(error.valid_methods)
        return response
    code, next_step = _HTTP_CODES.get(error.code or 500, ("HTTP_ERROR", "See the message."))
    response = error_response(error.code or 500, code, error.description or error.name, next_step)
    if error.code == 405 and error.valid_methods:
        response.headers["Allow"] = ", ".join(error.valid_methods)
    return response


def _render_refusal(status: int, code: str, message: str, next_step: str):
    """A domain or API refusal as the console shows it: words for a heading, the code beneath."""
    return render_error(status, HTML_TITLES.get(status, "Request refused"), message, next_step, code=code)


def on_csrf_error(error: CSRFError):
    """C1: a console form or htmx request without a valid CSRF token changes nothing."""
    if is_api_request():  # the API is CSRF-exempt (STYLE 6); were it not, it would still answer JSON
        return on_http_error(error)
    return render_error(
        400,
        "Form expired",
        "This form's security token is missing or stale, so nothing was changed.",
        "Reload the page and try again.",
    )


def on_database_unavailable(error: OperationalError):
    """503 with Retry-After: the database is down or locked, not the request wrong."""
    db.session.rollback()
    current_app.logger.warning("database unavailable: %s", type(error.orig).__name__)
    message, next_step = DATABASE_UNAVAILABLE
    if is_api_request():
        response = error_response(503, "DATABASE_UNAVAILABLE", message, next_step)
    else:
        response = make_response(render_error(503, "Database unavailable", message, next_step))
    response.headers["Retry-After"] = RETRY_AFTER_SECONDS
    return response


def on_internal_error(error: Exception):
    """Any other failure: roll back and log it; the body never echoes input."""
    # The 500 handler rolls the session back (microblog).
    db.session.rollback()
    original = getattr(error, "original_exception", error)
    current_app.logger.error(
        "unhandled %s on %s %s", type(original).__name__, request.method, request.path, exc_info=original
    )
    message, next_step = INTERNAL_ERROR
    if not is_api_request():
        return render_error(500, "Internal server error", message, next_step)
    return error_response(500, "INTERNAL_ERROR", message, next_step)


def init_app(app: Flask) -> None:
    """Register every app-wide error handler; Flask picks the most specific class for each error."""
    app.register_error_handler(ApiError, on_api_error)
    app.register_error_handler(DomainError, on_domain_error)
    app.register_error_handler(HTTPException, on_http_error)
    app.register_error_handler(CSRFError, on_csrf_error)  # a BadRequest, so it beats HTTPException
    app.register_error_handler(OperationalError, on_database_unavailable)  # beats SQLAlchemyError
    app.register_error_handler(SQLAlchemyError, on_internal_error)
    app.register_error_handler(500, on_internal_error)
