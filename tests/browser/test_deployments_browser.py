"""Deploying a model from the console in Chromium (S2, S6): the form, then the deployment's page,
which follows it live, with no reload, while the node takes it, loads it and reports it ready;
then stop behind a confirmation.

The node here is the API the agent calls (its reports are what the real agent sends, as
tests/llama/test_deployments_e2e.py shows with the real agent and worker).
"""

from __future__ import annotations

import shutil

import pytest

from tests.support import ADMIN, factories
from tests.support.browser import Api, expect, sign_in
from tests.support.gunicorn import GunicornServer
from tests.support.nodes import WORKING_NODE, agent, beat, publish_inventory
from tests.support.runtime import acquired_artifact, worker


@pytest.fixture
def server(sqlite_template, tmp_path):
    path = tmp_path / "deployments.sqlite3"
    shutil.copyfile(sqlite_template, path)
    running = GunicornServer(f"sqlite:///{path}", tmp_path, workers=2, MODELFORGE_NODE_RATE_LIMIT="false")
    running.start()
    yield running
    running.stop()
    print(running.log()[-20000:])  # shown only when the test fails


def test_deploy_from_the_form_and_watch_it_load_then_stop_it(server, page):
    api = Api(server.url)
    enrolled = factories.enrolled_node(api, WORKING_NODE, control_plane_url=server.url)
    node = {"id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    publish_inventory(api, node, runtime_worker=worker())  # S3: a lab node with a worker takes it
    beat(api, node)
    artifact = acquired_artifact(api, node)
    page.expected_errors += ["status of 422", "Response Status Error Code 422"]  # the refused name, below
    sign_in(page, server.url, "/deployments")
    expect(page.locator("#deployments")).to_contain_text("No deployments yet.")
    page.fill("#name", "tiny chat")  # a space: not a name clients can send
    page.fill("#model_file", "tiny.gguf")
    page.click("button:has-text('Deploy')")
    expect(page.locator("#deployments .mf-field-error")).to_contain_text("Use 1 to 64 letters")
    page.steps.shot("name-refused")

    page.fill("#name", "tiny-chat")
    page.click("button:has-text('Deploy')")
    state = page.locator("[data-testid=deployment-state]")
    expect(state).to_have_text("pending")
    expect(page.locator("[data-testid=deployment-waiting]")).to_contain_text("to take it")
    (created,) = api.get("/api/v1/admin/deployments", headers=ADMIN).get_json()["deployments"]
    assert created["name"] == "tiny-chat" and created["artifact_id"] == artifact["id"]
    assert page.url == f"{server.url}/deployments/{created['id']}"
    page.steps.shot("pending")

    # The node takes it, loads it, says it is ready: the page follows without a reload.
    assert agent(api, node, f"deployments/{created['id']}/status", state="loading").status_code == 200
    expect(state).to_have_text("loading", timeout=10_000)
    expect(page.locator("[data-testid=deployment-waiting]")).to_contain_text("is loading the model")
    measured = {"load_seconds": 1.5, "memory_bytes": 420 * 2**20, "context_length": 2048}
    reply = agent(api, node, f"deployments/{created['id']}/status", state="ready", measured=measured)
    assert reply.status_code == 200
    expect(state).to_have_text("ready", timeout=10_000)
    expect(page.locator("[data-testid=deployment-load]")).to_have_text("1.50 s")
    expect(page.locator("#deployment-live")).to_have_attribute("data-polling", "false")
    page.steps.shot("ready")

    page.click("[data-testid=stop-form] button")  # the confirmation is accepted as a user clicking OK
    expect(state).to_have_text("stopping")
    stopped = api.get(f"/api/v1/admin/deployments/{created['id']}", headers=ADMIN).get_json()
    assert stopped["state"] == "stopping"
    page.steps.shot("stopping")
    page.close()  # before the server stops: the stopping panel still polls
