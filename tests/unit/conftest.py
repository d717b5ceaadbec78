"""The unit tier: in process only. A test here that starts a subprocess fails, naming the tier it
belongs to instead (tests/conftest.py's TIERS)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.console import signed_in


@pytest.fixture(autouse=True)
def _no_subprocess(monkeypatch):
    def refuse(self, args, *rest, **options):
        raise AssertionError(
            f"a unit test started a subprocess ({args if isinstance(args, str) else args[0]!r}): "
            "move it to tests/e2e/ (or the tier of what it runs)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture
def console(client):
    """A test client with an operator session; `.csrf` holds the session's CSRF token."""
    return signed_in(client)
