"""The HTML console through Flask's test client (C1–C5, E4, I4–I6, R2, P2).

Every page and partial: the full page vs the htmx fragment (`Vary: HX-Request`), CSRF
refusals, sign-in redirects, and that a revealed secret appears once and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import uuid
from datetime import timedelta
from html import unescape
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from app import create_app
from app.extensions import db
from app.models import AuditEvent, Credential, Enrollment, Node
from app.timeutil import utcnow
from tests.support import ADMIN, OPERATOR_KEY, PROJECT_ROOT, app_env, factories
from tests.support.console import HTMX, csrf_from, htmx_post, sign_in
from tests.support.nodes import online_node

# --------------------------------------------------------------------------- C1 sign-in


CONSOLE_PAGES = ["/", "/hardware/nodes", "/hardware/enroll", "/audit"]


@pytest.mark.parametrize("path", CONSOLE_PAGES)
def test_pages_redirect_to_login_without_a_session(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/login?next=")


def test_every_console_route_needs_a_session(app, client):
    node = factories.enrolled_node(client)
    enrollment_id = factories.mint(client)["id"]
    checked = 0
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("console.") and rule.endpoint != "console.login":
            path = rule.rule.replace("<node_id>", node["node_id"]).replace("<enrollment_id>", enrollment_id)
            # Ids in paths are UUIDs (checked app-wide before anything else); these need not exist.
            path = re.sub(r"<(?:[a-z]+:)?[a-z_]*id>", lambda _: str(uuid.uuid4()), path)
            path = re.sub(r"<any\(([a-z_-]+)[^>]*>", r"\1", path)  # an `any(...)` part: its first choice
            for method in rule.methods - {"HEAD", "OPTIONS"}:
                response = client.open(path, method=method)
                # POSTs without a session are refused before anything else (CSRF or login).
                assert response.status_code in (302, 400), (method, path, response.status_code)
                checked += 1
                # With a valid CSRF token (a visitor's session from the login page) but no sign-in,
                # it is login_required, not CSRF, that refuses: a redirect to the login page.
                csrf = csrf_from(client.get("/login").get_data(as_text=True))
                response = client.open(path, method=method, headers={"X-CSRFToken": csrf})
                assert response.status_code == 302, (method, path, response.status_code)
                assert response.headers["Location"].startswith("/login")
    assert checked >= 12
    with app.app_context():  # and none of those requests changed anything
        assert db.session.scalar(sa.select(Node.disabled)) is False
        assert db.session.scalar(sa.select(Enrollment.state).where(Enrollment.id == enrollment_id)) == "pending"


def test_htmx_request_without_session_gets_401_and_hx_redirect(client):
    response = client.get("/hardware/nodes", headers=HTMX)
    assert response.status_code == 401
    assert response.headers["HX-Redirect"] == "/login"


def test_sign_in_sets_a_hardened_session_cookie_and_redirects_to_next(client):
    response = sign_in(client, next_path="/audit")
    assert response.status_code == 302 and response.headers["Location"] == "/audit"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie  # plain http: a Secure cookie would never come back
    assert OPERATOR_KEY not in cookie
    assert client.get("/hardware/nodes").status_code == 200


def test_session_cookie_is_secure_over_https(app):
    client = app.test_client()
    page = client.get("/login", base_url="https://console.lan")
    response = client.post(
        "/login",
        base_url="https://console.lan",
        data={"operator_key": OPERATOR_KEY, "csrf_token": csrf_from(page.get_data(as_text=True))},
        # Over HTTPS Flask-WTF also checks the Referer is this origin, as a browser sends it.
        headers={"Referer": "https://console.lan/login"},
    )
    assert response.status_code == 302
    assert "Secure" in response.headers["Set-Cookie"]


FORWARDED = {
    "X-Forwarded-For": "203.0.113.9",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "mf.example",
    "Referer": "https://mf.example/login",
}


@pytest.mark.parametrize("hops", ["1", None])
def test_behind_a_trusted_proxy_the_forwarded_client_scheme_and_host_count(database_url, tmp_path, hops):
    extra = {"MODELFORGE_TRUSTED_PROXY_HOPS": hops} if hops else {}
    proxied = create_app(app_env(database_url, tmp_path, **extra))
    client = proxied.test_client()
    page = client.get("/login", headers=FORWARDED)
    response = client.post(
        "/login",
        data={"operator_key": OPERATOR_KEY, "csrf_token": csrf_from(page.get_data(as_text=True))},
        headers=FORWARDED,
    )
    assert response.status_code == 302
    form = client.get("/hardware/enroll", headers=FORWARDED).get_data(as_text=True)
    with proxied.app_context():
        details = db.session.scalar(sa.select(AuditEvent.details).where(AuditEvent.action == "console.login"))
        db.session.remove()
        db.engine.dispose()
    if hops:
        assert "Secure" in response.headers["Set-Cookie"]
        assert details["remote_addr"] == "203.0.113.9"
        assert 'data-testid="api-origin">https://mf.example<' in form  # E3: the origin agents use
    else:  # nobody's X-Forwarded-* is believed unless the operator says a proxy is there
        assert "Secure" not in response.headers["Set-Cookie"]
        assert details["remote_addr"] == "127.0.0.1"
        assert 'data-testid="api-origin">http://localhost<' in form


@pytest.mark.parametrize(
    "target", ["//evil.example/x", "https://evil.example/", "/\\evil.example", "/x%0ay", "/x%0d%0aSet-Cookie:%20a=b"]
)
def test_next_never_leaves_the_console(client, target):
    response = sign_in(client, next_path=target)
    assert response.headers["Location"] == "/hardware/nodes"


def test_wrong_key_is_refused_audited_and_not_echoed(app, client):
    response = sign_in(client, key="not-the-key-but-long-enough-to-look-real")
    assert response.status_code == 401
    body = response.get_data(as_text=True)
    assert "That is not the operator key." in body
    assert "not-the-key-but-long-enough" not in body
    assert client.get("/hardware/nodes").status_code == 302
    with app.app_context():
        actions = db.session.scalars(sa.select(AuditEvent.action)).all()
    assert actions == ["console.login_failed"]


def test_login_rate_limit_refuses_wrong_keys_but_never_locks_the_operator_out(app, client):
    for _ in range(10):
        assert sign_in(client, key="wrong-" + "x" * 40).status_code == 401
    refused = sign_in(client, key="wrong-" + "y" * 40)
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) > 0
    assert "Too many failed sign-ins" in refused.get_data(as_text=True)
    with app.app_context():
        failures = db.session.scalar(
            sa.select(sa.func.count()).select_from(AuditEvent).where(AuditEvent.action == "console.login_failed")
        )
    assert failures == 10  # over the limit, refusals write nothing more
    assert client.get("/hardware/nodes").status_code == 302
    # Anyone can send ten bad keys; the operator's own key still works.
    assert sign_in(client).status_code == 302
    assert client.get("/hardware/nodes").status_code == 200


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        (None, "unknown"),
    ],
)
def test_login_limit_counts_ipv6_by_its_64(address, key):
    from app.console.auth import client_key

    assert client_key(address) == key


def test_login_without_csrf_token_is_refused(client):
    response = client.post("/login", data={"operator_key": OPERATOR_KEY})
    assert response.status_code == 400
    assert "security token" in response.get_data(as_text=True)
    assert client.get("/hardware/nodes").status_code == 302


def test_logout_ends_the_session(console):
    assert console.post("/logout", data={"csrf_token": console.csrf}).status_code == 302
    assert console.get("/hardware/nodes").status_code == 302


def test_logout_without_csrf_is_refused(console):
    assert console.post("/logout").status_code == 400
    assert console.get("/hardware/nodes").status_code == 200


def test_changing_the_operator_key_ends_every_session(database_url, tmp_path, console):
    cookie = console.get_cookie("modelforge_session")
    rekeyed = create_app(app_env(database_url, tmp_path, MODELFORGE_OPERATOR_API_KEY="another-key-" + "z" * 32))
    other = rekeyed.test_client()
    other.set_cookie("modelforge_session", cookie.value)
    assert other.get("/hardware/nodes").status_code == 302
    with rekeyed.app_context():
        db.engine.dispose()


# --------------------------------------------------------------------------- C2 nodes


def test_nodes_page_full_and_fragment(console):
    online_node(console)
    page = console.get("/hardware/nodes")
    fragment = console.get("/hardware/nodes", headers=HTMX)
    boosted = console.get("/hardware/nodes", headers={**HTMX, "HX-Boosted": "true"})
    for response in (page, fragment, boosted):
        assert response.status_code == 200
        assert "HX-Request" in response.headers["Vary"]
        assert response.headers["Cache-Control"] == "no-store"
    assert "<html" in page.get_data(as_text=True) and "<html" in boosted.get_data(as_text=True)
    html = fragment.get_data(as_text=True)
    assert "<html" not in html
    assert 'id="nodes-table"' in html and 'hx-trigger="every 5s"' in html
    assert "gpu-node-1" in html and "online" in html
    assert "1 × NVIDIA GeForce RTX 4080" in html
    assert "COMPATIBLE" in html


def test_nodes_page_flags_two_node_ids_sharing_a_hostname(console):
    factories.enrolled_node(console, hostname="tower")
    assert "duplicate-hostname-banner" not in console.get("/hardware/nodes").get_data(as_text=True)
    factories.enrolled_node(console, hostname="tower")
    html = console.get("/hardware/nodes", headers=HTMX).get_data(as_text=True)
    assert "duplicate-hostname-banner" in html
    assert "More than one node ID uses the hostname tower" in html


def test_nodes_page_filters_by_status_and_text_and_keeps_the_filter_while_polling(app, console):
    alpha = online_node(console)
    beta = online_node(console)
    with app.app_context():
        db.session.execute(sa.update(Node).where(Node.id == alpha["node_id"]).values(display_name="alpha-node"))
        db.session.execute(
            sa.update(Node).where(Node.id == beta["node_id"]).values(display_name="beta-node", disabled=True)
        )
        db.session.commit()
    disabled = console.get("/hardware/nodes?status=disabled", headers=HTMX).get_data(as_text=True)
    assert "beta-node" in disabled and "alpha-node" not in disabled
    assert "Showing 1 of 2." in disabled
    assert 'hx-get="/hardware/nodes?status=disabled"' in disabled  # the poll keeps the filter
    searched = console.get("/hardware/nodes?q=ALPHA", headers=HTMX).get_data(as_text=True)
    assert "alpha-node" in searched and "beta-node" not in searched
    by_id = console.get(f"/hardware/nodes?q={beta['node_id'][:8]}", headers=HTMX).get_data(as_text=True)
    assert "beta-node" in by_id and "alpha-node" not in by_id
    by_model = console.get("/hardware/nodes?q=rtx%204080", headers=HTMX).get_data(as_text=True)
    assert by_model.count("data-node-id") == 2
    none = console.get("/hardware/nodes?status=online&q=nothing-like-this", headers=HTMX).get_data(as_text=True)
    assert "No node matches this filter." in none
    bad = console.get("/hardware/nodes?status=%00bogus")
    assert bad.status_code == 400 and "showing every node" in bad.get_data(as_text=True)
    assert bad.get_data(as_text=True).count("data-node-id") == 2


def test_nodes_page_shows_stale_and_disabled(app, console):
    node = factories.enrolled_node(console)
    headers = factories.bearer(node["credential"])
    console.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(telemetry=[]), headers=headers)
    with app.app_context():
        db.session.execute(
            sa.text("UPDATE node_leases SET last_heartbeat_at = :at"), {"at": utcnow() - timedelta(seconds=60)}
        )
        db.session.execute(sa.update(Node).values(disabled=True))
        db.session.commit()
    html = console.get("/hardware/nodes", headers=HTMX).get_data(as_text=True)
    assert 'mf-badge mf-status-stale">stale' in html
    assert 'mf-status-disabled">disabled' in html
    assert "none (disabled)" in html


# --------------------------------------------------------------------------- C3 node page


def test_node_page_shows_every_fact_with_its_time(console):
    node = online_node(console)
    path = f"/hardware/nodes/{node['node_id']}"
    facts_by_tab = {
        # Overview: status, agent, host, and each GPU with its latest reading.
        "": ("gpu-node-1", "0.1.0-test", "protocol 1", "COMPATIBLE", "AMD Ryzen 9 7950X", "16 CPUs", "64.0 GiB",
             "NVIDIA GeForce RTX 4080", "16.0 GiB", "37 %", "51 °C", "123 W", "inventory received", "Disable node"),
        # GPUs & telemetry: every GPU fact, its reading and the charts.
        "/gpus": ("GPU-00000000-0000-0000-0000-000000000001", "NVIDIA GeForce RTX 4080", "16.0 GiB", "550.54.14",
                  "37 %", "51 °C", "123 W", 'id="node-charts"', "<svg"),
        "/credential": ("Rotate credential",),
        "/audit": ("node.enrolled",),
    }  # fmt: skip
    for suffix, facts in facts_by_tab.items():
        html = console.get(path + suffix).get_data(as_text=True)
        for fact in facts:
            assert fact in html, (suffix, fact)
        if suffix in ("", "/gpus"):
            assert html.count(" UTC") >= 2, suffix  # measured times are shown


def test_node_page_timeline_is_this_nodes_audit_newest_first(console):
    first, second = online_node(console, hostname="first-node"), online_node(console, hostname="second-node")
    html = console.get(f"/hardware/nodes/{first['node_id']}/audit").get_data(as_text=True)
    timeline = html.split('id="audit-table"')[1].split("</table>")[0]
    assert "node.enrolled" in timeline
    assert second["node_id"] not in timeline and first["node_id"] in timeline  # links to this node
    actions = re.findall(r"<strong>([a-z_.]+)</strong>", timeline)
    assert actions[-1] == "node.enrolled"  # the oldest event comes last


def test_node_page_copes_with_a_sparse_inventory(app, console):
    node = factories.enrolled_node(console)
    with app.app_context():
        from app.models import NodeInventory

        db.session.add(NodeInventory(node_id=node["node_id"], facts={"hostname": "gpu-node-1"}, received_at=utcnow()))
        db.session.commit()
    response = console.get(f"/hardware/nodes/{node['node_id']}")
    assert response.status_code == 200
    assert "Memory</dt><dd>—" in response.get_data(as_text=True)


def test_malformed_agent_facts_are_refused_by_name_and_the_node_page_stands(console):
    node = factories.enrolled_node(console)
    headers = factories.bearer(node["credential"])
    body = factories.inventory_body(storage=["state"], unknown_reasons=["a"], cpu_count="many")
    refused = console.post("/api/v1/agent/inventory", json=body, headers=headers)
    assert refused.status_code == 400 and "inventory." in refused.get_json()["error"]["message"], refused.get_json()
    page = console.get(f"/hardware/nodes/{node['node_id']}")
    assert page.status_code == 200
    assert console.get(f"/hardware/nodes/{node['node_id']}", headers=HTMX).status_code == 200


def test_agent_version_shows_when_it_was_reported(app, console):
    node = factories.enrolled_node(console)
    headers = factories.bearer(node["credential"])
    assert console.post("/api/v1/agent/inventory", json=factories.inventory_body(), headers=headers).status_code == 200
    html = console.get(f"/hardware/nodes/{node['node_id']}").get_data(as_text=True)
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    reported = re.search(rf'reported <time datetime="[^"]+Z" data-local-time>({when})</time>', html)
    assert reported, "the agent version carries the time it was reported, before any heartbeat"


@pytest.mark.parametrize(
    "path",
    [
        "/hardware/nodes/%00",
        "/hardware/nodes/not-a-uuid/charts",
        "/hardware/enrollments/%00",
        "/hardware/enrollments/x%00y/readiness",
    ],
)
def test_ids_that_are_not_uuids_are_404_not_500(console, path):
    assert console.get(path).status_code == 404
    assert console.get(path, headers=HTMX).status_code == 404


def test_posts_to_ids_that_are_not_uuids_are_404(console):
    for path in ("/hardware/nodes/%00/disable", "/hardware/enrollments/%00/revoke"):
        assert htmx_post(console, path).status_code == 404


def test_node_page_fragment_and_charts_partial(console):
    node = online_node(console)
    fragment = console.get(f"/hardware/nodes/{node['node_id']}", headers=HTMX)
    html = fragment.get_data(as_text=True)
    assert "<html" not in html and 'id="node-live"' in html
    assert "node-changed from:body" in html
    assert "HX-Request" in fragment.headers["Vary"]
    charts = console.get(f"/hardware/nodes/{node['node_id']}/charts?window=day", headers=HTMX)
    assert charts.status_code == 200
    chart_html = charts.get_data(as_text=True)
    assert "<html" not in chart_html and "last day" in chart_html and chart_html.count("<svg") == 4
    # outside htmx the charts URL leads to the node page with that window
    assert console.get(f"/hardware/nodes/{node['node_id']}/charts?window=day").status_code == 302


def test_unknown_node_is_an_html_404(console):
    response = console.get("/hardware/nodes/0b9cbbd8-0000-4000-8000-000000000000")
    assert response.status_code == 404
    assert "<html" in response.get_data(as_text=True)
    response = htmx_post(console, "/hardware/nodes/0b9cbbd8-0000-4000-8000-000000000000/disable")
    assert response.status_code == 404
    assert "NODE_NOT_FOUND" in response.get_data(as_text=True)


def test_disable_and_enable_from_the_node_page(app, console):
    node = online_node(console)
    path = f"/hardware/nodes/{node['node_id']}"
    response = htmx_post(console, path + "/disable")
    assert response.status_code == 200
    # the response is #node-live itself, the one panel that listens for node-changed
    assert "HX-Trigger" not in response.headers
    assert 'data-testid="node-disabled"' in response.get_data(as_text=True)
    heartbeat = console.post(
        "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=factories.bearer(node["credential"])
    )
    assert heartbeat.status_code == 403  # I6: refused at once
    assert "Enable node" in response.get_data(as_text=True)
    enabled = htmx_post(console, path + "/enable").get_data(as_text=True)
    assert "Disable node" in enabled and 'data-testid="node-disabled"' not in enabled
    with app.app_context():
        actions = db.session.scalars(sa.select(AuditEvent.action).where(AuditEvent.node_id == node["node_id"])).all()
    assert "node.disabled" in actions and "node.enabled" in actions


def test_drain_and_undrain_from_the_node_page_behind_a_confirmation(app, console):
    node = online_node(console)
    path = f"/hardware/nodes/{node['node_id']}"
    page = console.get(path).get_data(as_text=True)
    assert "Drain node" in page and "takes no new job or deployment until you undrain it" in page  # hx-confirm
    drained = htmx_post(console, path + "/drain")
    assert drained.status_code == 200
    shown = drained.get_data(as_text=True)
    assert 'data-testid="node-draining"' in shown and "Undrain node" in shown
    assert 'data-testid="row-draining"' in console.get("/hardware/nodes").get_data(as_text=True)
    heartbeat = console.post(
        "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=factories.bearer(node["credential"])
    )
    assert heartbeat.status_code == 200 and heartbeat.get_json()["jobs_waiting"] == 0  # draining is not disabled
    undrained = htmx_post(console, path + "/undrain").get_data(as_text=True)
    assert "Drain node" in undrained and 'data-testid="node-draining"' not in undrained
    with app.app_context():
        assert db.session.scalar(sa.select(Node.draining)) is False


def test_actions_without_csrf_change_nothing(app, console):
    node = online_node(console)
    for action in ("disable", "drain", "credential/rotate", "credential/revoke"):
        response = console.post(f"/hardware/nodes/{node['node_id']}/{action}", headers=HTMX)
        assert response.status_code == 400, action
        assert "security token" in response.get_data(as_text=True)
        wrong = console.post(f"/hardware/nodes/{node['node_id']}/{action}", headers={**HTMX, "X-CSRFToken": "forged"})
        assert wrong.status_code == 400
    with app.app_context():
        assert db.session.scalar(sa.select(Node.disabled)) is False
        assert db.session.scalar(sa.select(sa.func.count()).select_from(Credential)) == 1


def test_rotate_shows_the_new_credential_once(app, console):
    node = online_node(console)
    path = f"/hardware/nodes/{node['node_id']}"
    response = htmx_post(console, path + "/credential/rotate")
    assert response.status_code == 200
    assert response.headers["HX-Trigger"] == "node-changed"  # the timeline refreshes; this panel keeps the reveal
    assert response.headers["Cache-Control"] == "no-store"
    html = response.get_data(as_text=True)
    secret = re.search(r"data-secret>(mfn_[^<]+)<", html).group(1)
    assert "/data/state/node-credential" in html and "--force-recreate" in html
    # the new credential works, the old one does not, and it is never shown again
    ok = console.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=factories.bearer(secret))
    assert ok.status_code == 200
    old = console.post(
        "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=factories.bearer(node["credential"])
    )
    assert old.status_code == 401
    assert secret not in console.get(path).get_data(as_text=True)
    assert secret not in str(console.get_cookie("modelforge_session").value)
    with app.app_context():
        stored = db.session.scalar(sa.select(Credential.token_hash).where(Credential.revoked_at.is_(None)))
    assert stored == hashlib.sha256(secret.encode()).hexdigest()


def test_revoke_credential_then_again_is_a_clear_409(console):
    node = online_node(console)
    path = f"/hardware/nodes/{node['node_id']}/credential/revoke"
    first = htmx_post(console, path)
    assert first.status_code == 200 and "Credential revoked" in first.get_data(as_text=True)
    second = htmx_post(console, path)
    assert second.status_code == 409
    assert "has no active credential" in second.get_data(as_text=True)


# --------------------------------------------------------------------------- C4 wizard


def enroll_form(console, **fields: str):
    """POST the wizard's step 1 as htmx does."""
    data = {"display_name": "Rack GPU", "expires_in_seconds": "900", "accelerator_mode": "nvidia",
            "image_source": "local", **fields}  # fmt: skip
    return htmx_post(console, "/hardware/enroll", data=data)


