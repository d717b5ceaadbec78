"""The node page in tabs (C3, issue 25): each tab its own URL with the tab bar, polling only what it
shows; forms outside htmx land on their tab; an offline node's readings read as last reported; and
the node list's filter refuses a bad value without offering it back."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
import sqlalchemy as sa

from app import audit
from app.extensions import db
from app.models import TelemetrySample
from app.timeutil import utcnow
from tests.support import ADMIN
from tests.support.console import HTMX
from tests.support.nodes import beat, online_node, silence

UNKNOWN = "0b9cbbd8-0000-4000-8000-000000000000"
# Each tab: its path below the node, the label in the tab bar, and what only that tab shows.
TABS = {
    "": ("Overview", 'id="node-live"'),
    "/gpus": ("GPUs &amp; telemetry", 'id="node-charts"'),
    "/storage": ("Storage &amp; artifacts", 'id="node-roots"'),
    "/work": ("Jobs &amp; runtime", 'id="node-runtime-jobs"'),
    "/acceptance": ("Acceptance", 'id="acceptance-checklist"'),
    "/credential": ("Credential", 'id="node-credential"'),
    "/audit": ("Audit", 'id="audit-table"'),
}
# What polls itself (hx-trigger "every …"), by the id of the element that polls.
POLLING = re.compile(r'<[a-z]+ id="([a-z-]+)"[^>]*?hx-trigger="every')


def tab_bar(html: str) -> str:
    match = re.search(r'<nav class="mf-node-tabs" aria-label="Node sections">.*?</nav>', html, re.S)
    assert match, "no node tab bar"
    return match[0]


@pytest.mark.parametrize("suffix", list(TABS))
def test_each_tab_is_its_own_page_with_the_tab_bar_and_only_its_own_panels(console, suffix):
    node = online_node(console)
    path = f"/hardware/nodes/{node['id']}{suffix}"
    response = console.get(path)
    assert response.status_code == 200, path
    html = response.get_data(as_text=True)
    label, marker = TABS[suffix]
    assert marker in html
    bar = tab_bar(html)
    links = re.findall(r'<a href="([^"]+)" data-tab="[a-z]+" ?(aria-current="page")?>([^<]+)</a>', bar)
    assert [href for href, _, _ in links] == [f"/hardware/nodes/{node['id']}{each}" for each in TABS]
    assert [text for _, current, text in links if current] == [label], "exactly this tab is current"
    for other, (_, other_marker) in TABS.items():
        if other != suffix:
            assert other_marker not in html, (suffix, other_marker)


def test_each_tab_polls_only_what_it_shows(console):
    node = online_node(console)
    polled = {
        suffix: sorted(POLLING.findall(console.get(f"/hardware/nodes/{node['id']}{suffix}").get_data(as_text=True)))
        for suffix in TABS
    }
    assert polled == {
        "": ["node-acceptance", "node-live"],
        "/gpus": ["node-charts", "node-gpus"],
        "/storage": ["node-artifacts", "node-roots"],
        "/work": ["node-runtime"],
        "/acceptance": ["acceptance-checklist"],
        "/credential": [],
        "/audit": [],
    }
    # Each polling panel's URL answers with that panel alone.
    gpus = console.get(f"/hardware/nodes/{node['id']}/gpus", headers=HTMX).get_data(as_text=True)
    assert gpus.lstrip().startswith('<section id="node-gpus"') and "<nav" not in gpus
    assert "GPU-00000000-0000-0000-0000-000000000001" in gpus and "550.54.14" in gpus


@pytest.mark.parametrize("suffix", list(TABS))
def test_an_unknown_node_is_a_styled_404_on_every_tab_and_its_polled_panels(console, suffix):
    response = console.get(f"/hardware/nodes/{UNKNOWN}{suffix}")
    page = response.get_data(as_text=True)
    assert response.status_code == 404 and "<html" in page and "mf-main" in page, suffix
    assert "NODE_NOT_FOUND" in page and "Hardware → Nodes" in unescape(page)
    assert console.get(f"/hardware/nodes/{UNKNOWN}{suffix}", headers=HTMX).status_code == 404
    for panel in ("/charts", "/storage-roots", "/artifacts", "/acquire", "/runtime", "/runtime-jobs"):
        assert console.get(f"/hardware/nodes/{UNKNOWN}{panel}", headers=HTMX).status_code == 404, panel


def test_the_overview_keeps_the_actions_apart_from_the_status_and_disable_is_not_a_red_button(console):
    node = online_node(console)
    html = console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    status_card = html.split("<dt>Status</dt>")[1].split("</section>")[0]
    assert "<button" not in status_card, "no action inside the status card"
    actions = re.search(r'<section class="mf-card" id="node-actions".*?</section>', html, re.S)[0]
    disable = re.search(r"<button[^>]*>Disable node</button>", actions, re.S)[0]
    assert "mf-secondary" in disable and "mf-danger" not in disable
    assert 'hx-confirm="Disable' in disable  # the confirmation stays
    for action in ("Drain node", "toggle-lab_eligible", "toggle-benchmark_eligible", "Rotate or revoke the credential"):
        assert action in actions, action
    assert f'href="/hardware/nodes/{node["id"]}/credential"' in actions


def test_forms_outside_htmx_land_on_the_tab_they_belong_to(console):
    node = online_node(console)
    base = f"/hardware/nodes/{node['id']}"
    landed = {
        "storage-roots": console.post(f"{base}/storage-roots", data={"csrf_token": console.csrf}),
        "acquire": console.post(f"{base}/acquire", data={"csrf_token": console.csrf}),
        "benchmark": console.post(f"{base}/benchmark", data={"csrf_token": console.csrf}),
        "generate": console.post(f"{base}/generate", data={"csrf_token": console.csrf}),
        "disable": console.post(f"{base}/disable", data={"csrf_token": console.csrf}),
        "charts": console.get(f"{base}/charts?window=day"),
        "storage-roots panel": console.get(f"{base}/storage-roots"),
        "runtime panel": console.get(f"{base}/runtime"),
        "runtime-jobs panel": console.get(f"{base}/runtime-jobs"),
    }
    assert {name: response.headers.get("Location") for name, response in landed.items()} == {
        "storage-roots": f"{base}/storage",
        "acquire": f"{base}/storage",
        "benchmark": f"{base}/work",
        "generate": f"{base}/work",
        "disable": base,
        "charts": f"{base}/gpus?window=day",
        "storage-roots panel": f"{base}/storage",
        "runtime panel": f"{base}/work",
        "runtime-jobs panel": f"{base}/work",
    }
    rotated = console.post(f"{base}/credential/rotate", data={"csrf_token": console.csrf})
    assert rotated.status_code == 200 and 'aria-current="page">Credential<' in rotated.get_data(as_text=True)


def test_the_work_tab_puts_run_a_model_before_the_runtime_worker(console):
    node = online_node(console)
    html = console.get(f"/hardware/nodes/{node['id']}/work").get_data(as_text=True)
    assert html.index('id="node-runtime-jobs"') < html.index('id="node-runtime"')
    assert f'href="/jobs?node={node["id"]}"' in html


def test_the_audit_tab_pages_through_the_nodes_events_newest_first(app, console):
    node, other = online_node(console, hostname="first-node"), online_node(console, hostname="second-node")
    with app.app_context():
        for number in range(60):
            audit.record(audit.OPERATOR, "node.updated", node["id"], number=number)
        audit.record(audit.OPERATOR, "node.updated", other["id"], number=999)
        db.session.commit()
    path = f"/hardware/nodes/{node['id']}/audit"
    first = console.get(path).get_data(as_text=True)
    rows = re.findall(r'<tr data-event-id="(\d+)">', first)
    assert len(rows) == 50 and rows == sorted(rows, key=int, reverse=True)
    older = re.search(rf'href="({re.escape(path)}\?before=\d+)" data-testid="older"', first)
    assert older, "a link to the older events, on this tab"
    second = console.get(unescape(older[1])).get_data(as_text=True)
    rest = re.findall(r'<tr data-event-id="(\d+)">', second)
    assert rest and int(rest[0]) < int(rows[-1]) and not set(rest) & set(rows)
    assert "node.enrolled" in second and 'data-testid="older"' not in second  # the oldest page
    assert f'href="{path}">← Newest</a>' in second
    assert "999" not in first + second, "only this node's events"
    assert console.get(f"{path}?before=x").status_code == 400


def age_telemetry(app, node_id: str, seconds: float) -> None:
    """Make the node's telemetry sample (one per GPU) `seconds` old, as if it had sent none since."""
    from app.models import Gpu

    with app.app_context():
        gpu_ids = sa.select(Gpu.id).where(Gpu.node_id == node_id).scalar_subquery()
        db.session.execute(
            sa.update(TelemetrySample)
            .where(TelemetrySample.gpu_id.in_(gpu_ids))
            .values(sampled_at=utcnow() - timedelta(seconds=seconds))
        )
        db.session.commit()


