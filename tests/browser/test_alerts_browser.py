"""The settings page in real Chromium against the real gunicorn and its scheduler (O2): the target
shown masked, "Send test alert" queued under the strict CSP with htmx's CSRF header, and the panel
updating by itself to "sent" once the scheduler delivered it to a real receiver; a target added in
the page, refused inline first, then tested on its own row and sent a real alert.
"""

from __future__ import annotations

import re

import pytest

from tests.support import factories, wait_until
from tests.support.alerts import HOOK_SECRET
from tests.support.browser import Api, expect, sign_in
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


@pytest.fixture
def bare_server(sqlite_template, tmp_path):  # noqa: F811
    """The real gunicorn and scheduler with no alert target in the environment."""
    with gunicorn_on_sqlite_copy(
        sqlite_template, tmp_path / "console-alerts.sqlite3", workers=2, MODELFORGE_SWEEP_INTERVAL_SECONDS="1"
    ) as running:
        yield running


def test_a_target_added_in_settings_gets_its_own_test_and_a_real_alert(bare_server, receiver, page):  # noqa: F811
    sign_in(page, bare_server.url, "/settings")
    expect(page.get_by_role("button", name="Send test alert")).to_be_disabled()
    expect(page.locator("[data-testid=alerts-test-why]")).to_contain_text("No alert target: add one below")

    page.expected_errors += ["status of 400", "Response Status Error Code 400 from /settings/alerts/targets"]
    field = page.locator("#alert-target-url")
    field.fill("nosuchservice://hooks.example.lan/" + HOOK_SECRET)
    page.get_by_role("button", name="Add target").click()
    expect(page.locator("[data-testid=alert-target-error]")).to_contain_text("apprise cannot send to that URL")
    expect(field).to_have_value("")  # a refused URL is not sent back either
    expect(field).to_have_attribute("aria-invalid", "true")

    field.fill(receiver.url(HOOK_SECRET).replace("json://", "http://", 1))  # a webhook as pasted
    page.get_by_role("button", name="Add target").click()
    expect(page.locator("[data-testid=alerts-notice]")).to_contain_text("Alert target added: json://alerts:****@")
    target = page.locator("[data-testid=alert-target]")
    expect(target).to_contain_text(re.compile(r"json://alerts:\*{4}@127\.0\.0\.1:\d+/\.\.\./m\.\.\.e"))
    expect(target).to_contain_text("added here")
    assert HOOK_SECRET not in page.content() and "hooks/modelforge" not in page.content()
    page.steps.shot("settings-target-added")

    target.get_by_role("button", name=re.compile("^Send test to")).click()
    expect(target).to_contain_text("sent", timeout=15000)  # the panel polls until the scheduler sent it
    assert receiver.titles() == ["ModelForge test alert"]

    factories.enrolled_node(Api(bare_server.url), control_plane_url=bare_server.url, hostname="alerting-node")
    wait_until(lambda: any(title.startswith("Node enrolled") for title in receiver.titles()), "the enrolment alert")
    assert HOOK_SECRET not in bare_server.log() and "hooks/modelforge" not in bare_server.log()

    target.get_by_role("button", name=re.compile("^Disable ")).click()
    expect(target.locator("[data-testid=alert-target-disabled]")).to_be_visible()
    expect(page.get_by_role("button", name="Send test alert")).to_be_disabled()
    target.get_by_role("button", name=re.compile("^Remove ")).click()  # its confirmation is accepted
    expect(page.locator("[data-testid=alerts-notice]")).to_contain_text("Alert target removed: json://alerts:****@")
    expect(page.locator("[data-testid=alerts-test-why]")).to_contain_text("No alert target: add one below")
    page.steps.shot("settings-target-removed")