def test_wizard_form_fixes_origin_and_offers_four_expiries(console):
    html = console.get("/hardware/enroll").get_data(as_text=True)
    assert 'data-testid="api-origin">http://localhost<' in html
    for value in ("300", "900", "3600", "86400"):
        assert f'value="{value}"' in html
    assert "Production eligible — always off" in html
    assert 'name="production_eligible"' not in html
    fragment = console.get("/hardware/enroll", headers=HTMX).get_data(as_text=True)
    assert "<html" not in fragment and 'data-step="form"' in fragment


def test_wizard_reveals_the_token_once_and_stores_only_its_hash(app, console):
    response = enroll_form(console, labels="rack=a\ngpu = 4090", role="inference", production_eligible="y")
    assert response.status_code == 201
    assert response.headers["Cache-Control"] == "no-store"
    html = response.get_data(as_text=True)
    token = re.search(r"data-secret>(mfe_[^<]+)<", html).group(1)
    assert html.count(token) == 1  # only in the reveal: not in the .env, the command or a URL
    env_text = re.search(r'data-testid="env-file">(.*?)</pre>', html, re.S).group(1)
    assert "MODELFORGE_AGENT_CONTROL_PLANE_URL=http://localhost" in env_text
    assert "ENROLLMENT_TOKEN=" not in env_text and "mfe_" not in env_text
    assert "read -rs" in html and "mktemp" in html
    assert 'data-expires-in="' in html
    with app.app_context():
        minted = db.session.scalar(sa.select(Enrollment))
        assert minted.token_hash == hashlib.sha256(token.encode()).hexdigest()
        assert minted.production_eligible is False  # E4, whatever the form sent
        assert minted.labels == {"rack": "a", "gpu": "4090"} and minted.role == "inference"
        assert minted.api_origin == "http://localhost"
        assert (minted.expires_at - minted.created_at).total_seconds() == 900
    # never in the session, never again from the server
    assert token not in str(console.get_cookie("modelforge_session").value)
    assert token not in console.get(f"/hardware/enrollments/{minted.id}").get_data(as_text=True)
    assert token not in console.get("/hardware/enroll").get_data(as_text=True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"display_name": ""}, "Give the node a name"),
        ({"labels": "no-equals-sign"}, "write labels as key=value"),
        ({"labels": "a=1\na=2"}, "appears twice"),
        ({"expires_in_seconds": "7200"}, "Not a valid choice"),
        ({"accelerator_mode": "tpu"}, "Not a valid choice"),
        ({"display_name": "bad\x01name"}, "printable characters"),
        ({"display_name": "cost ${HOME}"}, "must not contain"),
        ({"display_name": "it's $5"}, "must not contain"),
        ({"role": "gpu\x00box"}, "printable characters"),
        ({"labels": "has space=x"}, "a label name is up to 63"),
        ({"labels": "ok=bad\x00value"}, "printable characters"),
    ],
)
def test_wizard_refuses_bad_input_clearly_and_mints_nothing(app, console, fields, message):
    response = enroll_form(console, **fields)
    assert response.status_code == 422
    html = response.get_data(as_text=True)
    assert message in html and "mfe_" not in html
    with app.app_context():
        assert db.session.scalar(sa.select(sa.func.count()).select_from(Enrollment)) == 0


