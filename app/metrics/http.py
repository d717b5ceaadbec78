"""HTTP request counts and latencies by route template (O1), safe across gunicorn workers.

Why counted in process, not in the database: a write per request would put a database round trip
(milliseconds, and on SQLite the one writer lock) on every heartbeat; an increment here costs
microseconds (measured in the commit that added it). Under gunicorn, prometheus_client's
multi-process mode (PROMETHEUS_MULTIPROC_DIR, set by app/gunicorn_conf.py before this module is
imported) keeps each worker's values in its own memory-mapped file, and a scrape sums them.

Label values are bounded whatever a client sends: the route is the matched rule's template
(`/api/v1/hardware/nodes/<node_id>`), never the raw path, and anything unmatched is
`<unmatched>`; a method outside the known few is `other`.
"""

from __future__ import annotations

import time

from flask import Flask, Response, request
from prometheus_client import Counter, Histogram, disable_created_metrics

UNMATCHED = "<unmatched>"
OTHER_METHOD = "other"
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STARTED = "modelforge.metrics.started"
# Seconds: from a 5 ms heartbeat to a 10 s slow page; fewer buckets than the default keep the
# series count (routes x methods x buckets) and so the scrape small.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# No `_created` series: one more series per label set that no panel reads (multi-process mode
# never has them, so the single-process exposition matches it).
disable_created_metrics()
# registry=None: registered per scrape (app.metrics.views), so many apps in one process (the
# tests) share these without registering a name twice.
REQUESTS = Counter(
    "modelforge_http_requests",
    "HTTP requests answered, by route template, method and status.",
    ["route", "method", "status"],
    registry=None,
)
LATENCY = Histogram(
    "modelforge_http_request_duration_seconds",
    "Time to answer an HTTP request, by route template and method.",
    ["route", "method"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)


class _StartClock:
    """WSGI middleware that notes when a request arrived, before any Flask hook can refuse it."""

    def __init__(self, wsgi_app) -> None:
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        environ[_STARTED] = time.perf_counter()
        return self.wsgi_app(environ, start_response)


def route_label() -> str:
    """The matched rule's template, or UNMATCHED: never a raw path, never an id."""
    rule = request.url_rule
    return rule.rule if rule is not None else UNMATCHED


def method_label() -> str:
    """The request method, or OTHER_METHOD for anything a client made up."""
    return request.method if request.method in KNOWN_METHODS else OTHER_METHOD


def _observe(response: Response) -> Response:
    route, method = route_label(), method_label()
    REQUESTS.labels(route, method, str(response.status_code)).inc()
    started = request.environ.get(_STARTED)
    if started is not None:
        LATENCY.labels(route, method).observe(time.perf_counter() - started)
    return response


def instrument(app: Flask) -> None:
    """Count and time every response this app gives, errors included."""
    app.wsgi_app = _StartClock(app.wsgi_app)
    app.after_request(_observe)
