"""The HTML console (spec C1–C5): server-rendered pages, HTMX partials, operator sessions."""

from __future__ import annotations

from datetime import timedelta

from flask import Blueprint, Flask, render_template, request
from flask.sessions import SecureCookieSessionInterface

from app.config import current_settings
from app.console import formatting

bp = Blueprint("console", __name__)

# Strict by default: every script and style is our own file (htmx is vendored; no inline JS).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)


class ConsoleSessionInterface(SecureCookieSessionInterface):
    """C1: the session cookie is Secure whenever the console is served over HTTPS."""

    def get_cookie_secure(self, app: Flask) -> bool:
        """Secure when configured, when this request came over HTTPS, or when the public origin is https."""
        public_origin = current_settings(app).public_api_origin or ""
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure or public_origin.startswith("https:")


def is_htmx_fragment_request() -> bool:
    """An htmx request that wants a fragment: HX-Request set and not a boosted navigation."""
    return request.headers.get("HX-Request") == "true" and request.headers.get("HX-Boosted") != "true"


def page_or_partial(page: str, partial: str, **context):
    """STYLE 5: the full page, or only its partial for an htmx request (the page includes it)."""
    return render_template(partial if is_htmx_fragment_request() else page, **context)


def render_error(status: int, title: str, message: str, next_step: str, code: str | None = None):
    """An HTML error: a fragment for htmx (swapped in place), else a whole page; `code` is the
    machine-readable code an API client would get, shown small under the words."""
    page = page_or_partial(
        "error.html", "partials/_error.html", title=title, message=message, next_step=next_step, code=code
    )
    return page, status


def init_app(app: Flask) -> None:
    """Register the console blueprint, its session cookie policy and response headers."""
    from app.console import (  # noqa: F401  (views register on bp)
        acceptance,
        api_keys,
        audit_log,
        auth,
        benchmarks,
        deployments,
        enroll,
        jobs,
        node_page,
        nodes,
        settings,
    )

    app.session_interface = ConsoleSessionInterface()
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_NAME="modelforge_session",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
        # One token per session, not per hour: a console tab left open all day still works.
        WTF_CSRF_TIME_LIMIT=None,
    )
    app.register_blueprint(bp)
    app.jinja_env.filters.update(formatting.FILTERS)

    @app.after_request
    def console_headers(response):
        if request.path.startswith(("/api/", "/healthz", "/static/")):
            return response
        # One URL serves a page or a fragment (STYLE 5), so caches must key on HX-Request; and
        # nothing the console shows may sit in a cache or history (C4: the token reveal).
        response.vary.add("HX-Request")
        response.headers["Cache-Control"] = "no-store"
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("X-Frame-Options", "DENY")
        return response

    @app.context_processor
    def console_context():
        from app.console.auth import signed_in

        return {"signed_in": signed_in()}