RELEASE_ENTRY = {
    "tag": "modelforge-node-agent:1.3.0-rc.1",
    "architecture": "amd64",
    "os": "linux",
    "rootfs_layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64],
    "labels": {"org.opencontainers.image.version": "1.3.0-rc.1", "org.opencontainers.image.revision": "abc"},
    "config": {
        "entrypoint": ["/usr/bin/python3", "-m", "modelforge_node_agent"],
        "cmd": [],
        "env": [],
        "volumes": [],
        "exposed_ports": [],
        "user": "65532",
        "working_dir": "",
    },
    "image_id": "sha256:" + "c" * 64,
}
PINNED = "registry.lan:5000/ml/modelforge-node-agent:1.3.0@sha256:" + "d" * 64


def test_the_wizard_defaults_to_the_checkout_build_and_the_release_needs_its_manifest_entry(app, console):
    # Issue 25: a newcomer has a clone and no release manifest, so the default needs neither.
    form = console.get("/hardware/enroll").get_data(as_text=True)
    assert re.search(r'<input checked id="image_source-0"[^>]*value="local"', form)
    assert re.search(r'<input id="image_source-1"[^>]*value="release"', form)
    assert re.search(r"A clone of the repository has\s+none of them", form)  # why the release is not the default
    response = enroll_form(console, image_source="release")
    assert response.status_code == 422
    assert "Paste images.modelforge-node-agent" in response.get_data(as_text=True)
    with app.app_context():
        assert db.session.scalar(sa.select(sa.func.count()).select_from(Enrollment)) == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image_source": "release", "release_entry": "{not json"}, "not JSON"),
        ({"image_source": "release", "release_entry": json.dumps({**RELEASE_ENTRY, "tag": "x:1"})}, "must name the"),
        (
            {"image_source": "release", "release_entry": json.dumps({**RELEASE_ENTRY, "rootfs_layers": "a"})},
            "rootfs_layers",
        ),
        ({"image_source": "digest", "pinned_reference": "registry.lan/modelforge-node-agent:1.3.0"}, "@sha256"),
        ({"image_source": "digest", "pinned_reference": PINNED + "; rm -rf /"}, "Pin the image by digest"),
        ({"image_source": "docker-hub"}, "Not a valid choice"),
        # a lone surrogate once passed validation, minted a token, then failed to render (500)
        (
            {"image_source": "release", "release_entry": json.dumps({**RELEASE_ENTRY, "labels": {"x": "\ud800"}})},
            "printable",
        ),
    ],
)
def test_a_bad_image_choice_is_refused_before_minting(app, console, fields, message):
    response = enroll_form(console, **fields)
    assert response.status_code == 422
    assert message in response.get_data(as_text=True)
    with app.app_context():
        assert db.session.scalar(sa.select(sa.func.count()).select_from(Enrollment)) == 0


