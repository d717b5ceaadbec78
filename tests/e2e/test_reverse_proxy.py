"""Behind a real TLS-terminating nginx: MODELFORGE_TRUSTED_PROXY_HOPS=1 (C1, E3).

nginx terminates HTTPS with a certificate from a private CA made here and forwards to the real
gunicorn over plain HTTP, setting X-Forwarded-For/-Proto/-Host/-Port the way most installs do.
With one trusted hop the control plane must see what the user sees: an https origin (so the
session cookie is Secure and E3 records the proxy's origin), and the client's address as nginx
saw it — not whatever the client wrote into its own X-Forwarded-For.

The compose file's own proxy configuration (deploy/nginx/nginx.conf) runs here too, on the host
with only its addresses and paths moved: alone with one trusted hop, and behind the TLS nginx
with two, as the operator guide describes.
"""

from __future__ import annotations

import re
import shutil

import pytest
import requests
import sqlalchemy as sa

from tests.support import ADMIN, OPERATOR_KEY, factories
from tests.support.gunicorn import GunicornServer
from tests.support.nginx import NGINX, DeployNginx, Nginx


@pytest.fixture
def proxied(sqlite_template, tmp_path, request):
    """gunicorn on plain HTTP trusting `hops` proxies (default 1), and nginx in front of it over HTTPS."""
    if NGINX is None:
        pytest.skip("nginx is not installed")
    database = tmp_path / "proxied.sqlite3"
    shutil.copyfile(sqlite_template, database)
    hops = str(getattr(request, "param", 1))
    server = GunicornServer(f"sqlite:///{database}", tmp_path, workers=2, MODELFORGE_TRUSTED_PROXY_HOPS=hops)
    server.start()
    (tmp_path / "nginx").mkdir()
    nginx = Nginx(tmp_path / "nginx", server.port)
    yield server, nginx
    nginx.stop()
    server.stop()


def csrf_token(html: str) -> str:
    return re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', html).group(1)


def failed_login_details(server) -> str:
    """The details of the one audited failed sign-in (the address the control plane believed)."""
    engine = sa.create_engine(server.env["MODELFORGE_DATABASE_URL"])
    with engine.connect() as connection:
        details = connection.execute(
            sa.text("SELECT details FROM audit_events WHERE action = 'console.login_failed'")
        ).scalar_one()
    engine.dispose()
    return details


def sign_in(session: requests.Session, base: str, key: str, ca) -> requests.Response:
    form = session.get(base + "/login", verify=ca)
    return session.post(
        base + "/login",
        data={"csrf_token": csrf_token(form.text), "operator_key": key},
        headers={"Referer": base + "/login"},
        allow_redirects=False,
        verify=ca,
    )


def test_through_the_proxy_the_session_is_secure_and_enrolments_get_its_origin(proxied):
    server, nginx = proxied
    # requests prefers REQUESTS_CA_BUNDLE over Session.verify, so every call names the test's CA.
    ca = str(nginx.ca)
    browser = requests.Session()
    assert browser.get(nginx.url + "/", verify=ca, allow_redirects=False).headers["Location"] == "/login?next=/"
    signed_in = sign_in(browser, nginx.url, OPERATOR_KEY, ca)
    assert signed_in.status_code == 302, signed_in.text
    cookie = signed_in.headers["Set-Cookie"]
    assert "modelforge_session=" in cookie and "Secure" in cookie and "HttpOnly" in cookie
    # The wizard shows, and records, the origin the user reached: the proxy's https one (E3).
    wizard = browser.get(nginx.url + "/hardware/enroll", verify=ca)
    assert f'data-testid="api-origin">{nginx.url}<' in wizard.text
    minted = requests.post(
        nginx.url + "/api/v1/admin/node-enrollments",
        json={"display_name": "Behind nginx", "expires_in_seconds": 900},
        headers=ADMIN,
        verify=ca,
        timeout=10,
    ).json()
    assert minted["api_origin"] == nginx.url
    # An agent told the backend's own address is refused; told the proxy's, it enrols through it.
    body = factories.enroll_body(minted["token"], hostname="proxied-node")
    direct = requests.post(server.url + "/api/v1/agent/enroll", json={**body, "control_plane_url": server.url})
    assert direct.status_code == 409 and direct.json()["error"]["code"] == "API_ORIGIN_MISMATCH"
    claimed = requests.post(
        nginx.url + "/api/v1/agent/enroll", json={**body, "control_plane_url": nginx.url}, verify=ca
    )
    assert claimed.status_code == 201, claimed.text


