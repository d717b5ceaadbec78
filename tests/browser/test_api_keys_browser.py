"""The API keys page in real Chromium against the real gunicorn: mint, reveal once, copy, revoke (S1, S6)."""

from __future__ import annotations

import re

import requests

from tests.support import ADMIN, assert_no_secrets
from tests.support.browser import expect, sign_in


def test_mint_reveals_the_key_once_copies_it_and_revoke_refuses_it(browser_context, agent_server):
    page = browser_context(permissions=["clipboard-read", "clipboard-write"])
    sign_in(page, agent_server.url)
    page.click("nav >> text=API keys")
    expect(page).to_have_url(agent_server.url + "/settings/api-keys")
    page.fill("#name", "open-webui on the NAS")
    page.select_option("#expires_in_seconds", str(30 * 86_400))
    page.steps.shot("mint-form")
    page.click("button:has-text('Mint key')")

    revealed = page.locator("[data-testid=revealed-api-key]")
    expect(revealed).to_be_visible()
    key = revealed.inner_text().strip()
    assert re.fullmatch(r"mfk_[A-Za-z0-9_-]{43}", key)
    page.click("button[data-copy-target='#revealed-api-key']")
    expect(page.locator("button[data-copy-target='#revealed-api-key']")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == key
    row = page.locator("[data-testid=api-key-row]", has_text="open-webui on the NAS")
    expect(row).to_contain_text(key[:10] + "…")
    expect(row).to_contain_text("active")
    page.steps.shot("key-revealed")

    page.click("button:has-text('I have copied it — hide the key')")
    expect(revealed).to_have_count(0)
    assert key not in page.content()
    page.reload()
    assert key not in page.content()  # never again from the server

    listed = requests.get(agent_server.url + "/api/v1/admin/api-keys", headers=ADMIN, timeout=10).json()["api_keys"]
    (item,) = listed
    assert item["name"] == "open-webui on the NAS" and item["revoked_at"] is None

    page.click("button[aria-label='Revoke open-webui on the NAS']")  # the page accepts the confirmation
    expect(page.locator("[data-testid=api-keys-notice]")).to_contain_text("revoked: its next request is refused")
    expect(row).to_contain_text("revoked")
    expect(page.locator("button[aria-label='Revoke open-webui on the NAS']")).to_have_count(0)
    page.steps.shot("key-revoked")
    listed = requests.get(agent_server.url + "/api/v1/admin/api-keys", headers=ADMIN, timeout=10).json()["api_keys"]
    assert listed[0]["revoked_at"] is not None
    assert_no_secrets(agent_server.log(), key)