def commands_of(html: str) -> dict[str, str]:
    return {
        name: unescape(re.search(rf'id="{name}"[^>]*>(.*?)</pre>', html, re.S).group(1))
        for name in ("env-file", "start-command", "recreate-command", "start-command-again")
        if f'id="{name}"' in html
    }


def test_a_release_image_is_checked_by_the_start_command_and_remembered(app, console):
    pasted = json.dumps({"schema": "modelforge-release-manifest/1", "images": {"modelforge-node-agent": RELEASE_ENTRY}})
    response = enroll_form(console, image_source="release", release_entry=pasted)
    assert response.status_code == 201
    reveal = commands_of(response.get_data(as_text=True))
    assert "MODELFORGE_NODE_AGENT_IMAGE=modelforge-node-agent:1.3.0-rc.1\n" in reveal["env-file"]
    start = reveal["start-command"]
    assert "image=modelforge-node-agent:1.3.0-rc.1" in start
    assert "sha256:" + "a" * 64 + " \\\n      sha256:" + "b" * 64 in start
    assert "expect_image 'label org.opencontainers.image.revision' " in start
    assert "c" * 64 not in start  # the build host's image ID is never compared
    assert "up --no-start --no-build --pull never node-agent" in start
    assert "expect_image 'config entrypoint'" in start and "expect_image 'config user'" in start
    assert start.index("expect_image architecture") < start.index("read -rs")  # checked before the token
    with app.app_context():
        minted = db.session.scalar(sa.select(Enrollment))
        assert minted.agent_image["kind"] == "release"
        assert minted.agent_image["release"]["rootfs_layers"] == RELEASE_ENTRY["rootfs_layers"]
        created = db.session.scalar(sa.select(AuditEvent).where(AuditEvent.action == "enrollment.created"))
        assert created.details["agent_image"] == "modelforge-node-agent:1.3.0-rc.1"
    progress = commands_of(console.get(f"/hardware/enrollments/{minted.id}").get_data(as_text=True))
    assert progress["start-command-again"] == start  # the same commands at every step
    assert "--force-recreate --no-build --pull never node-agent" in progress["recreate-command"]
    assert "-u MODELFORGE_NODE_AGENT_IMAGE" in progress["recreate-command"]
    api = console.get(f"/api/v1/admin/node-enrollments/{minted.id}", headers=ADMIN).get_json()
    assert "agent_image" not in json.dumps(api)  # console metadata, not part of the API


