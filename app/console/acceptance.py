"""Acceptance evidence in the console (V1): a node's checklist with the evidence of each item, the
pasted `docker inspect`, UI screenshots, the verdict, production eligibility and the bundle.

Views stay thin: app.acceptance decides every state, limit and refusal; this module shows them.
"""

from __future__ import annotations

from flask import abort, current_app, flash, redirect, render_template, request, url_for

from app import acceptance
from app.acceptance import responses
from app.acceptance.container import MAX_INSPECT_CHARS
from app.acceptance.uploads import MAX_UPLOAD_REQUEST_BYTES
from app.audit import OPERATOR
from app.console import bp, is_htmx_fragment_request
from app.console.auth import login_required
from app.console.formatting import human_bytes
from app.console.forms import InspectForm, ScreenshotForm
from app.db import begin_read_only
from app.errors import DomainError
from app.extensions import csrf
from app.models import Node
from app.nodes import get as get_node

# What a change on the acceptance page tells its checklist to do: refetch.
ACCEPTANCE_CHANGED = "acceptance-changed"
# Each state has its word, its colour (console.css .mf-state-*) and this mark: never colour alone.
STATE_MARKS = {"observed": "✓", "missing": "○", "contradicted": "✗"}
# The container checks app.acceptance runs, in words (an unknown one shows its own name).
CHECK_LABELS = {
    "running": "Running",
    "restart_policy": "Restart policy",
    "read_only_root": "Read-only root filesystem",
    "capabilities_dropped": "All capabilities dropped",
    "no_new_privileges": "no-new-privileges",
    "not_privileged": "Not privileged",
    "no_published_ports": "No published ports",
    "no_container_socket": "No Docker (or podman) socket mounted",
    "image": "Image is the enrolled release",
}
# The limits the forms show, as app.acceptance enforces them.
LIMITS = {"max_screenshot_bytes": acceptance.MAX_SCREENSHOT_BYTES, "max_inspect_chars": MAX_INSPECT_CHARS}


def gpu_comparison(evidence: dict[str, object]) -> list[dict[str, object]]:
    """The GPU facts evidence as table rows: per UUID, nvidia-smi's line, NVML's GPU, and their disagreements."""
    smi = {str(gpu.get("uuid")): gpu for gpu in evidence.get("nvidia_smi") or [] if isinstance(gpu, dict)}
    nvml = {str(gpu.get("uuid")): gpu for gpu in evidence.get("nvml") or [] if isinstance(gpu, dict)}
    mismatches = [str(problem) for problem in evidence.get("mismatches") or []]
    rows = []
    for uuid in sorted(smi.keys() | nvml.keys()):
        problems = [problem for problem in mismatches if uuid in problem]
        # "agree" needs both readings and no disagreement; one side missing is not evidence of agreement.
        agreement = "no" if problems else "yes" if uuid in smi and uuid in nvml else "not compared"
        rows.append(
            {"uuid": uuid, "smi": smi.get(uuid), "nvml": nvml.get(uuid), "problems": problems, "agreement": agreement}
        )
    return rows


def node_acceptance_context(node_id: str) -> dict[str, object]:
    """What the node page's acceptance section shows: the verdict and each item's state."""
    return {"checklist": acceptance.evaluate(node_id), "state_marks": STATE_MARKS}


def _checklist_context(node: Node) -> dict[str, object]:
    """The checklist partial's context: the verdict, the items, their evidence as tables, the screenshots."""
    checklist = acceptance.evaluate(node.id)
    return {
        "node": node,
        "checklist": checklist,
        "shots": acceptance.screenshots(node.id),
        "gpu_rows": gpu_comparison(checklist.item("gpu_facts").evidence),
        "check_labels": CHECK_LABELS,
        "state_marks": STATE_MARKS,
    }


