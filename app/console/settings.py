"""The settings page (O2): which alert targets are configured (masked), how each last went, a test.

"Send test alert" never sends from the request: it audits `alert.test` and queues one delivery
per target in the same transaction, and the scheduler's alert sweep sends them within a tick,
through the same claims and retries as every other alert. The panel polls itself while any
delivery is still waiting, then stops.
"""

from __future__ import annotations

from app import audit
from app.alerts import deliveries, messages
from app.alerts import targets as alert_targets
from app.config import current_settings
from app.console import bp, page_or_partial
from app.console.auth import login_required
from app.console.forms import EmptyForm
from app.db import begin_read_only
from app.extensions import db


def _targets():
    return alert_targets.configured(current_settings())


def _panel(status: int = 200, notice: str | None = None):
    targets = _targets()
    return page_or_partial(
        "settings.html",
        "partials/_settings_alerts.html",
        targets=targets,
        results=deliveries.last_results(targets),
        pending=deliveries.pending_count(targets),
        form=EmptyForm(),
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
    """O2: queue one test alert per target (the scheduler sends it); audited."""
    form = EmptyForm()
    if not form.validate_on_submit():
        return _panel(400, "The form expired; reload the page and try again.")
    targets = _targets()
    if not targets:
        return _panel(409, "No alert targets are configured: set MODELFORGE_ALERT_URLS or MODELFORGE_ALERT_URLS_FILE.")
    event = audit.record(audit.OPERATOR, messages.TEST_ACTION, targets=len(targets))
    db.session.flush()
    queued = deliveries.enqueue_event(event.id, targets)
    db.session.commit()
    return _panel(notice=f"Test alert queued for {queued} target(s); the scheduler sends it within a few seconds.")