def test_a_pinned_image_goes_into_the_env_and_is_never_built(console):
    response = enroll_form(console, image_source="digest", pinned_reference=f"  {PINNED} ")
    assert response.status_code == 201
    commands = commands_of(response.get_data(as_text=True))
    assert f"MODELFORGE_NODE_AGENT_IMAGE={PINNED}\n" in commands["env-file"]
    assert "up -d --no-build node-agent" in commands["start-command"]
    assert "unset MODELFORGE_NODE_AGENT_IMAGE" in commands["start-command"]  # .env's pin wins over the shell
    assert "expect_image" not in commands["start-command"]


def test_wizard_without_csrf_mints_nothing(app, console):
    response = console.post("/hardware/enroll", data={"display_name": "x", "expires_in_seconds": "900"}, headers=HTMX)
    assert response.status_code == 400
    with app.app_context():
        assert db.session.scalar(sa.select(sa.func.count()).select_from(Enrollment)) == 0


def test_readiness_panel_polls_until_the_exact_node_is_ready(console):
    html = enroll_form(console).get_data(as_text=True)
    enrollment_id = re.search(r'data-enrollment-id="([^"]+)"', html).group(1)
    token = re.search(r"data-secret>(mfe_[^<]+)<", html).group(1)
    panel_path = f"/hardware/enrollments/{enrollment_id}/readiness"
    step = console.get(f"/hardware/enrollments/{enrollment_id}", headers=HTMX).get_data(as_text=True)
    assert "<html" not in step and 'data-polling="true"' in step and 'hx-trigger="every 2s"' in step
    assert "--force-recreate" in step
    # another node enrolling elsewhere does not make this panel ready (R1: the exact node)
    online_node(console, hostname="someone-else")
    assert 'data-polling="true"' in console.get(panel_path, headers=HTMX).get_data(as_text=True)
    claim = console.post("/api/v1/agent/enroll", json=factories.enroll_body(token, hostname="wizard-node"))
    node_id = claim.get_json()["node_id"]
    headers = factories.bearer(claim.get_json()["credential"])
    waiting = console.get(panel_path, headers=HTMX).get_data(as_text=True)
    assert node_id in waiting and 'data-polling="true"' in waiting and 'data-ready="false"' in waiting
    console.post("/api/v1/agent/inventory", json=factories.inventory_body(), headers=headers)
    console.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=headers)
    ready = console.get(panel_path, headers=HTMX)
    ready_html = ready.get_data(as_text=True)
    assert 'data-ready="true"' in ready_html and 'data-polling="false"' in ready_html
    assert "hx-trigger" not in ready_html  # rendered without its trigger: polling stops
    assert "<html" in console.get(panel_path).get_data(as_text=True)


