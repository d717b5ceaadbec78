"""Acceptance evidence in real Chromium against the real gunicorn, with its scheduler (V1, L1, C1).

The node's side is sent over HTTP exactly as the agent's protocol has it (inventories with a start id
and nvidia-smi's output, heartbeats, a runtime.generate.v1 claimed and completed), and the liveness
sweep marks the silent node stale and then offline for real. In the browser: the checklist page
fills in item by item, a bad paste is refused with its text kept, an unhardened container is
contradicted, a screenshot is uploaded and shown, the server refuses production eligibility (409)
until the verdict turns to validated by itself, then accepts it; the evidence bundle is downloaded,
unzipped and its report.html opened in the browser. Each step is a screenshot under
test-artifacts/console/<test name>/.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import zipfile
from pathlib import Path

import pytest

from app.acceptance import ITEMS, MAX_SCREENSHOT_BYTES
from tests.support import ADMIN, assert_no_secrets, factories
from tests.support.acceptance import ENV_SECRET, inspect_text, png, publish, smoke_test
from tests.support.browser import Api, expect, sign_in
from tests.support.gunicorn import GunicornServer
from tests.support.nodes import beat

# L1 in seconds, not minutes: a node that stops beating is stale after 2 s and offline after 4 s.
# Stale after 5 s, not 2: the smoke test's claim comes a few requests after the node's one
# heartbeat, and on a loaded box (the whole suite, one threaded process) those took over 2 s, so the
# claim found the node stale and got nothing (CI, twice).
FAST = {
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "5",
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "8",
    "MODELFORGE_SWEEP_INTERVAL_SECONDS": "1",
    "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "1",
    # A2's per-node rate would only make this test wait between the node's reports.
    "MODELFORGE_NODE_RATE_LIMIT": "false",
}


@pytest.fixture
def acceptance_server(sqlite_template, tmp_path):
    """The control plane with fast liveness thresholds; gunicorn starts its scheduler (the sweeps)."""
    path = tmp_path / "acceptance.sqlite3"
    shutil.copyfile(sqlite_template, path)
    running = GunicornServer(f"sqlite:///{path}", tmp_path, workers=2, **FAST)
    running.start()
    yield running
    running.stop()
    print(running.log()[-20000:])  # shown only when the test fails


def audit_events(api: Api, node_id: str) -> list[dict]:
    """The node's audit trail, newest first."""
    return api.get(f"/api/v1/admin/audit-events?node_id={node_id}", headers=ADMIN).get_json()["audit_events"]


