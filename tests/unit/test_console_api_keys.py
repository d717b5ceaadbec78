"""The API keys page: list, mint with a one-time reveal, revoke behind a confirmation (S1, S6, C1)."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.errors import DomainError
from app.extensions import db
from app.models import ApiKey, AuditEvent
from app.serving import api_keys
from app.timeutil import utcnow
from tests.support import ADMIN
from tests.support.console import HTMX, htmx_post

PAGE = "/settings/api-keys"
REVEALED = re.compile(r'data-testid="revealed-api-key">(mfk_[^<]+)<')


def mint_form(console, **fields: str):
    """POST the mint form as htmx does."""
    return htmx_post(console, PAGE, data={"name": "open-webui", "expires_in_seconds": "0", **fields})


def keys(app) -> list[ApiKey]:
    with app.app_context():
        found = list(db.session.scalars(sa.select(ApiKey)))
        db.session.expunge_all()
        return found


def audit_count(app) -> int:
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(AuditEvent))


def row_of(html: str, api_key_id: str) -> str:
    match = re.search(rf'<tr data-api-key-id="{api_key_id}".*?</tr>', html, re.S)
    assert match, "the key has no row"
    return match.group(0)


def test_the_page_is_in_the_navigation_and_lists_nothing_at_first(console):
    html = console.get("/hardware/nodes").get_data(as_text=True)
    assert f'href="{PAGE}"' in html
    page = console.get(PAGE)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'href="{PAGE}" aria-current="page">API keys<' in html
    assert "No client keys yet." in html and '<label for="name">Name</label>' in html
    fragment = console.get(PAGE, headers=HTMX).get_data(as_text=True)
    assert "<html" not in fragment and 'id="api-keys"' in fragment


def test_the_page_needs_a_session(client):
    response = client.get(PAGE)
    assert response.status_code == 302 and response.headers["Location"].startswith("/login")


def test_minting_reveals_the_key_once_and_stores_only_its_digest(app, console):
    response = mint_form(console, expires_in_seconds=str(30 * 86_400))
    assert response.status_code == 201
    assert response.headers["Cache-Control"] == "no-store"
    html = response.get_data(as_text=True)
    key = REVEALED.search(html).group(1)
    assert html.count(key) == 1  # only in the reveal: not in a URL, an attribute or the table
    assert 'data-secret-reveal hx-history="false"' in html and 'data-copy-target="#revealed-api-key"' in html
    assert "<script" not in html  # the copy button and the hiding are static/console.js (strict CSP)

    (stored,) = keys(app)
    assert stored.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert stored.name == "open-webui" and stored.prefix == key[:10]
    assert (stored.expires_at - stored.created_at) == timedelta(days=30)
    row = row_of(html, stored.id)
    assert f"<code>{stored.prefix}…</code>" in row and "active" in row and "never" in row  # never used

    # Never again from the server, and never in the session cookie.
    assert key not in console.get(PAGE).get_data(as_text=True)
    assert key not in str(console.get_cookie("modelforge_session").value)
    with app.app_context():
        assert api_keys.authenticate(key).api_key_id == stored.id


def test_a_key_minted_in_the_console_is_listed_by_the_api(console):
    mint_form(console, name="ci runner")
    (listed,) = console.get("/api/v1/admin/api-keys", headers=ADMIN).get_json()["api_keys"]
    assert listed["name"] == "ci runner" and listed["expires_at"] is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": ""}, "Name the key after the program"),
        ({"name": "   "}, "Name the key after the program"),
        ({"name": "x" * 201}, "Field cannot be longer than 200 characters."),
        ({"name": "bad\x01name"}, "printable characters"),
        ({"expires_in_seconds": "59"}, "Not a valid choice"),
        ({"expires_in_seconds": "soon"}, "Invalid Choice"),
    ],
)
def test_a_bad_mint_form_says_why_and_mints_nothing(app, console, fields, message):
    before = audit_count(app)
    response = mint_form(console, **fields)
    assert response.status_code == 422
    html = response.get_data(as_text=True)
    assert message in html and 'role="alert"' in html
    assert "mfk_" not in html.replace("mfk_…", "")
    assert keys(app) == [] and audit_count(app) == before


def test_minting_without_csrf_mints_nothing(app, console):
    response = console.post(PAGE, data={"name": "x", "expires_in_seconds": "0"}, headers=HTMX)
    assert response.status_code == 400 and "security token" in response.get_data(as_text=True)
    assert keys(app) == []


def test_revoking_asks_first_then_refuses_the_key_and_shows_when(app, console):
    key = REVEALED.search(mint_form(console).get_data(as_text=True)).group(1)
    (stored,) = keys(app)
    page = console.get(PAGE).get_data(as_text=True)
    form = re.search(r'<form method="post" action="([^"]+/revoke)".*?</form>', page, re.S)
    assert form.group(1) == f"{PAGE}/{stored.id}/revoke"
    assert 'hx-confirm="Revoke the key “open-webui”' in form.group(0) and 'name="csrf_token"' in form.group(0)

    response = htmx_post(console, form.group(1))
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "revoked: its next request is refused" in html
    row = row_of(html, stored.id)
    assert "revoked" in row and "/revoke" not in row  # no second revoke button
    with app.app_context():
        with pytest.raises(DomainError, match="revoked"):
            api_keys.authenticate(key)

    again = htmx_post(console, form.group(1))
    assert again.status_code == 200
    with app.app_context():
        assert (
            db.session.scalar(
                sa.select(sa.func.count()).select_from(AuditEvent).where(AuditEvent.action == "api_key.revoked")
            )
            == 1
        )


def test_revoking_without_csrf_changes_nothing(app, console):
    mint_form(console)
    (stored,) = keys(app)
    response = console.post(f"{PAGE}/{stored.id}/revoke", headers=HTMX)
    assert response.status_code == 400
    assert keys(app)[0].revoked_at is None


@pytest.mark.parametrize("api_key_id", ["00000000-0000-4000-8000-0000000000aa", "not-a-uuid"])
def test_revoking_an_unknown_key_is_an_html_404(console, api_key_id):
    response = htmx_post(console, f"{PAGE}/{api_key_id}/revoke")
    assert response.status_code == 404
    assert "No API key has id" in response.get_data(as_text=True)


def test_an_expired_key_is_shown_expired_without_a_revoke_for_nothing(app, console):
    mint_form(console, expires_in_seconds="86400")
    (stored,) = keys(app)
    with app.app_context():
        db.session.execute(sa.update(ApiKey).values(expires_at=utcnow() - timedelta(seconds=1)))
        db.session.commit()
    row = row_of(console.get(PAGE).get_data(as_text=True), stored.id)
    assert "expired" in row and "active" not in row


def test_last_use_is_shown_once_a_client_used_the_key(app, console):
    key = REVEALED.search(mint_form(console).get_data(as_text=True)).group(1)
    (stored,) = keys(app)
    with app.app_context():
        api_keys.authenticate(key)
    row = row_of(console.get(PAGE).get_data(as_text=True), stored.id)
    assert re.search(r"<td>\d+ s ago</td>", row)


def test_a_name_is_text_not_markup(app, console):
    mint_form(console, name='<img src=x onerror="alert(1)">')
    html = console.get(PAGE).get_data(as_text=True)
    assert "<img src=x" not in html and "&lt;img src=x" in html
