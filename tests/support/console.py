"""The console through the Flask test client: sign in with the login form, the CSRF token, htmx posts."""

from __future__ import annotations

import re

from tests.support import OPERATOR_KEY

HTMX = {"HX-Request": "true"}
# The console's session cookie (C1).
COOKIE = "modelforge_session"


CSRF_INPUT = re.compile(r'name="csrf_token" type="hidden" value="([^"]+)"|name="csrf_token" value="([^"]+)"')


def csrf_from(html: str) -> str:
    """The CSRF token a rendered page carries (hidden input or the body's hx-headers)."""
    match = CSRF_INPUT.search(html) or re.search(r"X-CSRFToken&#34;: &#34;([^&]+)&#34;", html)
    assert match, "no CSRF token in the page"
    return next(group for group in match.groups() if group)


def sign_in(client, key: str = OPERATOR_KEY, next_path: str | None = None):
    """Sign in through the login form; returns the response to the POST."""
    page = client.get("/login")
    url = "/login" if next_path is None else f"/login?next={next_path}"
    return client.post(url, data={"operator_key": key, "csrf_token": csrf_from(page.get_data(as_text=True))})


def htmx_post(console, path: str, **kwargs):
    """An htmx POST: CSRF in the X-CSRFToken header, as `hx-headers` on <body> sends it."""
    return console.post(path, headers={**HTMX, "X-CSRFToken": console.csrf}, **kwargs)


def signed_in(client, page: str = "/hardware/nodes"):
    """`client` with an operator session, signed in through the login form; `.csrf` holds the
    session's CSRF token, read from `page`."""
    assert sign_in(client).status_code == 302
    client.csrf = csrf_from(client.get(page).get_data(as_text=True))
    return client