def test_revoke_unused_token_stops_the_panel(app, console):
    html = enroll_form(console).get_data(as_text=True)
    enrollment_id = re.search(r'data-enrollment-id="([^"]+)"', html).group(1)
    token = re.search(r"data-secret>(mfe_[^<]+)<", html).group(1)
    response = htmx_post(console, f"/hardware/enrollments/{enrollment_id}/revoke")
    body = response.get_data(as_text=True)
    assert response.status_code == 200 and "Token revoked" in body
    assert token not in body and 'data-polling="false"' in body and "revoked" in body
    claim = console.post("/api/v1/agent/enroll", json=factories.enroll_body(token))
    assert claim.status_code == 410
    again = htmx_post(console, f"/hardware/enrollments/{enrollment_id}/revoke")
    assert again.status_code == 409 and "only an unused, unexpired token can be revoked" in again.get_data(as_text=True)


def test_unknown_enrollment_is_an_html_404(console):
    response = console.get("/hardware/enrollments/0b9cbbd8-0000-4000-8000-000000000000", headers=HTMX)
    assert response.status_code == 404 and "ENROLLMENT_NOT_FOUND" in response.get_data(as_text=True)


# --------------------------------------------------------------------------- C5 audit


def test_audit_page_filters_and_fragment(console):
    first = online_node(console, hostname="alpha")
    online_node(console, hostname="beta")
    htmx_post(console, f"/hardware/nodes/{first['node_id']}/disable")
    page = console.get("/audit")
    assert page.status_code == 200 and "<html" in page.get_data(as_text=True)
    by_action = console.get("/audit?action=node.disabled", headers=HTMX).get_data(as_text=True)
    assert "<html" not in by_action and by_action.count("data-event-id") == 1
    by_node = console.get(f"/audit?node={first['node_id']}", headers=HTMX).get_data(as_text=True)
    assert by_node.count("data-event-id") >= 3  # enrolled, online, disabled …
    assert "beta" not in by_node
    future = console.get("/audit?since=2999-01-01T00:00", headers=HTMX).get_data(as_text=True)
    assert "No events match." in future
    past = console.get("/audit?until=2000-01-01", headers=HTMX).get_data(as_text=True)
    assert "No events match." in past


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("since=yesterday", "Use a date and time like"),
        ("before=-3", "Not a page marker."),
        ("before=%C2%B2", "Not a page marker."),
        ("action=%00", "Pick a value from the list."),
        ("node=a%00b", "Pick a value from the list."),
    ],
)
def test_audit_page_refuses_bad_filters_with_a_message(console, query, message):
    response = console.get(f"/audit?{query}")
    assert response.status_code == 400
    assert message in response.get_data(as_text=True)