def wait_for_audit(api: Api, node_id: str, action: str, after_id: int = 0, timeout: float = 20.0) -> int:
    """Until the audit trail holds `action` for the node after event `after_id`; returns its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [
            event["id"] for event in audit_events(api, node_id) if event["action"] == action and event["id"] > after_id
        ]
        if found:
            return min(found)
        time.sleep(0.25)
    raise AssertionError(f"no {action} for {node_id} after event {after_id} within {timeout} s")


def item(page, name: str):
    """One checklist item on the acceptance page."""
    return page.locator(f"#acceptance-checklist li[data-item={name}]")


def test_the_checklist_fills_in_the_verdict_turns_and_the_bundle_opens(page, acceptance_server, tmp_path):
    api = Api(acceptance_server.url)
    enrolled = factories.enrolled_node(api, control_plane_url=acceptance_server.url)
    node = {"id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    publish(api, node, "a" * 32)  # the agent's first run: its start id and nvidia-smi's output
    beat(api, node)
    smoke_test(api, node)  # W2: a runtime.generate.v1 claimed and completed by the node
    # From here on the node is silent: the sweep marks it stale, then offline, while we work.

    sign_in(page, acceptance_server.url, f"/hardware/nodes/{node['id']}/acceptance")
    # The acceptance page is the node page's Acceptance tab.
    expect(page.locator("nav[aria-label='Node sections'] [aria-current=page]")).to_have_text("Acceptance")
    for name in ("gpu_facts", "node_api_output", "runtime_smoke_test"):
        expect(item(page, name)).to_have_attribute("data-state", "observed")
    for name in ("container_status", "restart_identity", "recovery", "screenshots"):
        expect(item(page, name)).to_have_attribute("data-state", "missing")
        expect(item(page, name).locator("[data-testid=item-state]")).to_have_text("○ missing")
    expect(item(page, "gpu_facts").locator("[data-testid=gpu-compare]")).to_contain_text("✓ yes")
    verdict = page.locator("#acceptance-checklist [data-testid=verdict]")
    expect(verdict).to_have_attribute("data-validated", "false")
    expect(verdict).to_contain_text("Missing: Node-agent container status, Restart identity")
    mark = page.locator("[data-testid=mark-eligible]")
    expect(mark).to_be_disabled()
    page.steps.shot("checklist-fresh")

    # The evidence opened by its reader stays open when the checklist refreshes itself.
    page.click("#evidence-gpu_facts summary")
    expect(page.locator("#evidence-gpu_facts pre")).to_contain_text("nvidia-smi --query-gpu")
    with page.expect_response(re.compile(r"/acceptance$")):
        page.evaluate("htmx.trigger(document.body, 'acceptance-changed')")
    expect(page.locator("#evidence-gpu_facts")).to_have_attribute("open", "")

    # The server refuses too, whatever the button says: a 409 naming what is missing.
    page.expected_errors += ["status of 409", "status of 422", "Response Status Error Code 4"]
    # In one task, so the checklist's own 10 s refresh cannot swap a disabled button back in between.
    mark.evaluate("button => { button.removeAttribute('disabled'); button.click(); }")
    notice = page.locator("#acceptance-notice [data-testid=acceptance-notice]")
    expect(notice).to_contain_text("is not validated (missing: container_status, restart_identity")
    expect(notice).to_have_attribute("role", "alert")
    page.steps.shot("eligibility-refused")

    # A paste that is not inspect output: the reason under the field, the text still there.
    command = page.locator("[data-testid=inspect-command]")
    expect(command).to_have_text(re.compile(r'^docker inspect "\$\(docker compose .* ps -q node-agent\)"$'))
    page.fill("#inspect", '[{"Id": "abc", oops')
    page.click("button:has-text('Check container status')")
    expect(page.locator("[data-testid=inspect-error]")).to_contain_text("it is not valid JSON")
    expect(page.locator("#inspect")).to_have_value('[{"Id": "abc", oops')
    expect(page.locator("#inspect")).to_have_attribute("aria-invalid", "true")
    page.steps.shot("paste-refused")

    page.fill("#inspect", inspect_text(hardened=False))
    page.click("button:has-text('Check container status')")
    expect(page.locator("[data-testid=inspect-notice]")).to_contain_text("Container status recorded: contradicted")
    expect(page.locator("#inspect")).to_have_value("")
    expect(notice).to_have_count(0)  # the refusal no longer holds once the evidence changed
    container = item(page, "container_status")
    expect(container).to_have_attribute("data-state", "contradicted")  # the checklist refetched itself
    expect(container.locator("[data-testid=item-state]")).to_have_text("✗ contradicted")
    expect(container.locator("[data-check=no_container_socket]")).to_have_attribute("data-status", "fail")
    expect(container.locator("[data-check=read_only_root]")).to_contain_text("fail")
    expect(verdict).to_contain_text("Contradicted: Node-agent container status")
    page.steps.shot("container-contradicted")

    page.fill("#inspect", inspect_text())
    page.click("button:has-text('Check container status')")
    expect(container).to_have_attribute("data-state", "observed")
    expect(container.locator("[data-status=fail]")).to_have_count(0)
    assert ENV_SECRET not in page.content()
    page.steps.shot("container-observed")

    # A screenshot: the size limit is shown; a file over it and a text file named .png are refused
    # under the field; a real PNG goes up and comes back as a thumbnail.
    expect(page.locator("#acceptance-upload-form label")).to_contain_text("PNG or JPEG, at most 5.0 MiB")
    page.expected_errors += ["status of 413"]
    refusals = [
        ("huge.png", png() + b"\0" * MAX_SCREENSHOT_BYTES, "larger than the limit of 5.0 MiB; nothing was stored"),
        ("notes.png", b"just some text, not an image\n", "not a whole PNG or JPEG image"),
    ]
    for name, data, message in refusals:
        page.set_input_files("#screenshot", files=[{"name": name, "mimeType": "image/png", "buffer": data}])
        page.click("button:has-text('Upload screenshot')")
        expect(page.locator("[data-testid=upload-error]")).to_contain_text(message)
        expect(page.locator("#screenshot")).to_have_attribute("aria-invalid", "true")
    expect(item(page, "screenshots")).to_have_attribute("data-state", "missing")
    page.steps.shot("upload-refused")
    page.set_input_files(
        "#screenshot", files=[{"name": "node-page.png", "mimeType": "image/png", "buffer": png(64, 40)}]
    )
    page.click("button:has-text('Upload screenshot')")
    expect(page.locator("[data-testid=upload-notice]")).to_contain_text("Screenshot node-page.png stored (64 × 40 px")
    thumbnail = item(page, "screenshots").locator("img")
    expect(thumbnail).to_have_attribute("alt", "Screenshot node-page.png")
    expect(item(page, "screenshots")).to_have_attribute("data-state", "observed")
    page.wait_for_function("img => img.complete && img.naturalWidth === 64", arg=thumbnail.element_handle())
    page.steps.shot("screenshot-uploaded")

    # The agent restarts with the same GPUs; then the node goes stale, offline and comes back (the
    # sweep may have sent the silent node straight to offline before: that is no recovery yet).
    # The checklist refreshes itself, item by item, to validated without a reload.
    wait_for_audit(api, node["id"], "node.offline")
    beat(api, node)
    publish(api, node, "b" * 32)
    expect(item(page, "restart_identity")).to_have_attribute("data-state", "observed", timeout=20_000)
    expect(item(page, "restart_identity")).to_contain_text("are the same before and after")
    returned = wait_for_audit(api, node["id"], "node.returned")
    stale = wait_for_audit(api, node["id"], "node.stale", after_id=returned)
    wait_for_audit(api, node["id"], "node.offline", after_id=stale)
    beat(api, node)
    expect(item(page, "recovery")).to_have_attribute("data-state", "observed", timeout=20_000)
    expect(verdict).to_have_attribute("data-validated", "true")
    expect(verdict).to_contain_text("✓ validated")
    expect(mark).to_be_enabled()
    page.steps.shot("validated")

    mark.click()
    expect(notice).to_have_text("Marked production-eligible.")
    expect(verdict.locator("[data-testid=production-eligible]")).to_have_text("yes")
    expect(page.locator("[data-testid=clear-eligible]")).to_be_visible()
    page.steps.shot("production-eligible")

    # The bundle: a zip download whose report.html shows every item when opened in the browser.
    with page.expect_download() as download_info:
        page.click("[data-testid=export-bundle]")
    download = download_info.value
    assert re.fullmatch(rf"modelforge-acceptance-{node['id']}-\d{{8}}T\d{{6}}Z\.zip", download.suggested_filename)
    bundle_path = tmp_path / "bundle.zip"
    download.save_as(bundle_path)
    unpacked = tmp_path / "bundle"
    with zipfile.ZipFile(bundle_path) as bundle:
        bundle.extractall(unpacked)
    report = json.loads((unpacked / "report.json").read_text())
    assert report["checklist"]["validated"] is True and report["checklist"]["production_eligible"] is True
    assert [entry["state"] for entry in report["checklist"]["items"]] == ["observed"] * len(ITEMS)
    assert (unpacked / report["screenshots"][0]["file"]).read_bytes() == png(64, 40)
    page.goto(Path(unpacked / "report.html").as_uri())
    for _, title in ITEMS:
        expect(page.locator("table")).to_contain_text(title)
    expect(page.locator("body")).to_contain_text("validated")
    page.wait_for_function("() => [...document.images].every(img => img.complete && img.naturalWidth === 64)")
    page.steps.shot("report-html")

    # The node page and the node list say so too.
    page.goto(f"{acceptance_server.url}/hardware/nodes/{node['id']}")
    expect(page.locator("#node-acceptance [data-testid=verdict]")).to_have_attribute("data-validated", "true")
    expect(page.locator("#node-acceptance [data-state=observed]")).to_have_count(len(ITEMS))
    # The node's last beat was its comeback above; once it is stale (5 s, the status card polls),
    # its health is last reported, not current.
    expect(page.locator("[data-testid=node-health]")).to_contain_text("not current", timeout=30_000)
    expect(page.locator("[data-testid=node-health] .mf-ok")).to_have_count(0)
    page.steps.shot("node-page")
    page.click("nav >> text=Hardware → Nodes")
    expect(page.locator(f"tr[data-node-id='{node['id']}'] td").last).to_have_text("✓ validated")
    page.steps.shot("nodes-list")
    text = bundle_path.read_bytes().decode("latin-1") + acceptance_server.log()
    assert_no_secrets(text, enrolled["credential"], enrolled["token"], ENV_SECRET)