def _page(node: Node, status: int = 200, **forms):
    """The whole acceptance page; a refused form passed in comes back with its input and errors."""
    context = {
        **_checklist_context(node),
        **LIMITS,
        "inspect_command": acceptance.inspect_command(node.id),
        "inspect_form": forms.get("inspect_form") or InspectForm(formdata=None),
        "screenshot_form": forms.get("screenshot_form") or ScreenshotForm(formdata=None),
        "active": "nodes",
        "tab": "acceptance",  # the node page's tab bar (templates/node_base.html)
    }
    return render_template("acceptance.html", **context), status


@bp.get("/hardware/nodes/<node_id>/acceptance")
@login_required
def acceptance_page(node_id: str):
    """V1: the verdict, every item with its state, when and by what it was observed, and its evidence.

    For htmx: the checklist partial refreshing itself, or (`panel=summary`) the node page's section.
    """
    begin_read_only()
    node = get_node(node_id)
    if not is_htmx_fragment_request():
        return _page(node)
    if request.args.get("panel") == "summary":
        return render_template("partials/_node_acceptance.html", node=node, **node_acceptance_context(node_id))
    return render_template("partials/_acceptance_checklist.html", **_checklist_context(node))


def _form_panel(template: str, status: int, **context):
    """A form's partial after a submit; a success tells the checklist to refetch."""
    response = current_app.make_response((render_template(template, **LIMITS, **context), status))
    if status < 300:
        response.headers["HX-Trigger"] = ACCEPTANCE_CHANGED
    return response


def _back_to_page(node_id: str, message: str):
    """Outside htmx: say what happened on the acceptance page (post/redirect/get)."""
    flash(message)
    return redirect(url_for("console.acceptance_page", node_id=node_id), 303)


@bp.post("/hardware/nodes/<node_id>/acceptance/container-status")
@login_required
def acceptance_container_status(node_id: str):
    """V1: check a pasted `docker inspect`; a refusal shows its reason under the text, which stays.

    The form (its body) is read and checked before the database is touched: see acceptance_upload.
    """
    form = InspectForm()
    submitted = form.validate_on_submit()
    node = get_node(node_id)
    status = 422
    if submitted:
        try:
            item = acceptance.record_container_status(node_id, form.inspect.data, OPERATOR)
        except DomainError as error:
            if error.code == "NODE_NOT_FOUND":
                raise
            form.inspect.errors.append(error.message)
            form.next_step = error.next_step
            status = 413 if error.code == "INSPECT_TOO_LARGE" else 422
        else:
            notice = f"Container status recorded: {item.state}. {item.detail}"
            if not is_htmx_fragment_request():
                return _back_to_page(node_id, notice)
            # The paste is not echoed back (its environment values were dropped from what was kept).
            fresh = InspectForm(formdata=None)
            return _form_panel(
                "partials/_acceptance_inspect_form.html", 200, node=node, inspect_form=fresh, notice=notice
            )
    if not is_htmx_fragment_request():
        return _page(node, status, inspect_form=form)
    return _form_panel("partials/_acceptance_inspect_form.html", status, node=node, inspect_form=form)


def _upload_refused(node: Node, form: ScreenshotForm, status: int, message: str | None = None, next_step: str = ""):
    """The upload form again with why it was refused under the field; nothing was stored."""
    if message:
        form.screenshot.errors = [*form.screenshot.errors, message]
    form.next_step = next_step
    if not is_htmx_fragment_request():
        return _page(node, status, screenshot_form=form)
    return _form_panel("partials/_acceptance_upload_form.html", status, node=node, screenshot_form=form)


