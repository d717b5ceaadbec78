"""E3, P5: the origin an enrolment records when MODELFORGE_PUBLIC_API_ORIGIN is unset (issue 22 item 9).

A control plane listening on loopback only (`make run`) can be reached under a loopback name
alone: any other well-formed Host is DNS rebinding or a hand-made request, and is refused before
anything is minted. Listening on every address or behind trusted proxies, the Host cannot be
checked, so the wizard says where the origin came from and how to fix it.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from app import create_app
from app.extensions import db
from app.models import Enrollment
from tests.support import ADMIN, OPERATOR_KEY, app_env, factories
from tests.support.console import HTMX, csrf_from

WARNING = 'data-testid="api-origin-warning"'


@pytest.fixture
def make_app(database_url, tmp_path):
    """Control planes with these settings; disposed after the test."""
    made = []

    def make(**env: str):
        application = create_app(app_env(database_url, tmp_path, **env))
        made.append(application)
        return application

    yield make
    for application in made:
        with application.app_context():
            db.session.remove()
            db.engine.dispose()


def mint(client, host: str, **headers: str):
    return client.post(
        "/api/v1/admin/node-enrollments",
        json=factories.enrollment_body(),
        headers={**ADMIN, "Host": host, **headers},
    )


class Browser:
    """An operator's browser that reached the console under `host` (its session cookie is that host's)."""

    def __init__(self, client, host: str) -> None:
        self.client, self.base = client, f"http://{host}"
        login = client.get("/login", base_url=self.base).get_data(as_text=True)
        signed = client.post(
            "/login", base_url=self.base, data={"operator_key": OPERATOR_KEY, "csrf_token": csrf_from(login)}
        )
        assert signed.status_code == 302, signed.get_data(as_text=True)[:500]
        self.csrf = csrf_from(client.get("/hardware/nodes", base_url=self.base).get_data(as_text=True))

    def get(self, path: str, **headers: str):
        return self.client.get(path, base_url=self.base, headers=headers)

    def post(self, path: str, data: dict[str, str]):
        return self.client.post(path, base_url=self.base, data={**data, "csrf_token": self.csrf}, headers=HTMX)


def enrolments(app) -> list[str]:
    with app.app_context():
        return list(db.session.scalars(sa.select(Enrollment.api_origin)))


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io:8000", "10.0.0.5:8000"])
def test_a_foreign_host_on_a_loopback_listener_is_refused_before_anything_is_minted(make_app, host):
    application = make_app()  # MODELFORGE_BIND's default, 127.0.0.1:8000
    client = application.test_client()
    refused = mint(client, host)
    assert refused.status_code == 400, refused.get_json()
    error = refused.get_json()["error"]
    assert error["code"] == "HOST_HEADER_INVALID" and refused.get_json()["header"] == "Host"
    assert "127.0.0.1:8000" in error["message"] and "MODELFORGE_PUBLIC_API_ORIGIN" in error["next_step"]
    browser = Browser(client, host)
    wizard = browser.get("/hardware/enroll")
    assert wizard.status_code == 400 and "MODELFORGE_PUBLIC_API_ORIGIN" in wizard.get_data(as_text=True)
    form = {"display_name": "Rebound", "expires_in_seconds": "900", "accelerator_mode": "cpu"}
    posted = browser.post("/hardware/enroll", form)
    assert posted.status_code == 400 and "mfe_" not in posted.get_data(as_text=True)
    assert enrolments(application) == []


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("localhost", "http://localhost"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("app.localhost:8000", "http://app.localhost:8000"),
    ],
)
def test_a_loopback_name_on_a_loopback_listener_is_recorded_without_a_warning(make_app, host, origin):
    application = make_app()
    client = application.test_client()
    minted = mint(client, host)
    assert minted.status_code == 201, minted.get_json()
    assert minted.get_json()["api_origin"] == origin
    wizard = Browser(client, host).get("/hardware/enroll").get_data(as_text=True)
    assert f'data-testid="api-origin">{origin}<' in wizard and WARNING not in wizard


def test_on_every_address_any_host_is_recorded_and_the_wizard_warns_where_it_came_from(make_app):
    application = make_app(MODELFORGE_BIND="0.0.0.0:8000")
    client = application.test_client()
    assert mint(client, "gpu-box.lan:8000").get_json()["api_origin"] == "http://gpu-box.lan:8000"
    wizard = Browser(client, "gpu-box.lan:8000").get("/hardware/enroll").get_data(as_text=True)
    assert WARNING in wizard and "MODELFORGE_PUBLIC_API_ORIGIN" in wizard and "gpu-box.lan:8000" in wizard


def test_behind_trusted_proxies_the_forwarded_host_is_recorded_and_the_wizard_warns(make_app):
    application = make_app(MODELFORGE_TRUSTED_PROXY_HOPS="1")
    forwarded = {"X-Forwarded-Host": "mf.example", "X-Forwarded-Proto": "https"}
    client = application.test_client()
    assert mint(client, "127.0.0.1:8000", **forwarded).get_json()["api_origin"] == "https://mf.example"
    wizard = Browser(client, "127.0.0.1:8000").get("/hardware/enroll", **forwarded).get_data(as_text=True)
    assert WARNING in wizard


def test_a_configured_origin_is_recorded_whatever_the_host_and_nothing_is_warned(make_app):
    application = make_app(MODELFORGE_PUBLIC_API_ORIGIN="https://modelforge.lan")
    client = application.test_client()
    assert mint(client, "evil.example").get_json()["api_origin"] == "https://modelforge.lan"
    page = Browser(client, "evil.example").get("/hardware/enroll")
    assert page.status_code == 200 and WARNING not in page.get_data(as_text=True)
    assert 'data-testid="api-origin">https://modelforge.lan<' in page.get_data(as_text=True)


LOOPBACK_HINT = 'data-testid="api-origin-loopback"'


@pytest.mark.parametrize(
    ("env", "host", "hinted"),
    [
        ({}, "127.0.0.1:8000", True),  # `make run`, reached as the README says
        ({}, "localhost:8000", True),
        ({}, "[::1]:8000", True),
        ({"MODELFORGE_PUBLIC_API_ORIGIN": "http://127.0.0.1:8000"}, "127.0.0.1:8000", True),
        ({"MODELFORGE_PUBLIC_API_ORIGIN": "https://modelforge.lan"}, "127.0.0.1:8000", False),
        ({"MODELFORGE_BIND": "0.0.0.0:8000"}, "gpu-box.lan:8000", False),
    ],
)
def test_a_loopback_origin_says_another_host_cannot_reach_it_and_names_the_setting(make_app, env, host, hinted):
    # Issue 25: the wizard locks the origin; a loopback one works only for an agent on this machine.
    application = make_app(**env)
    wizard = Browser(application.test_client(), host).get("/hardware/enroll").get_data(as_text=True)
    assert (LOOPBACK_HINT in wizard) is hinted
    if hinted:
        hint = re.search(rf"{LOOPBACK_HINT}>(.*?)</p>", wizard, re.S).group(1)
        assert "another host" in hint and "<code>MODELFORGE_PUBLIC_API_ORIGIN</code>" in hint
