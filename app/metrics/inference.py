"""S7: inference series, counted where each request is answered (app/serving/answers.py), in process
and across gunicorn workers as app/metrics/http.py counts HTTP (multi-process files).

`deployment` is the deployment's name, which an operator chose (bounded by the deployments that
exist); `status` is `ok`, `cancelled` (the client left first) or the refusal's code, one of the
control plane's own (app/web_errors.py): a node's codes are mapped before they get here.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

OK, CANCELLED = "ok", "cancelled"
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKENS_PER_SECOND_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)

REQUESTS = Counter(
    "modelforge_inference_requests",
    "OpenAI API requests for a model, by deployment and outcome.",
    ["deployment", "status"],
    registry=None,
)
IN_FLIGHT = Gauge(
    "modelforge_inference_in_flight",
    "Requests being answered now, by deployment.",
    ["deployment"],
    multiprocess_mode="livesum",
    registry=None,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "modelforge_inference_time_to_first_token_seconds",
    "From the request reaching the control plane to its first token back from the node.",
    ["deployment"],
    buckets=TTFT_BUCKETS,
    registry=None,
)
TOKENS_PER_SECOND = Histogram(
    "modelforge_inference_tokens_per_second",
    "Generation speed of each finished request, as the node's worker measured it.",
    ["deployment"],
    buckets=TOKENS_PER_SECOND_BUCKETS,
    registry=None,
)
GENERATED_TOKENS = Counter(
    "modelforge_inference_generated_tokens",
    "Tokens generated for clients, by deployment.",
    ["deployment"],
    registry=None,
)
SERIES = (REQUESTS, IN_FLIGHT, TIME_TO_FIRST_TOKEN, TOKENS_PER_SECOND, GENERATED_TOKENS)


class Tracked:
    """One request from its arrival to its end; `end` counts it once, whichever end comes first."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment
        self.started = time.perf_counter()
        self.first_token = False
        self.ended = False
        # What the finished request measured, for the deployment's own figures (S2).
        self.time_to_first_token_seconds: float | None = None
        self.tokens_per_second: float | None = None
        self.generated_tokens = 0
        IN_FLIGHT.labels(deployment).inc()

    def see(self, event: dict | None) -> None:
        """An event on its way to the client: the first token, or the end with its usage."""
        if event is None or self.ended:
            return
        kind = event.get("event")
        if kind == "token" and not self.first_token:
            self.first_token = True
            self.time_to_first_token_seconds = round(time.perf_counter() - self.started, 6)
            TIME_TO_FIRST_TOKEN.labels(self.deployment).observe(self.time_to_first_token_seconds)
        elif kind == "finished":
            usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
            timings = event.get("timings") if isinstance(event.get("timings"), dict) else {}
            generated, speed = usage.get("completion_tokens"), timings.get("tokens_per_second")
            if isinstance(generated, int) and not isinstance(generated, bool) and 0 <= generated <= 1_000_000:
                self.generated_tokens = generated
                GENERATED_TOKENS.labels(self.deployment).inc(generated)
            if isinstance(speed, int | float) and not isinstance(speed, bool) and 0 < speed < 1e7:
                self.tokens_per_second = float(speed)
                TOKENS_PER_SECOND.labels(self.deployment).observe(speed)
            self.end(OK)

    def end(self, status: str) -> None:
        if self.ended:
            return
        self.ended = True
        IN_FLIGHT.labels(self.deployment).dec()
        REQUESTS.labels(self.deployment, status).inc()