def test_audit_until_includes_the_minute_and_day_it_names(console):
    factories.enrolled_node(console)
    now = utcnow()
    minute = now.strftime("%Y-%m-%dT%H:%M")
    same_minute = console.get(f"/audit?since={minute}&until={minute}", headers=HTMX).get_data(as_text=True)
    assert "node.enrolled" in same_minute
    today = console.get(f"/audit?until={now:%Y-%m-%d}", headers=HTMX).get_data(as_text=True)
    assert "node.enrolled" in today


def test_audit_page_paginates_newest_first(app, console):
    with app.app_context():
        from app import audit

        for number in range(120):
            audit.record("operator", "test.event", None, number=number)
        db.session.commit()
    seen = []
    path = "/audit?action=test.event"
    while path:
        html = console.get(path, headers=HTMX).get_data(as_text=True)
        seen.extend(int(value) for value in re.findall(r"number: (\d+)", html))
        older = re.search(r'href="([^"]+)" data-testid="older"', html)
        path = older.group(1).replace("&amp;", "&") if older else None
    assert seen == list(range(119, -1, -1))


def test_the_action_filter_offers_exactly_the_actions_in_the_log(app, console):
    """The loose index scan finds each distinct action once, in order, and nothing on an empty log."""
    from app import audit

    with app.app_context():
        db.session.execute(sa.delete(AuditEvent))
        db.session.commit()
        assert audit.distinct_actions() == []
        for action in ("zeta.last", "alpha.first", "node.offline", "alpha.first", "node.offline", "node.online"):
            audit.record("operator", action)
        db.session.commit()
        assert audit.distinct_actions() == ["alpha.first", "node.offline", "node.online", "zeta.last"]
    html = console.get("/audit").get_data(as_text=True)
    offered = re.findall(r"<option >([^<]+)</option>", html.split('name="action"')[1].split("</select>")[0])
    assert offered == ["alpha.first", "node.offline", "node.online", "zeta.last"]


