"""The enrol-node wizard (C4, E4, R2, W3): mint, reveal once, start, watch readiness, recreate,
then start the runtime worker beside the agent.

The token exists in exactly one place after minting: the HTML of the POST response that
reveals it. It is never put in the session, a URL, a log or a cacheable response
(`Cache-Control: no-store` on every console response), and the page removes it when the
wizard closes, readiness is checked, the token is revoked or the countdown reaches zero.
"""

from __future__ import annotations

from app.config import current_settings
from app.console import bp, is_htmx_fragment_request, page_or_partial
from app.console.auth import login_required
from app.console.commands import (
    WORKER_CPU,
    WORKER_GPU,
    WORKER_IMAGES,
    AgentEnv,
    ImageSource,
    env_file,
    recreate_command,
    release_image,
    start_command,
    venv_start_command,
    worker_start_command,
)
from app.console.forms import EmptyForm, EnrollForm, parse_labels
from app.db import begin_read_only
from app.errors import DomainError
from app.models import EnrollmentState
from app.nodes import enrollment, readiness
from app.public_origin import current_api_origin, is_loopback_origin, origin_warning
from app.release_manifest import pasted_workers
from app.timeutil import utcnow


def _wizard(template_partial: str, status: int = 200, **context):
    """A wizard step: the fragment for htmx (swapped into #wizard), else the whole wizard page."""
    return page_or_partial("enroll.html", template_partial, step=template_partial, active="enroll", **context), status


def _form(status: int = 200, **context):
    """Step 1, with the origin agents will use and, when it is only the request's Host, where it came from."""
    origin = current_api_origin()
    return _wizard(
        "partials/_enroll_form.html",
        status,
        api_origin=origin,
        origin_warning=origin_warning(),
        origin_loopback=is_loopback_origin(origin),
        **context,
    )


@bp.get("/hardware/enroll")
@login_required
def enroll():
    """Step 1: the form. The API origin shown is fixed to this console's own (E3)."""
    begin_read_only()
    # Tokens minted earlier and still usable, so the page can point to where they are followed or revoked.
    return _form(form=EnrollForm(), pending_count=len(enrollment.pending(utcnow())))


def _enrollments(status: int = 200, **context):
    """The enrolments list: pending tokens, then the recent ones no node can use any more."""
    now = utcnow()
    return page_or_partial(
        "enrollments.html",
        "partials/_enrollments.html",
        pending=enrollment.pending(now),
        finished=[(item, enrollment.effective_state(item, now)) for item in enrollment.finished(now)],
        revoke_form=EmptyForm(),
        States=EnrollmentState,
        active="enroll",
        **context,
    ), status


@bp.get("/hardware/enrollments")
@login_required
def enrollments_page():
    """E1, E5: every token still pending (to follow or revoke) and the last 50 that are done."""
    begin_read_only()
    return _enrollments()


def _revoke(enrollment_id: str) -> tuple[str, int]:
    """Revoke through the one domain rule (E1); a token that is no longer pending is a 409 notice."""
    try:
        revoked = enrollment.revoke(enrollment_id)
    except DomainError as error:
        if error.code != "ENROLLMENT_NOT_PENDING":
            raise
        return error.message, 409
    return f"Token revoked: no node can use it now (“{revoked.display_name}”, {revoked.token_prefix}…).", 200


@bp.post("/hardware/enrollments/<enrollment_id>/revoke-from-list")
@login_required
def enrollments_revoke(enrollment_id: str):
    """Revoke a pending token from the list, which comes back with it moved to the recent ones."""
    if not EmptyForm().validate_on_submit():
        return _enrollments(400, notice="The form expired; reload the page and try again.")
    notice, status = _revoke(enrollment_id)
    return _enrollments(status, notice=notice)