@bp.post("/hardware/nodes/<node_id>/acceptance/screenshots")
@csrf.exempt  # checked in the view, once this route's body limit is raised (see the docstring)
@login_required
def acceptance_upload(node_id: str):
    """V1: store one UI screenshot (PNG or JPEG, size-limited; app.acceptance checks it is an image).

    A screenshot outgrows the general request limit (MODELFORGE_MAX_REQUEST_BYTES), and CSRFProtect
    reads the form, so the body, before any view could raise it: this route is exempt from the
    app-wide check and runs the same check itself, after sign-in and after raising the limit to
    the upload's. A body over that limit is refused by its Content-Length, unread, naming the limit.

    The body (up to 6 MiB, as slowly as the client sends it) is read before the database is
    touched: on SQLite the first query opens a write transaction (BEGIN IMMEDIATE and the writer
    queue), which would hold up every heartbeat for as long as the upload takes.
    """
    limit = acceptance.MAX_SCREENSHOT_BYTES
    too_large = f"The file is larger than the limit of {human_bytes(limit)}; nothing was stored."
    if request.content_length is not None and request.content_length > MAX_UPLOAD_REQUEST_BYTES:
        return _upload_refused(get_node(node_id), ScreenshotForm(formdata=None), 413, too_large)
    request.max_content_length = MAX_UPLOAD_REQUEST_BYTES
    csrf.protect()  # a CSRFError goes to the app's handler: "Form expired", nothing changed
    form = ScreenshotForm()
    submitted = form.validate_on_submit()
    upload = form.screenshot.data if submitted else None
    data = upload.read(limit + 1) if upload is not None else b""
    node = get_node(node_id)  # the body is read: only now the database
    if not submitted:
        return _upload_refused(node, form, 422)
    try:
        shot = acceptance.add_screenshot(node_id, upload.filename or "", data, OPERATOR)
    except DomainError as error:
        if error.code == "NODE_NOT_FOUND":
            raise
        status = 413 if error.code == "SCREENSHOT_TOO_LARGE" else 422
        return _upload_refused(node, form, status, too_large if status == 413 else error.message, error.next_step)
    notice = f"Screenshot {shot.filename} stored ({shot.width} × {shot.height} px, {human_bytes(shot.size_bytes)})."
    if not is_htmx_fragment_request():
        return _back_to_page(node_id, notice)
    fresh = ScreenshotForm(formdata=None)
    return _form_panel("partials/_acceptance_upload_form.html", 201, node=node, screenshot_form=fresh, notice=notice)


@bp.get("/hardware/nodes/<node_id>/acceptance/screenshots/<screenshot_id>")
@login_required
def acceptance_screenshot(node_id: str, screenshot_id: str):
    """V1: one stored screenshot, to a signed-in operator only, as the type it was stored with."""
    # Read as text, not <int:…>: a malformed id is the console's 404 page, after the sign-in check.
    if not (screenshot_id.isascii() and screenshot_id.isdigit()) or len(screenshot_id) > 18:
        abort(404)
    begin_read_only()
    return responses.screenshot_response(node_id, int(screenshot_id))


def _notice(message: str, status: int, error: bool = False):
    """The eligibility action's outcome for #acceptance-notice; a change also refetches the checklist."""
    body = render_template("partials/_acceptance_notice.html", message=message, error=error)
    response = current_app.make_response((body, status))
    if not error:
        response.headers["HX-Trigger"] = ACCEPTANCE_CHANGED
    return response


@bp.post("/hardware/nodes/<node_id>/acceptance/production-eligibility")
@login_required
def acceptance_eligibility(node_id: str):
    """V1: mark the node production-eligible (a validated node only: 409 naming what is missing) or clear it."""
    get_node(node_id)
    value = request.form.get("production_eligible")
    if value not in ("true", "false"):
        message = "Choose to mark the node production-eligible or to clear it; nothing was changed."
        if not is_htmx_fragment_request():
            return _back_to_page(node_id, message)
        return _notice(message, 400, error=True)
    try:
        acceptance.set_production_eligible(node_id, value == "true", OPERATOR)
    except DomainError as error:
        if error.code != "NODE_NOT_VALIDATED":
            raise
        message = f"{error.message} The checklist below says how to gather each item."
        if not is_htmx_fragment_request():
            return _back_to_page(node_id, message)
        return _notice(message, 409, error=True)
    message = "Marked production-eligible." if value == "true" else "Production eligibility cleared."
    if not is_htmx_fragment_request():
        return _back_to_page(node_id, message)
    return _notice(message, 200)


@bp.get("/hardware/nodes/<node_id>/acceptance/bundle")
@login_required
def acceptance_bundle(node_id: str):
    """V1: the evidence as one zip (report.json, report.html, screenshots/) that a release note can cite."""
    begin_read_only()
    return responses.bundle_response(node_id)
