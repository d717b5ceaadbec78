"""Hardware → Nodes and the node page (C2, C3, I4–I6)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import sqlalchemy as sa
from flask import abort, current_app, redirect, render_template, request, url_for

from app import acceptance, audit, nodes
from app.config import current_settings
from app.console import bp, is_htmx_fragment_request, page_or_partial
from app.console.acceptance import node_acceptance_context
from app.console.auth import login_required
from app.console.charts import line_chart
from app.console.commands import replace_credential_command
from app.console.jobs import node_work_context
from app.db import begin_read_only
from app.errors import DomainError
from app.extensions import db
from app.models import Credential, Node, NodeLease
from app.models.telemetry import METRICS
from app.nodes import readiness, telemetry_history
from app.timeutil import utcnow

TIMELINE_LENGTH = 25
# C3: charts over the last hour (raw samples) and the last day (5-minute averages).
WINDOWS = {"hour": (timedelta(hours=1), None), "day": (timedelta(days=1), timedelta(minutes=5))}
CHART_UNITS = {
    "utilization_gpu_percent": ("Utilisation", "%"),
    "memory_used_bytes": ("Memory used", "bytes"),
    "temperature_c": ("Temperature", "°C"),
    "power_w": ("Power", "W"),
}


@bp.get("/")
@login_required
def index():
    """The console opens on the node list."""
    return redirect(url_for("console.nodes_page"))


STATUS_FILTERS = ("online", "stale", "offline", "pending", "disabled")


def _matches(row: nodes.NodeSummary, status: str, needle: str) -> bool:
    if status and ("disabled" if row.disabled else row.status) != status:
        return False
    if needle:
        haystack = " ".join((row.display_name, row.hostname, row.id, *row.gpu_models)).casefold()
        return needle.casefold() in haystack
    return True


def credential_refusals(node_ids: list[str] | None = None) -> dict[str, object]:
    """Nodes whose agent presented an unknown credential since their last accepted heartbeat and
    since their current credential was made: after a restore, the agent exits 5 and stays down
    until the operator rotates or re-enrols (app.api.auth.note_refused_credential). Node → when."""
    query = (
        sa.select(Node.id, Node.credential_refused_at, NodeLease.last_heartbeat_at, sa.func.max(Credential.created_at))
        .outerjoin(NodeLease, NodeLease.node_id == Node.id)
        .outerjoin(Credential, sa.and_(Credential.node_id == Node.id, Credential.revoked_at.is_(None)))
        .where(Node.credential_refused_at.is_not(None))
        .group_by(Node.id, Node.credential_refused_at, NodeLease.last_heartbeat_at)
    )
    if node_ids is not None:
        query = query.where(Node.id.in_(node_ids))
    return {
        node_id: refused_at
        for node_id, refused_at, beat_at, issued_at in db.session.execute(query)
        if all(moment is None or refused_at > moment for moment in (beat_at, issued_at))
    }


@bp.get("/hardware/nodes")
@login_required
def nodes_page():
    """C2: one row per node; the table partial polls itself, keeping any filter."""
    begin_read_only()
    status = request.args.get("status", "")
    needle = request.args.get("q", "").strip()[:200]
    error = None
    if status and status not in STATUS_FILTERS:
        error, status = f"Unknown status {status[:40]!r}; showing every node.", ""
    rows = nodes.summaries(current_settings())
    counts = Counter("disabled" if row.disabled else row.status for row in rows)
    duplicates = sorted({row.hostname for row in rows if row.suspected_duplicate_hostname})
    shown = [row for row in rows if _matches(row, status, needle)] if status or needle else rows
    filters = {name: value for name, value in (("status", status), ("q", needle)) if value}
    return page_or_partial(
        "nodes.html",
        "partials/_nodes_table.html",
        rows=shown,
        total=len(rows),
        counts=counts,
        duplicate_hostnames=duplicates,
        filters=filters,
        statuses=STATUS_FILTERS,
        error=error,
        # V1: every shown node's verdict in one batch, never one checklist per row.
        validated=acceptance.verdicts([row.id for row in shown]),
        refused_credentials=credential_refusals(),
        active="nodes",
    ), (400 if error else 200)


def _node_or_404(node_id: str) -> dict[str, object]:
    described = nodes.describe([node_id], current_settings())
    if not described:
        abort(404)
    return described[0]


def _live_context(node_id: str) -> dict[str, object]:
    node = _node_or_404(node_id)
    lease = db.session.get(NodeLease, node_id)
    return {
        "node": node,
        # C3: the agent version and protocol were last reported at enrolment or inventory time.
        "agent_reported_at": lease.last_seen_at if lease else None,
        "readiness": readiness.for_node(node_id, current_settings()),
        "timeline": audit.events(node_id=node_id, limit=TIMELINE_LENGTH),
        "credential_refused_at": credential_refusals([node_id]).get(node_id),
    }


def _charts_context(node: dict[str, object], window_name: str) -> dict[str, object]:
    window, bucket = WINDOWS[window_name]
    now = utcnow()
    start = now - window
    # A stretch with no samples longer than the stale threshold is drawn as a gap (P3).
    max_gap = None if bucket else timedelta(seconds=current_settings().node_stale_after_seconds)
    history = telemetry_history.history(str(node["id"]), window, now, bucket=bucket, max_gap=max_gap)
    gpus = {gpu["uuid"]: gpu for gpu in node["gpus"]}
    charts = []
    for gpu_uuid, series_by_metric in history.items():
        gpu = gpus.get(gpu_uuid, {})
        name = gpu.get("name") or "unknown model"
        y_max = {"utilization_gpu_percent": 100.0, "memory_used_bytes": gpu.get("memory_total_bytes")}
        charts.append(
            {
                "uuid": gpu_uuid,
                "name": name,
                "charts": [
                    (
                        CHART_UNITS[metric][0],
                        line_chart(
                            series_by_metric[metric],
                            start,
                            now,
                            label=f"{CHART_UNITS[metric][0]} — {name}",
                            unit=CHART_UNITS[metric][1],
                            y_max=y_max.get(metric),
                        ),
                    )
                    for metric in METRICS
                ],
            }
        )
    return {"node": node, "window": window_name, "gpu_charts": charts, "windows": list(WINDOWS)}


def _window() -> str:
    name = request.args.get("window", "hour")
    return name if name in WINDOWS else "hour"


@bp.get("/hardware/nodes/<node_id>")
@login_required
def node_page(node_id: str):
    """C3: every fact with the time it was measured, charts, credential, timeline, actions."""
    begin_read_only()
    if is_htmx_fragment_request():
        return render_template("partials/_node_live.html", **_live_context(node_id))
    return _whole_node_page(node_id, _window())


def _whole_node_page(node_id: str, window: str, **extra) -> str:
    """The node page with every panel; `extra` reaches the credential panel (a reveal, a notice)."""
    context = _live_context(node_id)
    context.update(_charts_context(context["node"], window))
    context.update(node_work_context(node_id))  # J4: storage roots, artifacts, acquire
    context.update(node_acceptance_context(node_id))  # V1: the verdict and each item's state
    return render_template("node.html", active="nodes", credentials=nodes.credentials(node_id), **context, **extra)


@bp.get("/hardware/nodes/<node_id>/charts")
@login_required
def node_charts(node_id: str):
    """The charts partial for one window (hour or day); the node page outside htmx."""
    if not is_htmx_fragment_request():
        return redirect(url_for("console.node_page", node_id=node_id, window=_window()))
    begin_read_only()
    return render_template("partials/_node_charts.html", **_charts_context(_node_or_404(node_id), _window()))


def _credential_panel(node_id: str, status: int = 200, **extra):
    """The credential partial after an action; tells the other panels to refresh (node-changed)."""
    if not is_htmx_fragment_request():
        return _whole_node_page(node_id, "hour", **extra), status
    context = {"node": _node_or_404(node_id), "credentials": nodes.credentials(node_id), **extra}
    response = current_app.make_response((render_template("partials/_node_credential.html", **context), status))
    response.headers["HX-Trigger"] = "node-changed"
    return response


@bp.post("/hardware/nodes/<node_id>/credential/rotate")
@login_required
def rotate_credential(node_id: str):
    """I5: a new credential, shown once in this response only, with the steps to install it."""
    _, secret = nodes.rotate_credential(node_id)  # NODE_NOT_FOUND comes from its row lock
    return _credential_panel(node_id, revealed_credential=secret, replace_command=replace_credential_command())


@bp.post("/hardware/nodes/<node_id>/credential/revoke")
@login_required
def revoke_credential(node_id: str):
    """I5: leave the node with no active credential."""
    try:
        nodes.revoke_credential(node_id)
    except DomainError as error:
        if error.code != "NO_ACTIVE_CREDENTIAL":
            raise
        return _credential_panel(node_id, 409, notice=error.message)
    return _credential_panel(node_id, notice="Credential revoked: the agent's next request is refused.")


def _node_live(node_id: str):
    """After an action on the node (disable, drain, …): the node page, or for htmx #node-live itself,
    the only panel that listens for node-changed, so no trigger."""
    if not is_htmx_fragment_request():
        return redirect(url_for("console.node_page", node_id=node_id))
    return render_template("partials/_node_live.html", **_live_context(node_id))


def _set_disabled(node_id: str, disabled: bool):
    nodes.set_disabled(node_id, disabled)
    return _node_live(node_id)


def _set_draining(node_id: str, draining: bool):
    nodes.set_draining(node_id, draining)
    return _node_live(node_id)


@bp.post("/hardware/nodes/<node_id>/eligibility/<flag>/<value>")
@login_required
def set_node_eligibility(node_id: str, flag: str, value: str):
    """S3: set or clear lab_eligible or benchmark_eligible from the node page."""
    if flag not in nodes.OPERATOR_FLAGS or value not in ("on", "off"):
        abort(404)
    nodes.set_eligibility(node_id, {flag: value == "on"})
    return _node_live(node_id)


@bp.post("/hardware/nodes/<node_id>/drain")
@login_required
def drain_node(node_id: str):
    """S3: the running job finishes; no new job or deployment until undrained."""
    return _set_draining(node_id, True)


@bp.post("/hardware/nodes/<node_id>/undrain")
@login_required
def undrain_node(node_id: str):
    """S3: undo drain."""
    return _set_draining(node_id, False)


@bp.post("/hardware/nodes/<node_id>/disable")
@login_required
def disable_node(node_id: str):
    """I6: ineligible at once; the agent's publications get 403 NODE_DISABLED."""
    return _set_disabled(node_id, True)


@bp.post("/hardware/nodes/<node_id>/enable")
@login_required
def enable_node(node_id: str):
    """I6: undo disable."""
    return _set_disabled(node_id, False)
