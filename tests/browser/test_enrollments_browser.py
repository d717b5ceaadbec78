"""Tokens do not get lost (issue 25 item 5; C4), in real Chromium against the real gunicorn: while
the wizard shows a token, a reload asks first (a `beforeunload` dialog) and "Check node readiness"
asks before it takes the token away; neither asks once the node has used the token or the operator
says it is saved. The enrolments page lists the tokens and revokes a pending one.
"""

from __future__ import annotations

import sqlite3

import requests

from tests.support import ADMIN, assert_no_secrets, factories
from tests.support.axe import violations
from tests.support.browser import expect, sign_in

# agent_server comes before browser_context in each test: the page closes before the server stops,
# so a poll in flight at the end is not a failed request.


def watched_page(browser_context):
    """A page (confirmations accepted, as the fixture does) that also records each dialog's type."""
    page = browser_context()
    page.dialogs = []
    page.on("dialog", lambda dialog: page.dialogs.append(dialog.type))
    return page


def mint_in_wizard(page, display_name: str) -> str:
    """Open the wizard from the nav, mint with its defaults, and return the revealed token."""
    page.click("nav >> text=Enrol node")
    expect(page.locator("input[name=image_source][value=local]")).to_be_checked()  # needs no release manifest
    page.fill("#display_name", display_name)
    page.click("button:has-text('Create one-time token')")
    token = page.locator("#enrollment-token")
    expect(token).to_be_visible()
    return token.inner_text().strip()


def test_a_shown_token_is_not_lost_without_a_warning(agent_server, browser_context):
    page = watched_page(browser_context)
    sign_in(page, agent_server.url)

    # Reloading while the token is on screen asks first.
    token = mint_in_wizard(page, "Reloaded")
    page.steps.shot("token-shown")
    for width, height in ((1366, 900), (390, 844)):  # what the reveal adds is accessible, on a phone too
        page.set_viewport_size({"width": width, "height": height})
        assert violations(page) == []
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.set_viewport_size({"width": 1280, "height": 900})
    page.reload()
    expect(page.locator("[data-step=form]")).to_be_visible()
    assert page.dialogs == ["beforeunload"]
    assert token not in page.content()

    # "Check node readiness" asks before it takes the token away, and then does.
    token = mint_in_wizard(page, "Checked")
    page.click("button:has-text('Check node readiness')")
    expect(page.locator("[data-step=progress]")).to_be_visible()
    assert page.dialogs == ["beforeunload", "confirm"]
    assert token not in page.content()

    # Said to be saved: nothing asks any more.
    token = mint_in_wizard(page, "Saved")
    page.click("button:has-text('I have saved the token')")
    expect(page.locator("[data-secret-saved-note]")).to_be_visible()
    page.reload()
    expect(page.locator("[data-step=form]")).to_be_visible()
    assert page.dialogs == ["beforeunload", "confirm"]

    # Once the node has used the token, leaving is fine: no dialog on reload.
    token = mint_in_wizard(page, "Connected")
    body = factories.enroll_body(token, origin=agent_server.url)
    claim = requests.post(agent_server.url + "/api/v1/agent/enroll", json=body, timeout=10)
    assert claim.status_code == 201, claim.text
    expect(page.locator("#enroll-claim[data-token-used]")).to_be_visible(timeout=10_000)  # the reveal polls every 2 s
    page.steps.shot("token-used")
    page.click("button:has-text('Check node readiness')")  # no confirmation: the token has done its work
    expect(page.locator("[data-step=progress]")).to_be_visible()
    page.reload()
    expect(page.locator("[data-step=progress]")).to_be_visible()
    assert page.dialogs == ["beforeunload", "confirm"]
    # C4 still holds: nothing the browser keeps holds a token.
    stored = page.evaluate("JSON.stringify(localStorage) + JSON.stringify(sessionStorage)")
    assert "mfe_" not in stored and token not in stored
    assert_no_secrets(agent_server.log(), token)


def test_the_enrolments_page_lists_tokens_and_revokes_a_pending_one(agent_server, browser_context):
    page = watched_page(browser_context)
    orphan = requests.post(
        agent_server.url + "/api/v1/admin/node-enrollments",
        json=factories.enrollment_body(display_name="Minted by a script", labels={"rack": "b"}),
        headers=ADMIN,
        timeout=10,
    ).json()
    sign_in(page, agent_server.url)
    page.click("a:has-text('Enrolments')")
    expect(page).to_have_url(agent_server.url + "/hardware/enrollments")
    row = page.locator("[data-testid=pending-enrollment]", has_text="Minted by a script")
    expect(row).to_contain_text("rack=b")
    expect(row).to_contain_text(orphan["token"][:10] + "…")
    page.steps.shot("pending-listed")
    row.locator("button:has-text('Revoke')").click()  # the page accepts the confirmation
    expect(page.locator("[data-testid=enrollments-notice]")).to_contain_text("Token revoked")
    expect(page.locator("[data-testid=pending-enrollment]")).to_have_count(0)
    revoked = page.locator("[data-testid=recent-enrollment]", has_text="Minted by a script")
    expect(revoked).to_contain_text("revoked")
    assert page.dialogs == ["confirm"]
    page.steps.shot("revoked-from-list")
    revoked.locator("a:has-text('Minted by a script')").click()  # the orphaned token's own page
    expect(page.locator("[data-testid=enrollment-state]")).to_have_text("revoked")
    expect(page.locator("[data-testid=token-dead-next]")).to_be_visible()
    expect(page.locator("text=Then: recreate without the token")).to_have_count(0)
    state = requests.get(
        f"{agent_server.url}/api/v1/admin/node-enrollments/{orphan['id']}", headers=ADMIN, timeout=10
    ).json()["state"]
    assert state == "revoked"


def test_a_token_that_expires_on_the_readiness_step_takes_its_commands_with_it(agent_server, browser_context, tmp_path):
    page = watched_page(browser_context)
    sign_in(page, agent_server.url)
    mint_in_wizard(page, "Expires on the readiness step")
    page.click("button:has-text('I have saved the token')")
    page.click("button:has-text('Check node readiness')")
    expect(page.locator("#recreate-command")).to_be_visible()
    # The token runs out while the panel polls: straight in the server's SQLite, as the clock would.
    with sqlite3.connect(tmp_path / "agent-server.sqlite3") as database:
        database.execute("UPDATE enrollments SET expires_at = created_at")
    expect(page.locator("[data-testid=token-dead-next]")).to_be_visible(timeout=10_000)
    expect(page.locator("#readiness-panel")).to_have_attribute("data-polling", "false")
    expect(page.locator("#recreate-command")).to_have_count(0)
    expect(page.locator("text=Then: recreate without the token")).to_have_count(0)
    page.steps.shot("expired-on-readiness")
