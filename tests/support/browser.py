"""Playwright helpers for the browser tier: Debian's Chromium, step screenshots, sign-in as a person does."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import requests

from tests.support import OPERATOR_KEY, PROJECT_ROOT

playwright_api = pytest.importorskip("playwright.sync_api")


expect = playwright_api.expect


CHROMIUM = os.environ.get("MODELFORGE_TEST_CHROMIUM", "/usr/bin/chromium")


ARTIFACTS = Path(os.environ.get("MODELFORGE_TEST_ARTIFACTS", PROJECT_ROOT / "test-artifacts")) / "console"


class Steps:
    """Numbered screenshots of one test's steps."""

    def __init__(self, page, name: str) -> None:
        self.page = page
        self.directory = ARTIFACTS / name
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        self.count = 0

    def shot(self, label: str) -> None:
        """Save the whole page as NN-label.png."""
        self.count += 1
        self.page.screenshot(path=self.directory / f"{self.count:02d}-{label}.png", full_page=True)


def sign_in(page, base_url: str, path: str = "/hardware/nodes") -> None:
    """Open a console page, get sent to the login page, sign in, land where we were going."""
    page.goto(base_url + path)
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.fill("#operator_key", OPERATOR_KEY)
    page.click("button:has-text('Sign in')")
    expect(page).to_have_url(base_url + path)


class Reply:
    """A requests response read the way the Flask test client's helpers read one."""

    def __init__(self, response: requests.Response) -> None:
        self.status_code = response.status_code
        self.response = response

    def get_json(self):
        """The JSON body, or None for an empty one (a 204)."""
        return self.response.json() if self.response.content else None


class Api:
    """The control plane's HTTP API over the network, called as the test-client helpers call it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def post(self, path: str, json=None, headers=None) -> Reply:
        """POST a JSON body to a path of the server."""
        return Reply(self.session.post(self.url + path, json=json, headers=headers, timeout=10))

    def get(self, path: str, headers=None) -> Reply:
        """GET a path of the server."""
        return Reply(self.session.get(self.url + path, headers=headers, timeout=10))
