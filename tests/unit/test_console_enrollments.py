"""Tokens do not get lost (issue 25 item 5; C4, E1, E5): the console lists pending enrolments and
recent ones without their tokens, revokes a pending one from the list through the one revoke rule,
and a revoked or expired token's page no longer tells the operator to recreate anything.
"""

from __future__ import annotations

import re
from html import unescape

import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent, Enrollment
from tests.support import factories
from tests.support.console import HTMX, htmx_post

LIST = "/hardware/enrollments"
RECREATE = "Then: recreate without the token"


def wizard_reveal(console, display_name: str, **fields: str) -> str:
    """Mint through the wizard as htmx does; returns the reveal step's HTML."""
    data = {"display_name": display_name, "expires_in_seconds": "900", "accelerator_mode": "nvidia",
            "image_source": "local", **fields}  # fmt: skip
    response = htmx_post(console, "/hardware/enroll", data=data)
    assert response.status_code == 201
    return response.get_data(as_text=True)


def wizard_token(console, display_name: str, **fields: str) -> tuple[str, str]:
    """Mint through the wizard; returns (enrolment id, token)."""
    html = wizard_reveal(console, display_name, **fields)
    enrollment_id = re.search(r'data-enrollment-id="([^"]+)"', html).group(1)
    return enrollment_id, re.search(r"data-secret>(mfe_[^<]+)<", html).group(1)


def section(html: str, testid: str) -> str:
    """One of the list's two sections, so a row is checked in the right one."""
    match = re.search(rf'<section[^>]*data-testid="{testid}".*?</section>', html, re.S)
    assert match, testid
    return unescape(match.group(0))


def row(html: str, enrollment_id: str) -> str:
    match = re.search(rf'<tr data-enrollment-id="{enrollment_id}".*?</tr>', html, re.S)
    assert match, enrollment_id
    return match.group(0)


def state_of(app, enrollment_id: str) -> str:
    with app.app_context():
        return db.session.scalar(sa.select(Enrollment.state).where(Enrollment.id == enrollment_id))


def test_the_list_shows_pending_and_recent_enrolments_without_their_tokens(app, console):
    wizard_id, wizard_secret = wizard_token(console, "Rack GPU", labels="rack=a\ngpu=4090", role="inference")
    orphan = factories.mint(console, display_name="Minted by script")  # API only: nothing else links its page
    expired = factories.mint(console, display_name="Ran out")
    factories.expire_enrollments(app, expired["id"])  # not swept yet: still "pending" in the table
    revoked = factories.mint(console, display_name="Thrown away")
    revoke = console.post(f"/api/v1/admin/node-enrollments/{revoked['id']}/revoke", headers=factories.ADMIN)
    assert revoke.status_code == 200
    used = factories.mint(console, display_name="Now a node")
    node_id = console.post("/api/v1/agent/enroll", json=factories.enroll_body(used["token"])).get_json()["node_id"]

    response = console.get(LIST)
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    html = response.get_data(as_text=True)
    for secret in (wizard_secret, orphan["token"], expired["token"], revoked["token"], used["token"]):
        assert secret not in html
    pending = section(html, "pending-enrollments")
    assert {wizard_id, orphan["id"]} == set(re.findall(r'<tr data-enrollment-id="([^"]+)"', pending))
    wizard_row = row(pending, wizard_id)
    assert all(fact in wizard_row for fact in ("Rack GPU", "rack=a", "gpu=4090", "inference"))
    assert wizard_secret[:10] + "…" in wizard_row  # the visible prefix only
    assert "<time datetime=" in wizard_row  # created and expiry, shown in the reader's time zone by console.js
    orphan_row = row(pending, orphan["id"])
    assert f'href="/hardware/enrollments/{orphan["id"]}"' in orphan_row  # the orphaned token's page, linked
    assert f'action="/hardware/enrollments/{orphan["id"]}/revoke-from-list"' in orphan_row
    assert 'name="csrf_token"' in orphan_row and "hx-confirm=" in orphan_row
    recent = section(html, "recent-enrollments")
    assert {expired["id"], revoked["id"], used["id"]} == set(re.findall(r'<tr data-enrollment-id="([^"]+)"', recent))
    assert 'data-state="expired"' in row(recent, expired["id"])
    assert 'data-state="revoked"' in row(recent, revoked["id"])
    used_row = row(recent, used["id"])
    assert 'data-state="consumed"' in used_row and f"/hardware/nodes/{node_id}" in used_row
    assert "revoke-from-list" not in recent  # nothing left to revoke there
    assert 'href="/hardware/enrollments/' in recent

    fragment = console.get(LIST, headers=HTMX).get_data(as_text=True)
    assert "<html" not in fragment and 'id="enrollments"' in fragment


def test_the_enrol_page_and_the_node_list_link_to_the_enrolments(console):
    factories.mint(console, display_name="One")
    factories.mint(console, display_name="Two")
    enrol = console.get("/hardware/enroll").get_data(as_text=True)
    assert f'href="{LIST}"' in enrol
    assert re.search(r"2 tokens minted earlier\s+are still unused", enrol)
    assert f'href="{LIST}"' in console.get("/hardware/nodes").get_data(as_text=True)


def test_the_list_keeps_only_the_last_fifty_finished_tokens(app, console):
    ids = [factories.mint(console, display_name=f"Old {number}")["id"] for number in range(52)]
    factories.expire_enrollments(app)
    recent = section(console.get(LIST).get_data(as_text=True), "recent-enrollments")
    shown = re.findall(r'<tr data-enrollment-id="([^"]+)"', recent)
    assert len(shown) == 50 and set(shown) <= set(ids)


