"""The settings page (O2): alert targets — the environment's, read-only, and those added here — shown
masked, how each last went, and a test for all or one.

A test never sends from the request: it audits `alert.test` and queues one delivery per target in
the same transaction, and the scheduler's alert sweep sends them within a tick, through the same
claims and retries as every other alert. The panel polls itself while any delivery is still
waiting, then stops, so a target's row shows how its test went.

An added URL is a secret (P2): it is stored encrypted (app.alerts.targets), shown and audited by
its masked label only, and never rendered back, not even into the form that refused it.
"""

from __future__ import annotations

import sqlalchemy as sa
from flask import request
from sqlalchemy.exc import IntegrityError

from app import audit
from app.alerts import deliveries, messages
from app.alerts import targets as alert_targets
from app.config import current_settings
from app.console import bp, page_or_partial
from app.console.auth import login_required
from app.console.forms import AlertTargetForm, EmptyForm
from app.db import begin_read_only
from app.extensions import db
from app.models import AlertDelivery, AlertDeliveryState, AlertTarget
from app.timeutil import utcnow

EXPIRED = "The form expired; reload the page and try again."
GONE = "That alert target is no longer in the list (removed in another tab?)."
ADDED, REMOVED, ENABLED, DISABLED = (
    "alert_target.added",
    "alert_target.removed",
    "alert_target.enabled",
    "alert_target.disabled",
)


def _panel(status: int = 200, notice: str | None = None, add_form: AlertTargetForm | None = None):
    settings = current_settings()
    listed = alert_targets.listed(settings)
    targets = alert_targets.configured(settings)
    return page_or_partial(
        "settings.html",
        "partials/_settings_alerts.html",
        listed=listed,
        targets=targets,
        results=deliveries.last_results(listed),
        pending=deliveries.pending_count(targets),
        form=EmptyForm(),
        add_form=add_form or AlertTargetForm(formdata=None),
        alert_urls_source=settings.alert_urls_source,
        notice=notice,
        active="settings",
    ), status


@bp.get("/settings")
@login_required
def settings_page():
    """O2: alert targets, masked, with each one's last delivery."""
    begin_read_only()
    return _panel()


@bp.post("/settings/alerts/test")
@login_required
def send_test_alert():
    """O2: queue one test alert per target, or for the one target the form names (the scheduler
    sends it); audited."""
    form = EmptyForm()
    if not form.validate_on_submit():
        return _panel(400, EXPIRED)
    targets = alert_targets.configured(current_settings())
    if not targets:
        return _panel(
            409,
            "No alert target to test: add one below, or set MODELFORGE_ALERT_URLS or MODELFORGE_ALERT_URLS_FILE.",
        )
    one = request.form.get("target")  # a row's own "Send test": that target's digest
    if one:
        targets = tuple(target for target in targets if target.key == one)
        if not targets:
            return _panel(409, "That target is disabled, unreadable or gone: it cannot be tested.")
    event = audit.record(audit.OPERATOR, messages.TEST_ACTION, targets=len(targets))
    db.session.flush()
    queued = deliveries.enqueue_event(event.id, targets)
    db.session.commit()
    named = f"to {targets[0].label}" if one else f"for {queued} target(s)"
    return _panel(notice=f"Test alert queued {named}; the scheduler sends it within a few seconds.")


@bp.post("/settings/alerts/targets")
@login_required
def add_alert_target():
    """O2: add a target; stored encrypted, shown and audited masked. Bad input: 400, said inline."""
    settings = current_settings()
    alert_targets.target_salt()  # on its own connection, before this request's writes
    form = AlertTargetForm()
    if not form.validate_on_submit():
        if form.csrf_token.errors:
            return _panel(400, EXPIRED)
        return _panel(400, add_form=form)
    try:
        row = alert_targets.add(settings, form.prepared)
        audit.record(audit.OPERATOR, ADDED, target=row.label)
        db.session.commit()
    except alert_targets.TargetRefused as refused:
        db.session.rollback()
        form.url.errors = [str(refused)]
        return _panel(400, add_form=form)
    except IntegrityError:  # the same URL added at the same moment elsewhere
        db.session.rollback()
        form.url.errors = ["That target is already in the list."]
        return _panel(400, add_form=form)
    return _panel(notice=f"Alert target added: {row.label}. Send it a test to check it.")


def _stored_target(target_id: str) -> AlertTarget | None:
    return db.session.get(AlertTarget, target_id)


@bp.post("/settings/alerts/targets/<target_id>/remove")
@login_required
def remove_alert_target(target_id: str):
    """O2: remove a console target; what still waited to be sent to it is given up. Audited."""
    if not EmptyForm().validate_on_submit():
        return _panel(400, EXPIRED)
    row = _stored_target(target_id)
    if row is None:
        return _panel(404, GONE)
    label, key = row.label, row.target_key
    db.session.delete(row)
    audit.record(audit.OPERATOR, REMOVED, target=label)
    db.session.flush()
    if key not in {target.key for target in alert_targets.from_environment(current_settings())}:
        db.session.execute(
            sa.update(AlertDelivery)
            .where(AlertDelivery.target_key == key, AlertDelivery.state == AlertDeliveryState.PENDING)
            .values(state=AlertDeliveryState.FAILED, last_error="the target was removed")
        )
    db.session.commit()
    return _panel(notice=f"Alert target removed: {label}.")


@bp.post("/settings/alerts/targets/<target_id>/<any(enable, disable):change>")
@login_required
def switch_alert_target(target_id: str, change: str):
    """O2: stop or resume sending to a console target, keeping it and its history. Audited."""
    if not EmptyForm().validate_on_submit():
        return _panel(400, EXPIRED)
    row = _stored_target(target_id)
    if row is None:
        return _panel(404, GONE)
    enabled = change == "enable"
    if row.enabled != enabled:
        row.enabled = enabled
        if enabled:
            row.enabled_at = utcnow()  # nothing from while it was off is sent to it now
        audit.record(audit.OPERATOR, ENABLED if enabled else DISABLED, target=row.label)
        db.session.commit()
    said = "enabled: alerts go to it again" if enabled else "disabled: nothing is sent to it until enabled"
    return _panel(notice=f"Alert target {said} ({row.label}).")
