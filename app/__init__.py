"""ModelForge control plane: the Flask application factory.

The modules at this level are the platform every part runs on, and nothing else: settings
(`config`), the database (`db`, `extensions`), the processes (`gunicorn_conf`, `scheduler`,
`instance`, `cli`), one error type and its app-wide handlers (`errors`, `web_errors`), time,
secrets, the audit trail, the public API origin, the rules every entry point applies and release
manifests. What the control plane does lives in packages: `nodes` (the node lifecycle), `jobs`,
`acceptance`, `alerts` and `metrics`; `api` and `console` are its two faces, `models` its tables.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from flask import Flask, request
from werkzeug.middleware.proxy_fix import ProxyFix

from app import api, cli, console, db, metrics, web_errors
from app.config import ConfigError, load_settings
from app.errors import DomainError
from app.extensions import compress, csrf, migrate

__all__ = ["ConfigError", "create_app"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# C5: what is compressed: the static assets and the API's JSON. Never HTML (a console page carries
# the session's CSRF token beside text a request can echo: BREACH) and never a streamed response
# (text/event-stream, the OpenAI answers: read piece by piece as they come).
COMPRESSION = {
    "COMPRESS_MIMETYPES": [
        "text/css",
        "text/javascript",
        "application/javascript",
        "image/svg+xml",
        "application/json",
    ],
    "COMPRESS_ALGORITHM": ["br", "gzip"],
    "COMPRESS_STREAMS": False,
}


def create_app(config: Mapping[str, str] | None = None) -> Flask:
    """Build the control plane; `config` overrides MODELFORGE_* variables (tests use it)."""
    env = {**os.environ, **(config or {})}
    app = Flask(
        __name__,
        instance_path=env.get("MODELFORGE_INSTANCE_PATH") or str(PROJECT_ROOT / "instance"),
        instance_relative_config=True,
        template_folder=str(PROJECT_ROOT / "templates"),
        static_folder=str(PROJECT_ROOT / "static"),
    )
    settings = load_settings(env, Path(app.instance_path))
    app.config.update(settings.as_flask_config())
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = db.engine_options(settings.database_url)
    app.json.sort_keys = False

    if settings.trusted_proxy_hops:
        # Behind N reverse proxies, believe the last N X-Forwarded-* hops: the client address
        # (login limit), the scheme (Secure cookie, Flask-WTF's HTTPS checks) and the host (E3).
        app.wsgi_app = ProxyFix(
            app.wsgi_app,
            x_for=settings.trusted_proxy_hops,
            x_proto=settings.trusted_proxy_hops,
            x_host=settings.trusted_proxy_hops,
            x_port=settings.trusted_proxy_hops,
        )
    app.url_value_preprocessor(_ids_are_uuids)
    _configure_logging(app)
    db.init_app(app)
    migrate.init_app(app, db.db, directory=str(MIGRATIONS))
    csrf.init_app(app)
    app.config.update(COMPRESSION)
    compress.init_app(app)
    app.after_request(_static_files_in_memory)  # after_request hooks run last-first: before compress
    api.init_app(app)
    console.init_app(app)
    metrics.init_app(app)
    web_errors.init_app(app)
    cli.init_app(app)
    app.after_request(_no_sniffing)
    return app


def _static_files_in_memory(response):
    """A static file is read whole, so it is compressed as a body rather than as a stream (Flask
    sends files streamed; Flask-Compress's stream path would drop the file's close). They are small."""
    if request.endpoint == "static" and response.status_code == 200 and response.direct_passthrough:
        response.direct_passthrough = False
        response.make_sequence()  # keeps the file's close as a call_on_close
    return response


def _no_sniffing(response):
    """Every response, API, console, static or error, is read as the type it declares."""
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


_ID_ARGUMENTS = (
    ("node_id", "NODE_NOT_FOUND", "node"),
    ("enrollment_id", "ENROLLMENT_NOT_FOUND", "enrolment"),
    ("job_id", "JOB_NOT_FOUND", "job"),
    ("root_id", "STORAGE_ROOT_NOT_FOUND", "storage root"),
    ("api_key_id", "API_KEY_NOT_FOUND", "API key"),
    ("deployment_id", "DEPLOYMENT_NOT_FOUND", "deployment"),
)


def _ids_are_uuids(endpoint: str | None, values: dict[str, str] | None) -> None:
    """The ids of _ID_ARGUMENTS are UUIDs: any other id in a URL is not found, before any query.

    PostgreSQL cannot even compare a NUL in text, so this once surfaced as a 500 (P5). The API
    answers the domain error as JSON, the console as a page.
    """
    for name, code, what in _ID_ARGUMENTS:
        value = (values or {}).get(name)
        if value is None:
            continue
        try:
            uuid.UUID(value)
        except ValueError:
            raise DomainError(code, f"No {what} has id {value[:100]!r}.", "Ids are UUIDs; list them first.") from None


def _configure_logging(app: Flask) -> None:
    """Log through gunicorn's handlers when served by it, else to stderr."""
    gunicorn_logger = logging.getLogger("gunicorn.error")
    for logger in (app.logger, logging.getLogger("modelforge")):
        if gunicorn_logger.handlers:
            logger.handlers = gunicorn_logger.handlers
            logger.setLevel(gunicorn_logger.level)
        else:
            logger.setLevel(logging.INFO)
