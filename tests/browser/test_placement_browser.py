"""Placement, idle unload and artifact delete from the console in Chromium (S2, S3, J5), on a real
node: gunicorn, the agent, the runtime worker on the tiny llama.

The deploy form previews where the model goes and with how much memory; the deployment's page
follows it to ready, to unloaded once idle, and to ready again after a client's request, with no
reload; once stopped, its artifact is deleted from the node page behind a confirmation and its
files leave the disk.
"""

from __future__ import annotations

import openai

from tests.support import wait_until
from tests.support.acquire import api
from tests.support.browser import expect, sign_in
from tests.support.serving import SERVE, mint_key, runtime_node, wait_capabilities

IDLE = 15  # seconds without a request before the model is freed: long enough to see it ready again


def test_deploy_with_the_preview_watch_it_unload_and_reload_then_delete_its_artifact(
    tmp_path, socket_dir, jobs_server, hub, model_repo, page
):
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    wait_capabilities(jobs_server, node_id, {SERVE})
    sign_in(page, jobs_server.url, "/deployments")
    page.fill("#name", "napper")
    page.fill("#model_file", "tiny.gguf")
    page.fill("#idle_unload_seconds", str(IDLE))
    preview = page.locator("[data-testid=placement-choice]")
    expect(preview).to_contain_text("Fits on agent under test", timeout=10_000)
    expect(preview).to_contain_text(" free.")  # the estimate against the node's memory
    page.steps.shot("preview")

    page.click("button:has-text('Deploy')")
    state = page.locator("[data-testid=deployment-state]")
    expect(state).to_have_text("ready", timeout=60_000)
    expect(page.locator("[data-testid=deployment-estimate]")).to_contain_text("against it")  # measured vs estimate
    page.steps.shot("ready")
    expect(state).to_have_text("unloaded", timeout=(IDLE + 30) * 1000)  # idle; the page watches every 10 s
    page.steps.shot("unloaded")

    wait_until(lambda: "relay: connected" in agent.log(), "the agent's relay connection", 20)
    with openai.OpenAI(base_url=jobs_server.url + "/v1", api_key=mint_key(jobs_server), max_retries=0) as client:
        answer = client.completions.create(model="napper", prompt="Hello", max_tokens=4, temperature=0)
    assert answer.choices[0].text

    # Loaded again for the request: the node reports it within a heartbeat or two, and it stays
    # ready for IDLE seconds; the page, reloaded, says so.
    def shows_ready() -> bool:
        page.reload()
        return state.inner_text() == "ready"

    wait_until(shows_ready, "the page to show the model ready again", IDLE - 3, interval=0.5)
    page.steps.shot("ready-again")
    expect(page.locator("[data-testid=deployment-idle]")).to_contain_text(f"after {IDLE} s without a request")
    (deployment,) = api(jobs_server, "GET", "/api/v1/admin/deployments").json()["deployments"]
    events = api(jobs_server, "GET", "/api/v1/admin/audit-events").json()["audit_events"]
    trail = [event["action"] for event in events if (event["details"] or {}).get("deployment_id") == deployment["id"]]
    assert trail.count("deployment.ready") >= 2 and "deployment.unloaded" in trail, trail  # loaded again

    page.click("[data-testid=stop-form] button")  # confirmations are accepted as a user clicking OK
    expect(state).to_have_text("stopped", timeout=30_000)

    artifact_dir = tmp_path / "agent" / "artifacts" / "registry"
    assert any(artifact_dir.rglob("tiny.gguf"))
    page.goto(f"{jobs_server.url}/hardware/nodes/{node_id}/storage")  # the Storage & artifacts tab
    row = page.locator(f"tr:has(button[hx-post$='/artifacts/{artifact_id}/delete'])")
    expect(row).to_have_count(1)
    page.steps.shot("artifact")
    row.locator("button:has-text('Delete')").click()
    expect(page.locator(f"button[hx-post$='/artifacts/{artifact_id}/delete']")).to_have_count(0, timeout=30_000)
    wait_until(lambda: not any(artifact_dir.rglob("tiny.gguf")), "the artifact's files to leave the disk", 30)
    wait_until(
        lambda: api(jobs_server, "GET", f"/api/v1/admin/nodes/{node_id}/artifacts").json()["artifacts"] == [],
        "the artifact to leave the node's list once its delete job has finished",
        30,
    )
    expect(page.locator(f"tr[data-artifact-id='{artifact_id}']")).to_have_count(0, timeout=30_000)  # the page's too
    page.steps.shot("deleted")