def test_an_offline_node_shows_its_last_readings_as_last_reported_and_blames_no_driver(app, console):
    node = online_node(console)
    # The agent's own words for a healthy GPU node (agent/modelforge_node_agent.py).
    beat(console, node, health={"status": "ok", "detail": "1 GPU; all readings succeeded"}, telemetry=[])
    path = f"/hardware/nodes/{node['id']}"
    online = console.get(path).get_data(as_text=True)
    health = re.search(r'<dd data-testid="node-health">(.*?)</dd>', online, re.S)[1]
    assert 'mf-ok">ok</span>' in health and "not current" not in health
    assert 'data-testid="readings-not-current"' not in online

    silence(app, node["id"], seconds=2 * 3600)
    age_telemetry(app, node["id"], seconds=2 * 3600)
    for html in (console.get(path).get_data(as_text=True), console.get(path, headers=HTMX).get_data(as_text=True)):
        health = re.search(r'<dd data-testid="node-health">(.*?)</dd>', html, re.S)[1]
        assert "not current" in health and "last reported" in health and "offline" in health
        assert 'mf-ok">ok</span>' not in health, "an old ok is not shown as a current, green ok"
        note = re.search(r'<p [^>]*data-testid="readings-not-current">(.*?)</p>', html, re.S)[1]
        assert "Last reported" in note and "not current" in note and "offline" in note
    gpus = console.get(f"{path}/gpus").get_data(as_text=True)
    assert 'data-testid="readings-not-current"' in gpus

    readiness = console.get(f"/api/v1/admin/nodes/{node['id']}/readiness", headers=ADMIN).get_json()
    checks = {check["name"]: check for check in readiness["checks"]}
    assert checks["connection"]["status"] == "fail"
    assert checks["agent_health"]["status"] != "pass" and "Not current" in checks["agent_health"]["detail"]
    assert checks["telemetry"]["status"] == "fail"
    assert "driver" not in checks["telemetry"]["next_step"] and "connection" in checks["telemetry"]["next_step"]