@bp.post("/hardware/enroll")
@login_required
def enroll_submit():
    """Step 2: mint the token (production_eligible forced false, E4) and reveal it once."""
    form = EnrollForm()
    if not form.validate_on_submit():
        return _form(422, form=form)
    origin = current_api_origin()
    agent_image = form.agent_image()
    if agent_image.release is not None:
        # W3, D5: a whole pasted manifest also brings the runtime worker's entries, checked before
        # anything is minted, so a wrong one never costs a token (P5).
        try:
            agent_image = release_image(agent_image.release, pasted_workers(form.release_entry.data))
        except ValueError as error:
            form.release_entry.errors.append(f"That is not a release manifest: {error}.")
            return _form(422, form=form)
    minted, token = enrollment.create(
        enrollment.EnrollmentRequest(
            display_name=form.display_name.data.strip(),
            expires_in_seconds=form.expires_in_seconds.data,
            api_origin=origin,
            role=(form.role.data or "").strip() or None,
            labels=parse_labels(form.labels.data or ""),
            production_eligible=False,  # E4: never from the wizard
            lab_eligible=form.lab_eligible.data,
            benchmark_eligible=form.benchmark_eligible.data,
            agent_image=agent_image.to_json(),
        )
    )
    agent_env = AgentEnv(
        control_plane_url=origin,
        display_name=minted.display_name,
        accelerator_mode=form.accelerator_mode.data,
        image=agent_image.reference,
        worker_image=agent_image.worker_image(WORKER_GPU),
        worker_cpu_image=agent_image.worker_image(WORKER_CPU),
    )
    return _wizard(
        "partials/_enroll_reveal.html",
        201,
        enrollment=minted,
        token=token,
        expires_in=max(int((minted.expires_at - utcnow()).total_seconds()), 0),
        env_text=env_file(agent_env),
        start_command=start_command(agent_image),
        venv_command=venv_start_command(agent_env),
        agent_image=agent_image,
        States=EnrollmentState,
    )


@bp.get("/hardware/enrollments/<enrollment_id>/claim")
@login_required
def enrollment_claim(enrollment_id: str):
    """C4: whether a node has used the token yet, for the reveal to poll; once one has, the page
    no longer asks before it is left (the token has done its work)."""
    begin_read_only()
    minted = enrollment.get(enrollment_id)
    return page_or_partial(
        "enroll.html",
        "partials/_enroll_claim.html",
        step="partials/_enroll_claim.html",
        active="enroll",
        enrollment=minted,
        state=enrollment.effective_state(minted, utcnow()),
        States=EnrollmentState,
    )


def _progress_context(enrollment_id: str) -> dict[str, object]:
    minted = enrollment.get(enrollment_id)
    agent_image = ImageSource.from_json(minted.agent_image)
    answer = readiness.for_enrollment(minted, current_settings())
    return {
        "enrollment": minted,
        "readiness": answer,
        "token_dead": readiness.token_dead(answer),
        "recreate_command": recreate_command(agent_image),
        "start_command": start_command(agent_image),
        "worker_commands": [(image, worker_start_command(agent_image, image)) for image in WORKER_IMAGES],
        "agent_image": agent_image,
        "States": EnrollmentState,
    }


@bp.get("/hardware/enrollments/<enrollment_id>")
@login_required
def enrollment_progress(enrollment_id: str):
    """Step 3: readiness of the exact node that used this token, then the recreate command."""
    begin_read_only()
    return _wizard("partials/_enroll_progress.html", **_progress_context(enrollment_id))


@bp.get("/hardware/enrollments/<enrollment_id>/readiness")
@login_required
def enrollment_readiness(enrollment_id: str):
    """R2: the readiness panel; it polls itself until the node is ready or the token is dead."""
    begin_read_only()
    context = _progress_context(enrollment_id)
    return page_or_partial(
        "enroll.html",
        "partials/_readiness_panel.html",
        step="partials/_enroll_progress.html",
        active="enroll",
        polled=is_htmx_fragment_request(),
        **context,
    )


@bp.post("/hardware/enrollments/<enrollment_id>/revoke")
@login_required
def enrollment_revoke(enrollment_id: str):
    """Revoke the unused token; the reveal is gone because this step replaces it."""
    notice, status = _revoke(enrollment_id)
    return _wizard("partials/_enroll_progress.html", status, notice=notice, **_progress_context(enrollment_id))
