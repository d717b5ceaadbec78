"""S3 in the console: the benchmark runs of one model side by side, node by node — reached from a
benchmark job's page, a node's artifacts and the node page's benchmark form when it ran everywhere."""

from __future__ import annotations

import re

from flask import request

from app import rules
from app.console import bp, page_or_partial
from app.console.auth import login_required
from app.db import begin_read_only
from app.errors import DomainError
from app.jobs import benchmarks
from app.jobs.benchmarks import Considered

_COMMIT = re.compile(r"[0-9a-f]{40}")
# How many node names a notice lists for one reason before it counts the rest.
NAMES_PER_REASON = 5


def skipped_text(skipped: list[Considered]) -> str:
    """The nodes a fan-out skipped, a clause per reason: 'node is offline: gpu-2, gpu-7 and 3 more'."""
    by_reason: dict[str, list[str]] = {}
    for each in skipped:
        by_reason.setdefault(each.reason or "", []).append(each.name)
    clauses = []
    for reason, names in by_reason.items():
        shown = ", ".join(names[:NAMES_PER_REASON])
        if len(names) > NAMES_PER_REASON:
            shown += f" and {len(names) - NAMES_PER_REASON} more"
        clauses.append(f"{reason}: {shown}")
    return "; ".join(clauses)


def _model_named() -> tuple[str, str]:
    """The model the query names (repo_id, commit), checked before any query (PostgreSQL refuses NUL)."""
    repo_id = request.args.get("repo_id", "")
    commit = request.args.get("commit", "")
    if (
        len(repo_id) > rules.MAX_REPO_ID_LENGTH
        or re.fullmatch(rules.REPO_ID_PATTERN, repo_id) is None
        or _COMMIT.fullmatch(commit) is None
    ):
        raise DomainError(
            "MODEL_NOT_NAMED",
            "A comparison is of one model: repo_id=owner/name and commit=its 40 hex digits.",
            "Open it from a benchmark job's page or from a node's artifacts.",
        )
    return repo_id, commit


@bp.get("/benchmarks")
@login_required
def benchmark_comparison():
    """S3: one model's benchmark runs side by side, a table per model file, a row per node: its newest
    success (GPU model, pp and tg tokens/s, load time, memory) or no run yet; refreshes itself while a
    run is queued or running, and stops once none is."""
    begin_read_only()
    repo_id, commit = _model_named()
    return page_or_partial(
        "benchmarks.html",
        "partials/_benchmark_comparison.html",
        comparison=benchmarks.comparison(repo_id, commit),
        active="jobs",
    )