def test_a_node_online_with_old_telemetry_still_points_at_the_driver(app, console):
    node = online_node(console)
    age_telemetry(app, node["id"], seconds=2 * 3600)
    readiness = console.get(f"/api/v1/admin/nodes/{node['id']}/readiness", headers=ADMIN).get_json()
    (telemetry,) = [check for check in readiness["checks"] if check["name"] == "telemetry"]
    assert telemetry["status"] == "fail" and "nvidia-smi" in telemetry["next_step"]


# --------------------------------------------------------------------------- the node list's filter


def test_a_bad_status_filter_shows_every_node_with_the_error_and_is_not_offered_back(console):
    first, second = online_node(console, hostname="first-node"), online_node(console, hostname="second-node")
    response = console.get("/hardware/nodes?status=bogus")
    assert response.status_code == 400
    html = unescape(response.get_data(as_text=True))
    assert "Unknown status 'bogus'" in html and "showing every node" in html
    assert first["id"] in html and second["id"] in html and "No node matches" not in html
    options = re.search(r'<select name="status">(.*?)</select>', html, re.S)[1]
    assert "bogus" not in options and re.findall(r"<option[^>]*>([^<]*)</option>", options) == [
        "any status", "online", "stale", "offline", "pending", "disabled",
    ]  # fmt: skip
    assert "selected" not in options  # "any status", the first, is what shows
    # With a search too, the error says what is shown: every status, still searched.
    needle = first["id"][:13]
    searched = unescape(console.get(f"/hardware/nodes?status=zzz&q={needle}").get_data(as_text=True))
    assert f"Unknown status 'zzz'; showing nodes of any status that match '{needle}'." in searched
    assert "showing every node" not in searched
    assert first["id"] in searched and second["id"] not in searched


def test_an_unknown_node_in_the_audit_filter_is_refused_not_offered_as_a_choice(console):
    online_node(console)
    for path in ("/audit?node=zzz", f"/audit?node={UNKNOWN}", "/jobs?node=zzz"):
        response = console.get(path)
        assert response.status_code == 400, path
        html = response.get_data(as_text=True)
        options = re.search(r'<select name="node">(.*?)</select>', html, re.S)[1]
        assert "zzz" not in options and UNKNOWN not in options, path
        assert 'class="mf-field-error"' in html


def test_the_search_placeholder_fits_its_box(console):
    html = console.get("/hardware/nodes").get_data(as_text=True)
    field = re.search(r'<input type="search" name="q"[^>]*>', html)[0]
    placeholder, size = re.search(r'placeholder="([^"]+)"', field)[1], int(re.search(r'size="(\d+)"', field)[1])
    assert len(placeholder) < size, (placeholder, size)
