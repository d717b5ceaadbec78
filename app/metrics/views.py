"""GET /metrics: the operator key or MODELFORGE_METRICS_TOKEN, never anonymous (O1, P2)."""

from __future__ import annotations

import os

from flask import Blueprint, Response, request
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from app import tokens
from app.api import operations
from app.api.auth import ADMIN_HEADER, ADMIN_SCHEME
from app.api.errors import error_response
from app.config import current_settings
from app.db import begin_read_only
from app.extensions import db
from app.metrics import PATH, collect, http, inference
from app.timeutil import utcnow

bp = Blueprint("metrics", __name__)
METRICS_SCHEME = "metricsToken"  # MODELFORGE_METRICS_TOKEN as a bearer token (app/api/openapi.py)
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
NEXT_STEP = (
    "Send `Authorization: Bearer <MODELFORGE_METRICS_TOKEN>` (Prometheus: authorization.credentials_file) "
    f"or the operator API key as a bearer token or in {ADMIN_HEADER}."
)


def _presented() -> str | None:
    """The secret the scraper sent: a bearer token, else the admin header."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and secret.strip():
        return secret.strip()
    return request.headers.get(ADMIN_HEADER) or None


def _refusal() -> Response | None:
    """None when the request may read the metrics, else the 401 to answer."""
    presented = _presented()
    if presented is None:
        refusal = error_response(401, "METRICS_TOKEN_REQUIRED", "GET /metrics needs a token.", NEXT_STEP)
    else:
        settings = current_settings()
        # Both comparisons always run, in constant time, so timing tells nothing about which failed.
        accepted = [tokens.same_secret(settings.operator_api_key, presented)]
        if settings.metrics_token is not None:
            accepted.append(tokens.same_secret(settings.metrics_token, presented))
        if any(accepted):
            return None
        refusal = error_response(
            401, "METRICS_TOKEN_INVALID", "The token sent is neither the metrics token nor the operator key.", NEXT_STEP
        )
    refusal.headers["WWW-Authenticate"] = "Bearer"
    return refusal


def http_registry() -> CollectorRegistry:
    """The HTTP and inference series of every worker (multi-process mode), or of this process alone."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROCESS_DIR_ENV):
        multiprocess.MultiProcessCollector(registry)  # sums every worker's files, the dead ones' included
    else:  # flask run, the tests: one process, its own counters
        for series in (http.REQUESTS, http.LATENCY, *inference.SERIES):
            registry.register(series)
    return registry


def exposition() -> bytes:
    """The fleet from the database, then the HTTP series, in the text format (0.0.4)."""
    fleet = collect.render(collect.collect(current_settings(), utcnow()))
    return fleet.encode("utf-8") + generate_latest(http_registry())


@operations.route(
    bp,
    "GET",
    PATH,
    "Prometheus metrics (O1): fleet, GPU, job, sweep and HTTP series",
    description="The Prometheus text format. Never anonymous: the operator key (in its header or as a bearer "
    "token) or MODELFORGE_METRICS_TOKEN as a bearer token.",
    security=(ADMIN_SCHEME, METRICS_SCHEME),
    replies={200: ({"text/plain": {"type": "string"}}, "The text exposition format 0.0.4")},
    errors=(401,),
)
def metrics():
    """The Prometheus text exposition of every series, read now."""
    refusal = _refusal()
    if refusal is not None:
        return refusal
    begin_read_only()
    try:
        body = exposition()
    finally:
        db.session.rollback()
    # The classic text format (0.0.4), which every Prometheus since 2.0 reads.
    response = Response(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
    response.headers["Cache-Control"] = "no-store"
    return response
