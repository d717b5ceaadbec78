"""The node page (C3, I5, I6, S3), in tabs: each tab its own URL, so each polls only what it shows.

Overview (status, actions, readiness, latest readings), GPUs & telemetry, Storage & artifacts,
Jobs & runtime, Acceptance (app/console/acceptance.py), Credential and Audit. The panels of
storage and work live in app/console/jobs.py; this module renders the tabs around them.
"""

from __future__ import annotations

from datetime import timedelta

from flask import abort, current_app, redirect, render_template, request, url_for

from app import nodes
from app.config import current_settings
from app.console import bp, is_htmx_fragment_request
from app.console.acceptance import node_acceptance_context
from app.console.audit_log import audit_page
from app.console.auth import login_required
from app.console.charts import line_chart
from app.console.commands import replace_credential_command
from app.console.jobs import node_storage_context, node_work_context
from app.console.nodes import credential_refusals
from app.db import begin_read_only
from app.errors import DomainError
from app.extensions import db
from app.models import NodeLease
from app.models.telemetry import METRICS
from app.nodes import readiness, telemetry_history
from app.timeutil import utcnow

# C3: charts over the last hour (raw samples) and the last day (5-minute averages).
WINDOWS = {"hour": (timedelta(hours=1), None), "day": (timedelta(days=1), timedelta(minutes=5))}
CHART_UNITS = {
    "utilization_gpu_percent": ("Utilisation", "%"),
    "memory_used_bytes": ("Memory used", "bytes"),
    "temperature_c": ("Temperature", "°C"),
    "power_w": ("Power", "W"),
}


def _node_or_404(node_id: str) -> dict[str, object]:
    """The node as the API describes it, or the console's styled 404 (NODE_NOT_FOUND)."""
    described = nodes.describe([node_id], current_settings())
    if not described:
        raise DomainError(
            "NODE_NOT_FOUND", f"No node has id {node_id[:100]!r}.", "Open Hardware → Nodes and pick the node there."
        )
    return described[0]


def _tab(template: str, tab: str, node: dict[str, object], **context) -> str:
    """One tab of the node page: the node's head, the tab bar with `tab` current, the tab's panels."""
    return render_template(template, active="nodes", tab=tab, node=node, **context)


# --------------------------------------------------------------------------- Overview


def _live_context(node_id: str) -> dict[str, object]:
    node = _node_or_404(node_id)
    lease = db.session.get(NodeLease, node_id)
    return {
        "node": node,
        # C3: the agent version and protocol were last reported at enrolment or inventory time.
        "agent_reported_at": lease.last_seen_at if lease else None,
        "readiness": readiness.for_node(node_id, current_settings()),
        "credential_refused_at": credential_refusals([node_id]).get(node_id),
    }


@bp.get("/hardware/nodes/<node_id>")
@login_required
def node_page(node_id: str):
    """C3 Overview: status, actions, readiness, GPUs with their latest readings, host; #node-live
    refreshes itself (the htmx fragment of this URL) and after any action."""
    begin_read_only()
    if is_htmx_fragment_request():
        return render_template("partials/_node_live.html", **_live_context(node_id))
    context = _live_context(node_id)
    context.update(node_acceptance_context(node_id))  # V1: the verdict and each item's state
    return _tab("node.html", "overview", **context)


def _node_live(node_id: str):
    """After an action on the node (disable, drain, …): the Overview, or for htmx #node-live itself,
    the only panel that listens for node-changed, so no trigger."""
    if not is_htmx_fragment_request():
        return redirect(url_for("console.node_page", node_id=node_id))
    return render_template("partials/_node_live.html", **_live_context(node_id))


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
    nodes.set_draining(node_id, True)
    return _node_live(node_id)


@bp.post("/hardware/nodes/<node_id>/undrain")
@login_required
def undrain_node(node_id: str):
    """S3: undo drain."""
    nodes.set_draining(node_id, False)
    return _node_live(node_id)