def test_revoking_from_the_list_moves_the_token_to_recent_and_it_can_no_longer_enrol(app, console):
    enrollment_id, token = wizard_token(console, "Changed my mind")
    response = htmx_post(console, f"{LIST}/{enrollment_id}/revoke-from-list")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "<html" not in html and 'id="enrollments"' in html
    assert "Token revoked: no node can use it now" in unescape(html) and token not in html
    assert enrollment_id not in section(html, "pending-enrollments")
    assert 'data-state="revoked"' in row(section(html, "recent-enrollments"), enrollment_id)
    assert state_of(app, enrollment_id) == "revoked"
    claim = console.post("/api/v1/agent/enroll", json=factories.enroll_body(token))
    assert claim.status_code == 410 and claim.get_json()["error"]["code"] == "ENROLLMENT_TOKEN_REVOKED"
    # Twice is a clear 409 from the same rule the API and the wizard use, and is audited once.
    again = htmx_post(console, f"{LIST}/{enrollment_id}/revoke-from-list")
    assert again.status_code == 409
    assert "only an unused, unexpired token can be revoked" in again.get_data(as_text=True)
    with app.app_context():
        revocations = db.session.scalar(
            sa.select(sa.func.count()).select_from(AuditEvent).where(AuditEvent.action == "enrollment.revoked")
        )
    assert revocations == 1


def test_revoking_from_the_list_works_without_javascript_and_needs_csrf(app, console):
    enrollment_id = factories.mint(console, display_name="Plain form")["id"]
    refused = console.post(f"{LIST}/{enrollment_id}/revoke-from-list")
    assert refused.status_code == 400 and state_of(app, enrollment_id) == "pending"
    posted = console.post(f"{LIST}/{enrollment_id}/revoke-from-list", data={"csrf_token": console.csrf})
    assert posted.status_code == 200 and "<html" in posted.get_data(as_text=True)
    assert state_of(app, enrollment_id) == "revoked"


def test_an_expired_token_cannot_be_revoked_from_the_list(app, console):
    enrollment_id = factories.mint(console, display_name="Too late")["id"]
    factories.expire_enrollments(app, enrollment_id)
    response = htmx_post(console, f"{LIST}/{enrollment_id}/revoke-from-list")
    assert response.status_code == 409 and "is expired" in response.get_data(as_text=True)
    assert state_of(app, enrollment_id) == "pending"  # left for the sweep (E5), not changed by a refusal


def test_after_revoking_the_wizard_no_longer_says_to_recreate_without_the_token(app, console):
    enrollment_id, _ = wizard_token(console, "Revoked in the wizard")
    waiting = console.get(f"/hardware/enrollments/{enrollment_id}", headers=HTMX).get_data(as_text=True)
    assert RECREATE in waiting  # still useful while the token can be used
    revoked = htmx_post(console, f"/hardware/enrollments/{enrollment_id}/revoke").get_data(as_text=True)
    assert "Token revoked" in revoked
    assert RECREATE not in revoked and "--force-recreate" not in revoked
    assert 'data-testid="token-dead-next"' in revoked and 'href="/hardware/enroll"' in revoked
    page = console.get(f"/hardware/enrollments/{enrollment_id}").get_data(as_text=True)
    assert RECREATE not in page and 'data-testid="token-dead-next"' in page


def test_an_expired_tokens_page_does_not_say_to_recreate_either(app, console):
    enrollment_id, _ = wizard_token(console, "Expired in the wizard")
    factories.expire_enrollments(app, enrollment_id)
    page = console.get(f"/hardware/enrollments/{enrollment_id}").get_data(as_text=True)
    assert RECREATE not in page and 'data-testid="token-dead-next"' in page


def test_the_reveal_polls_until_a_node_has_used_the_token(console):
    enrollment_id, token = wizard_token(console, "Watched")
    path = f"/hardware/enrollments/{enrollment_id}/claim"
    waiting = console.get(path, headers=HTMX).get_data(as_text=True)
    assert 'hx-trigger="every 2s"' in waiting and "data-token-used" not in waiting and token not in waiting
    assert console.post("/api/v1/agent/enroll", json=factories.enroll_body(token)).status_code == 201
    used = console.get(path, headers=HTMX).get_data(as_text=True)
    assert "data-token-used" in used and "hx-trigger" not in used  # rendered without its trigger: polling stops


def test_the_reveal_guards_the_token_until_it_is_saved(console):
    html = wizard_reveal(console, "Guarded")
    assert re.search(r"<div[^>]*data-secret-reveal[^>]*data-guard-unload", html)  # console.js asks before leaving
    assert "data-secret-saved" in html
    check = re.search(r"<button[^>]*data-confirm-leave=\"[^\"]+\"[^>]*>\s*Check node readiness", html)
    assert check, "Check node readiness asks before it takes the token away"


def test_a_token_that_expires_while_the_panel_polls_takes_the_recreate_step_with_it(app, console):
    enrollment_id, _ = wizard_token(console, "Expires while watched")
    panel = f"/hardware/enrollments/{enrollment_id}/readiness"
    assert "hx-swap-oob" not in console.get(panel, headers=HTMX).get_data(as_text=True)
    factories.expire_enrollments(app, enrollment_id)
    polled = console.get(panel, headers=HTMX).get_data(as_text=True)
    assert 'data-polling="false"' in polled
    # The step's recreate, worker and start commands are replaced out of band, beside the panel.
    assert re.search(r'<div id="enroll-next" hx-swap-oob="true">\s*<p data-testid="token-dead-next"', polled)
    assert RECREATE not in polled
    page = console.get(panel).get_data(as_text=True)  # the whole page: one such element, not swapped
    assert page.count('id="enroll-next"') == 1 and "hx-swap-oob" not in page and RECREATE not in page
