"""Deployments in the console (S2, S6): the list with a form to deploy a model, and one
deployment's page, which follows it live while its node loads the model and can stop it.

The playground sends one chat message and streams the answer into the page token by token, the
same way `/v1/chat/completions` streams it to clients (app/serving/answers.py), with the operator's
session instead of a client key (static/console.js reads it; no inline script, CSP kept).
"""

from __future__ import annotations

import sqlalchemy as sa
from flask import flash, redirect, render_template, request, url_for

from app.console import bp, is_htmx_fragment_request, page_or_partial
from app.console.auth import login_required
from app.console.forms import PLAYGROUND_MAX_TOKENS, DeploymentForm, EmptyForm, PlaygroundForm
from app.db import begin_read_only
from app.errors import DomainError
from app.extensions import db
from app.models import Artifact, DeploymentState, Node
from app.serving import answers, completions, deployments, placement
from app.timeutil import utcnow
from app.web_errors import STATUS_BY_CODE

# A deployment in one of these is still moving: its page and the list poll until it is not.
MOVING = (DeploymentState.PENDING, DeploymentState.LOADING, DeploymentState.STOPPING)


def _node_names() -> dict[str, str]:
    return dict(db.session.execute(sa.select(Node.id, Node.display_name)).all())


def _artifacts() -> list[Artifact]:
    """Every acquired artifact, newest first: what the deploy form offers."""
    return list(db.session.scalars(sa.select(Artifact).order_by(Artifact.verified_at.desc())))


def _list(status: int = 200, form: DeploymentForm | None = None):
    names = _node_names()
    found = deployments.list_all()
    every_artifact = _artifacts()
    return page_or_partial(
        "deployments.html",
        "partials/_deployments_table.html",
        deployments=found,
        node_names=names,
        polling=any(each.state in MOVING for each in found),
        form=form or DeploymentForm(every_artifact, names, formdata=None),
        has_artifacts=bool(every_artifact),
        active="deployments",
    ), status


@bp.get("/deployments")
@login_required
def deployments_page():
    """S6: every deployment with its state, node, model, context and what its node measured."""
    begin_read_only()
    return _list()


@bp.get("/deployments/preview")
@login_required
def deployment_preview():
    """S3: where the deploy form's model would go, and why each other node would not take it, as the
    form is filled in (nothing is stored)."""
    begin_read_only()
    names = _node_names()
    form = DeploymentForm(_artifacts(), names, formdata=request.args, meta={"csrf": False})
    form.validate()
    wanted = ("artifact_id", "model_file", "node_id", "tier", "context_length")
    problems = [error for name in wanted for error in getattr(form, name).errors]
    verdicts = []
    if not problems:
        ask = form.request()
        verdicts = placement.judge_all(
            placement.Ask(
                artifact=db.session.get(Artifact, ask.artifact_id),
                model_file=ask.model_file,
                tier=ask.tier,
                context_length=ask.context_length,
                n_gpu_layers=ask.n_gpu_layers,
            ),
            ask.node_id,
        )
    return render_template("partials/_placement_preview.html", verdicts=verdicts, problems=problems)


@bp.post("/deployments")
@login_required
def deployment_create():
    """S2: deploy a model file; its page follows it while the node loads it. Refusals inline (422)."""
    names = _node_names()
    every_artifact = _artifacts()
    form = DeploymentForm(every_artifact, names)
    if not form.validate_on_submit():
        return _list(422, form=form)
    try:
        created = deployments.create(form.request())
    except DomainError as refusal:  # a taken name, or no node that fits: under its field, with its next step
        field = {"name": form.name, "node_id": form.node_id}.get(str(refusal.extra.get("field")), form.artifact_id)
        field.errors = [*field.errors, f"{refusal.message} {refusal.next_step}"]
        return _list(STATUS_BY_CODE.get(refusal.code, 400), form=form)
    target = url_for("console.deployment_page", deployment_id=created.id)
    if is_htmx_fragment_request():
        return "", 201, {"HX-Redirect": target}
    return redirect(target, 303)


def _live(deployment_id: str, status: int = 200, move_refused: str | None = None):
    deployment = deployments.get(deployment_id)
    node = db.session.get(Node, deployment.node_id)
    return page_or_partial(
        "deployment.html",
        "partials/_deployment_live.html",
        deployment=deployment,
        node=node,
        moving=deployment.state in MOVING,
        waited_seconds=(utcnow() - deployment.created_at).total_seconds(),
        stop_form=EmptyForm(),
        playground_form=PlaygroundForm(),
        playground_max_tokens=PLAYGROUND_MAX_TOKENS,
        move_refused=move_refused,
        active="deployments",
    ), status


@bp.get("/deployments/<deployment_id>")
@login_required
def deployment_page(deployment_id: str):
    """S6: one deployment, live while it moves: waiting, loading, ready with what was measured, or why it failed."""
    begin_read_only()
    return _live(deployment_id)


@bp.post("/deployments/<deployment_id>/stop")
@login_required
def deployment_stop(deployment_id: str):
    """S2: ask the node to stop it (the model is freed there); the panel shows `stopping` until it has."""
    form = EmptyForm()
    if not form.validate_on_submit():
        flash("The form expired; reload the page and try again.")
    else:
        deployments.delete(deployment_id)
    if is_htmx_fragment_request():
        return _live(deployment_id)
    return redirect(url_for("console.deployment_page", deployment_id=deployment_id), 303)


@bp.post("/deployments/<deployment_id>/move")
@login_required
def deployment_move(deployment_id: str):
    """S3: place it on the best other node (off a draining one); a refusal says each node's reason."""
    form = EmptyForm()
    if not form.validate_on_submit():
        return _live(deployment_id, 400, "The form expired; reload the page and try again.")
    try:
        deployments.move(deployment_id)
    except DomainError as refusal:
        return _live(deployment_id, STATUS_BY_CODE.get(refusal.code, 400), f"{refusal.message} {refusal.next_step}")
    if is_htmx_fragment_request():
        return _live(deployment_id)
    return redirect(url_for("console.deployment_page", deployment_id=deployment_id), 303)


@bp.post("/deployments/<deployment_id>/playground")
@login_required
def deployment_playground(deployment_id: str):
    """S6: one message, answered as Server-Sent Events of OpenAI's chat chunks; a refusal is JSON
    in OpenAI's error shape, which the page shows with its next step."""
    form = PlaygroundForm()
    if not form.validate_on_submit():
        why = next(iter(form.errors.values()), ["The form expired; reload the page and try again."])[0]
        field = next(iter(form.errors))
        return answers.openai_error(400, "INVALID_PARAMETER", str(why), "Fix the message and send it again.", field)
    try:
        deployment = deployments.get(deployment_id)
        body = {
            "model": deployment.name,
            "messages": [{"role": "user", "content": form.message.data}],
            "max_tokens": PLAYGROUND_MAX_TOKENS,
            "stream": True,
        }
        if form.temperature.data is not None:
            body["temperature"] = form.temperature.data
        return answers.answer(completions.parse(completions.CHAT, body))
    except DomainError as refusal:
        db.session.rollback()
        status = STATUS_BY_CODE.get(refusal.code, 400)
        return answers.openai_error(status, refusal.code, refusal.message, refusal.next_step)
