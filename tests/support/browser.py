"""Playwright helpers for the browser tier: Debian's Chromium, step screenshots, sign-in as a person does."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

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