def test_the_login_limit_counts_the_address_nginx_saw_not_a_forged_one(proxied):
    server, nginx = proxied
    forger = requests.Session()
    forger.headers["X-Forwarded-For"] = "203.0.113.77"  # nginx appends the real peer after it
    assert sign_in(forger, nginx.url, "not-the-key" * 4, str(nginx.ca)).status_code == 401
    details = failed_login_details(server)
    assert '"remote_addr": "127.0.0.1"' in details and "203.0.113.77" not in details
    # nginx's own log shows the request came from 127.0.0.1 with the forged header beside it.
    assert "127.0.0.1" in (nginx.root / "access.log").read_text()


@pytest.mark.parametrize("proxied", [0], indirect=True)
def test_with_no_trusted_hop_nothing_the_proxy_forwards_is_believed(proxied):
    """Not by ModelForge, and not by gunicorn either (it would trust 127.0.0.1's X-Forwarded-Proto)."""
    server, nginx = proxied
    ca = str(nginx.ca)
    browser = requests.Session()
    signed_in = sign_in(browser, nginx.url, OPERATOR_KEY, ca)
    assert signed_in.status_code == 302, signed_in.text
    assert "Secure" not in signed_in.headers["Set-Cookie"]  # the backend saw plain HTTP
    wizard = browser.get(nginx.url + "/hardware/enroll", verify=ca)
    assert 'data-testid="api-origin">http://127.0.0.1<' in wizard.text  # nginx's Host, not its origin


# --------------------------------------------------------------------------- deploy/nginx/nginx.conf (D1)


@pytest.fixture
def deploy_proxied(sqlite_template, tmp_path, request):
    """gunicorn trusting `hops` proxies behind the compose file's own nginx configuration.

    With two hops, the test's TLS nginx stands in front of it, as the operator guide suggests.
    """
    if NGINX is None:
        pytest.skip("nginx is not installed")
    database = tmp_path / "deploy-proxied.sqlite3"
    shutil.copyfile(sqlite_template, database)
    hops = getattr(request, "param", 1)
    server = GunicornServer(f"sqlite:///{database}", tmp_path, workers=2, MODELFORGE_TRUSTED_PROXY_HOPS=str(hops))
    server.start()
    (tmp_path / "inner").mkdir()
    inner = DeployNginx(tmp_path / "inner", server.port)
    proxies = [inner]
    if hops == 2:
        (tmp_path / "outer").mkdir()
        proxies.insert(0, Nginx(tmp_path / "outer", inner.port))
    yield server, proxies
    for proxy in proxies:
        proxy.stop()
    server.stop()


def test_the_deploy_proxy_appends_what_one_trusted_hop_believes_whatever_a_client_forwards(deploy_proxied):
    server, [proxy] = deploy_proxied
    forged = {
        "X-Forwarded-For": "203.0.113.77",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "evil.example",
        "X-Forwarded-Port": "1",
    }
    minted = requests.post(
        proxy.url + "/api/v1/admin/node-enrollments",
        json={"display_name": "Behind the deploy proxy", "expires_in_seconds": 900},
        headers={**ADMIN, **forged},
        timeout=10,
    )
    assert minted.status_code == 201, minted.text
    assert minted.json()["api_origin"] == proxy.url  # its address and port, plain http
    forger = requests.Session()
    forger.headers.update(forged)
    signed_in = sign_in(forger, proxy.url, OPERATOR_KEY, True)
    assert signed_in.status_code == 302 and "Secure" not in signed_in.headers["Set-Cookie"]
    assert sign_in(requests.Session(), proxy.url, "not-the-key" * 4, True).status_code == 401
    details = failed_login_details(server)
    assert '"remote_addr": "127.0.0.1"' in details and "203.0.113.77" not in details


@pytest.mark.parametrize("deploy_proxied", [2], indirect=True)
def test_behind_a_tls_proxy_two_hops_believe_the_outer_proxys_origin(deploy_proxied):
    """The operator guide's TLS nginx in front of the compose proxy, MODELFORGE_TRUSTED_PROXY_HOPS=2."""
    server, [outer, inner] = deploy_proxied
    ca = str(outer.ca)
    browser = requests.Session()
    signed_in = sign_in(browser, outer.url, OPERATOR_KEY, ca)
    assert signed_in.status_code == 302, signed_in.text
    assert "Secure" in signed_in.headers["Set-Cookie"]
    minted = requests.post(
        outer.url + "/api/v1/admin/node-enrollments",
        json={"display_name": "Behind two proxies", "expires_in_seconds": 900},
        headers=ADMIN,
        verify=ca,
        timeout=10,
    ).json()
    assert minted["api_origin"] == outer.url  # https and the outer port, not the inner proxy's