@bp.post("/hardware/nodes/<node_id>/disable")
@login_required
def disable_node(node_id: str):
    """I6: ineligible at once; the agent's publications get 403 NODE_DISABLED."""
    nodes.set_disabled(node_id, True)
    return _node_live(node_id)


@bp.post("/hardware/nodes/<node_id>/enable")
@login_required
def enable_node(node_id: str):
    """I6: undo disable."""
    nodes.set_disabled(node_id, False)
    return _node_live(node_id)


# --------------------------------------------------------------------------- GPUs & telemetry


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


@bp.get("/hardware/nodes/<node_id>/gpus")
@login_required
def node_gpus(node_id: str):
    """C3 GPUs & telemetry: every GPU's facts and latest reading (#node-gpus refreshes itself, the
    htmx fragment of this URL) and the charts of one window."""
    begin_read_only()
    node = _node_or_404(node_id)
    if is_htmx_fragment_request():
        return render_template("partials/_node_gpus.html", node=node)
    return _tab("node_gpus.html", "gpus", **_charts_context(node, _window()))


@bp.get("/hardware/nodes/<node_id>/charts")
@login_required
def node_charts(node_id: str):
    """The charts partial for one window (hour or day); the GPUs tab outside htmx."""
    if not is_htmx_fragment_request():
        return redirect(url_for("console.node_gpus", node_id=node_id, window=_window()))
    begin_read_only()
    return render_template("partials/_node_charts.html", **_charts_context(_node_or_404(node_id), _window()))


# --------------------------------------------------------------------------- Storage, work


@bp.get("/hardware/nodes/<node_id>/storage")
@login_required
def node_storage(node_id: str):
    """J1, J4, J5 Storage & artifacts: the roots, the form to register one, the artifacts, the acquire form."""
    begin_read_only()
    node = _node_or_404(node_id)
    return _tab("node_storage.html", "storage", node, **node_storage_context(node_id))


@bp.get("/hardware/nodes/<node_id>/work")
@login_required
def node_work(node_id: str):
    """W1, W2 Jobs & runtime: the forms to run a model first, then the runtime worker and its results."""
    begin_read_only()
    node = _node_or_404(node_id)
    return _tab("node_work.html", "work", node, **node_work_context(node_id))


# --------------------------------------------------------------------------- Credential


def _credential_tab(node_id: str, status: int = 200, **extra):
    """The Credential tab; `extra` reaches its panel (a reveal, a notice)."""
    node = _node_or_404(node_id)
    return _tab("node_credential.html", "credential", node, credentials=nodes.credentials(node_id), **extra), status


@bp.get("/hardware/nodes/<node_id>/credential")
@login_required
def node_credential(node_id: str):
    """I5 Credential: the node's credentials (metadata only), rotate and revoke."""
    begin_read_only()
    return _credential_tab(node_id)


def _credential_panel(node_id: str, status: int = 200, **extra):
    """The credential partial after an action; tells the other panels to refresh (node-changed)."""
    if not is_htmx_fragment_request():
        return _credential_tab(node_id, status, **extra)
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


# --------------------------------------------------------------------------- Audit


@bp.get("/hardware/nodes/<node_id>/audit")
@login_required
def node_audit(node_id: str):
    """C3, P4 Audit: this node's events newest first, a page at a time (the audit log's keyset pages)."""
    begin_read_only()
    node = _node_or_404(node_id)
    errors: dict[str, str] = {}
    page = audit_page(errors, node_id=node_id)
    context = {
        **page,
        "errors": errors,
        "node_names": {node["id"]: node["display_name"]},
        "pager_endpoint": "console.node_audit",
        "one_node": True,  # every event is this node's: no Node column
        "link_filters": {"node_id": node_id},
    }
    return _tab("node_audit.html", "audit", node, **context), (400 if errors else 200)