# --------------------------------------------------------------------------- assets and headers


def test_htmx_is_vendored_pinned_and_licensed():
    directory = PROJECT_ROOT / "static" / "vendor" / "htmx-2.0.11"
    source = (directory / "SOURCE.md").read_text()
    digest = hashlib.sha256((directory / "htmx.min.js").read_bytes()).hexdigest()
    assert f"SHA-256 `{digest}`" in source
    assert "Zero-Clause BSD" in (directory / "LICENSE").read_text()


def test_console_loads_nothing_from_the_internet(console):
    html = console.get("/hardware/nodes").get_data(as_text=True)
    assert "/static/vendor/htmx-2.0.11/htmx.min.js" in html
    assert not re.search(r'(src|href)="(https?:)?//', html)
    for template in Path(PROJECT_ROOT / "templates").rglob("*.html"):
        assert not re.search(r'(src|href)="(https?:)?//', template.read_text()), template


def test_console_responses_carry_a_strict_csp(console):
    response = console.get("/hardware/nodes")
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "<script>" not in response.get_data(as_text=True)  # no inline script to allow


def test_api_still_answers_json_with_the_admin_header(client):
    response = client.get("/api/v1/hardware/nodes", headers=ADMIN)
    assert response.status_code == 200 and response.is_json
    assert "Content-Security-Policy" not in response.headers


# --------------------------------------------------------------------------- P5 failures as pages


@pytest.mark.parametrize(
    ("failure", "status", "title"),
    [
        (OperationalError("SELECT 1", None, sqlite3.OperationalError("locked")), 503, "Database unavailable"),
        (RuntimeError("detail for the log only"), 500, "Internal server error"),
    ],
    ids=["database-unavailable", "unexpected"],
)
def test_a_failing_console_page_is_an_html_error_page_or_fragment(console, monkeypatch, failure, status, title):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr("app.nodes.summaries", fail)
    page = console.get("/hardware/nodes")
    fragment = console.get("/hardware/nodes", headers=HTMX)
    for response in (page, fragment):
        html = response.get_data(as_text=True)
        assert response.status_code == status and response.mimetype == "text/html"
        assert title in html and 'class="mf-error"' in html and "detail for the log only" not in html
        assert response.headers.get("Retry-After") == ("2" if status == 503 else None)
        assert "HX-Request" in response.headers["Vary"] and response.headers["Cache-Control"] == "no-store"
    assert "<html" in page.get_data(as_text=True)
    assert "<html" not in fragment.get_data(as_text=True)
