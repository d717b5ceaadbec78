"""The settings page in real Chromium against the real gunicorn and its scheduler (O2): the target
shown masked, "Send test alert" queued under the strict CSP with htmx's CSRF header, and the panel
updating by itself to "sent" once the scheduler delivered it to a real receiver.
"""

from __future__ import annotations

import re

import pytest

from tests.support.alerts import HOOK_SECRET
from tests.support.browser import expect, sign_in
from tests.support.gunicorn import gunicorn_on_sqlite_copy


@pytest.fixture
def alerting_server(sqlite_template, tmp_path, receiver):  # noqa: F811
    with gunicorn_on_sqlite_copy(
        sqlite_template,
        tmp_path / "alerts.sqlite3",
        workers=2,
        MODELFORGE_SWEEP_INTERVAL_SECONDS="1",
        MODELFORGE_ALERT_URLS=receiver.url(),
    ) as running:
        yield running


def test_send_test_alert_from_the_settings_page_reaches_the_receiver(alerting_server, receiver, page):  # noqa: F811
    sign_in(page, alerting_server.url, "/settings")
    target = page.locator("[data-testid=alert-target]")
    expect(target).to_contain_text(re.compile(r"json://alerts:\*{4}@127\.0\.0\.1:\d+/\.\.\./m\.\.\.e"))
    expect(target).to_contain_text("none yet")
    assert HOOK_SECRET not in page.content()
    page.steps.shot("settings-before")

    page.click("button:has-text('Send test alert')")
    expect(page.locator("[data-testid=alerts-notice]")).to_contain_text("Test alert queued for 1 target(s)")
    expect(target).to_contain_text("sent", timeout=15000)  # the panel polls until the scheduler sent it
    expect(target).to_contain_text("alert.test")
    page.steps.shot("settings-after-test-alert")
    assert receiver.titles() == ["ModelForge test alert"]
    expect(page.locator("nav >> text=Settings")).to_have_attribute("aria-current", "page")
