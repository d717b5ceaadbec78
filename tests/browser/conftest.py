"""The browser tier: Debian's Chromium under Playwright, one per test session, a fresh context per
test that fails the test on any console error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.browser import CHROMIUM, Steps, playwright_api


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium under Playwright; skipped (and so failed in CI) when it is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt install chromium)")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


# The host's network changed under Chromium: the containers tier creates and removes podman
# networks while browser tests run beside it, and Chromium then aborts the requests in flight
# (ERR_NETWORK_CHANGED), which htmx logs as a send error. That is not the console's doing; the
# test's own assertions still decide whether what it asked for happened.
HOST_NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"
HTMX_SEND_ERRORS = ("htmx:sendError", "htmx:afterRequest")


@pytest.fixture
def browser_context(chromium, request):
    """A fresh browser context; its pages accept confirmations like a user clicking OK, and the
    test fails on any console error: a CSP violation, a script error or a failed request, except
    those a test announces in `page.expected_errors` (a 4xx a form is meant to get)."""
    contexts, problems, expected = [], [], []

    def open_page(**options):
        context = chromium.new_context(viewport={"width": 1280, "height": 900}, **options)
        contexts.append(context)
        page = context.new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        page.on("console", lambda message: message.type == "error" and problems.append(message.text))
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.steps = Steps(page, request.node.name)
        page.expected_errors = expected
        return page

    yield open_page
    for context in contexts:
        context.close()
    if any(HOST_NETWORK_CHANGED in problem for problem in problems):
        problems = [
            problem
            for problem in problems
            if HOST_NETWORK_CHANGED not in problem and not problem.startswith(HTMX_SEND_ERRORS)
        ]
    assert [problem for problem in problems if not any(known in problem for known in expected)] == [], problems


@pytest.fixture
def page(browser_context):
    """A page in a fresh context."""
    return browser_context()
