"""GET /metrics for Prometheus (O1): fleet series read from the database on each scrape, HTTP
series counted in each process (prometheus_client's multi-process mode under gunicorn)."""

from __future__ import annotations

from flask import Flask

PATH = "/metrics"


def init_app(app: Flask) -> None:
    """Serve GET /metrics and count every request by route template, method and status."""
    from app.extensions import csrf
    from app.metrics import http, views

    http.instrument(app)
    csrf.exempt(views.bp)  # read by a bearer token, never by a cookie
    app.register_blueprint(views.bp)
