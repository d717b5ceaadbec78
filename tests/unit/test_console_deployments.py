"""The deployments pages (S2, S6): the list with its deploy form, one deployment followed live
while its node loads the model, and stop behind a confirmation. SQLite and PostgreSQL."""

from __future__ import annotations

import re

import pytest

from tests.support import ADMIN
from tests.support.console import HTMX, htmx_post
from tests.support.nodes import agent
from tests.support.runtime import acquired_artifact, serving_node

PAGE = "/deployments"
MEASURED = {"load_seconds": 0.75, "memory_bytes": 300 * 2**20, "context_length": 2048}


@pytest.fixture
def node(client):
    return serving_node(client)


@pytest.fixture
def artifact(client, node):
    return acquired_artifact(client, node)


def deploy_form(console, artifact, **fields: str):
    data = {
        "name": "tiny-chat",
        "artifact_id": artifact["id"],
        "model_file": "tiny.gguf",
        "context_length": "",
        "idle_unload_seconds": "900",
        **fields,
    }
    return htmx_post(console, PAGE, data=data)


def deployments(client) -> list[dict]:
    return client.get("/api/v1/admin/deployments", headers=ADMIN).get_json()["deployments"]


def report(client, node, deployment_id: str, state: str, **body) -> None:
    answer = agent(client, node, f"deployments/{deployment_id}/status", state=state, **body)
    assert answer.status_code == 200, answer.get_json()


def test_the_page_is_in_the_navigation_and_says_to_acquire_a_model_first(console):
    html = console.get("/hardware/nodes").get_data(as_text=True)
    assert f'href="{PAGE}"' in html
    page = console.get(PAGE).get_data(as_text=True)
    assert f'href="{PAGE}" aria-current="page">Deployments<' in page
    assert "No deployments yet." in page and "Acquire a model onto a node first" in page
    assert 'data-testid="deploy-form"' not in page


def test_the_page_needs_a_session(client):
    response = client.get(PAGE)
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_deploying_from_the_form_creates_it_pending_and_its_page_follows_it_to_ready(console, node, artifact):
    page = console.get(PAGE).get_data(as_text=True)
    assert 'data-testid="deploy-form"' in page and artifact["repo_id"] in page
    response = deploy_form(console, artifact)
    assert response.status_code == 201
    (created,) = deployments(console)
    assert response.headers["HX-Redirect"] == f"{PAGE}/{created['id']}"
    assert (created["name"], created["state"], created["node_id"]) == ("tiny-chat", "pending", node["id"])

    live = console.get(f"{PAGE}/{created['id']}").get_data(as_text=True)
    assert 'data-state="pending"' in live and 'data-polling="true"' in live and 'hx-trigger="every 2s"' in live
    assert re.search(r'data-testid="deployment-waiting" role="status">Waiting for .* to take it, \d+ s so far', live)
    assert "not measured yet" in live

    report(console, node, created["id"], "loading")
    live = console.get(f"{PAGE}/{created['id']}", headers=HTMX).get_data(as_text=True)
    assert "<html" not in live and "is loading the model" in live
    report(console, node, created["id"], "ready", measured=MEASURED)
    live = console.get(f"{PAGE}/{created['id']}", headers=HTMX).get_data(as_text=True)
    assert 'data-state="ready"' in live and 'data-polling="false"' in live
    assert 'hx-trigger="every 10s"' in live  # S2: it unloads when idle (900 s), so it is still watched
    assert 'data-testid="deployment-load">0.75 s<' in live and 'data-testid="deployment-context">2048<' in live
    assert "300" in live and "MiB" in live
    # S3: the header's estimate beside what was measured, and how far apart they are.
    planned = created["placement"]["estimate"]
    estimate = re.search(r'data-testid="deployment-estimate">(.*?)</dd>', live, re.S).group(1)
    assert "from the GGUF header" in estimate and "at its peak" in estimate
    assert f"measured {(MEASURED['memory_bytes'] / planned['resident_bytes'] - 1) * 100:+.1f}% against it" in estimate
    table = console.get(PAGE).get_data(as_text=True)
    row = re.search(rf'<tr data-deployment-id="{created["id"]}" data-state="ready">.*?</tr>', table, re.S).group(0)
    assert "tiny.gguf" in row and "0.75 s" in row and "(est. " in row


def test_a_failed_deployment_shows_the_code_and_the_next_step(console, node, artifact):
    deploy_form(console, artifact)
    (created,) = deployments(console)
    report(console, node, created["id"], "failed", error={"code": "MODEL_LOAD_FAILED", "message": "not a GGUF file"})
    live = console.get(f"{PAGE}/{created['id']}").get_data(as_text=True)
    error = re.search(r'<div class="mf-error" role="alert" data-testid="deployment-error">.*?</div>', live, re.S).group(
        0
    )
    assert "MODEL_LOAD_FAILED" in error and "not a GGUF file" in error and "Pick another model_file" in error


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"name": ""}, "Name the deployment"),
        ({"name": "has space"}, "Use 1 to 64 letters"),
        ({"model_file": "../x.gguf"}, "inside the artifact"),
        ({"context_length": "9000"}, "Between 16 and 8192"),
        ({"artifact_id": "00000000-0000-0000-0000-000000000000"}, "Pick one of the artifacts listed"),
    ],
)
def test_a_refused_form_says_why_inline_and_creates_nothing(console, artifact, fields, words):
    response = deploy_form(console, artifact, **fields)
    assert response.status_code == 422
    html = response.get_data(as_text=True)
    assert "<html" not in html and words in html and 'class="mf-field-error" role="alert"' in html
    assert deployments(console) == []


def test_a_taken_name_is_refused_with_the_apis_words(console, artifact):
    assert deploy_form(console, artifact).status_code == 201
    response = deploy_form(console, artifact)
    assert response.status_code == 409
    html = response.get_data(as_text=True)
    assert 'id="deployments"' in html  # the form, with the refusal under the name, not an error page over it
    assert re.search(r'class="mf-field-error" role="alert">A deployment that is not stopped is already named', html)
    assert 'value="tiny-chat"' in html  # what the operator typed stays
    assert len(deployments(console)) == 1


def test_stop_asks_the_node_and_needs_the_csrf_token(console, node, artifact):
    deploy_form(console, artifact)
    (created,) = deployments(console)
    page = console.get(f"{PAGE}/{created['id']}").get_data(as_text=True)
    assert 'hx-confirm="Stop tiny-chat?' in page
    refused = console.post(f"{PAGE}/{created['id']}/stop", headers=HTMX)
    assert refused.status_code == 400 and "Form expired" in refused.get_data(as_text=True)
    assert deployments(console)[0]["state"] == "pending"
    stopped = htmx_post(console, f"{PAGE}/{created['id']}/stop")
    assert stopped.status_code == 200
    assert 'data-state="stopping"' in stopped.get_data(as_text=True)
    assert deployments(console)[0]["state"] == "stopping"
    assert 'data-testid="stop-form"' not in stopped.get_data(as_text=True)


def preview(console, artifact, **fields: str) -> str:
    query = {"artifact_id": artifact["id"], "model_file": "tiny.gguf", "context_length": "", **fields}
    response = console.get(f"{PAGE}/preview", query_string=query, headers=HTMX)
    assert response.status_code == 200
    return response.get_data(as_text=True)


def test_the_deploy_form_previews_where_the_model_goes_and_why_the_other_nodes_would_not(console, node, artifact):
    """S3: as the form is filled in, it says which node would take the model and with how much
    memory, and each other node's reason; nothing is stored."""
    page = console.get(PAGE).get_data(as_text=True)
    assert f'hx-get="{PAGE}/preview" hx-target="this"' in page
    included = re.search(r'hx-include="([^"]+)"', page).group(1)
    assert included == "#artifact_id, #model_file, #context_length, #node_id, #tier"  # never the CSRF token
    other = serving_node(console, hostname="other-node")
    shown = preview(console, artifact)
    chosen = re.search(r'data-testid="placement-choice">(.*?)</p>', shown, re.S).group(1)
    assert re.fullmatch(
        r"<strong>Fits on GPU Node \(gpu-node-1\)</strong>: needs [\d.]+ MiB of 64\.0 GiB free\.", chosen
    )
    assert (
        f'data-node-id="{other["id"]}">GPU Node (gpu-node-1): does not hold owner/tiny-gguf at bbbbbbbbbbbb<' in shown
    )
    refused = preview(console, artifact, tier="production")
    assert "No node can take it" in refused
    assert "not eligible for the production tier (production_eligible is false)" in refused
    assert "Fill in the artifact and the model file" in preview(console, artifact, model_file="")
    assert "Fill in the artifact" in preview(console, artifact, context_length="99999")
    assert deployments(console) == []


def test_a_node_the_form_names_that_cannot_take_it_is_refused_under_the_node_field(console, node, artifact):
    other = serving_node(console, hostname="other-node")
    response = deploy_form(console, artifact, node_id=other["id"])
    assert response.status_code == 409
    page = response.get_data(as_text=True)
    assert "does not hold owner/tiny-gguf" in page and deployments(console) == []
    assert deploy_form(console, artifact, node_id=node["id"]).status_code == 201


def test_a_deployment_on_a_draining_node_is_moved_from_its_page_behind_a_confirmation(console, node, artifact):
    deploy_form(console, artifact)
    (created,) = deployments(console)
    page_path = f"{PAGE}/{created['id']}"
    assert console.post(f"/api/v1/admin/nodes/{node['id']}/drain", headers=ADMIN).status_code == 200
    live = console.get(page_path).get_data(as_text=True)
    assert 'data-testid="move-form"' in live and 'hx-confirm="Move tiny-chat to another node?' in live
    assert "Its node is draining: move it before maintenance." in live
    refused = htmx_post(console, f"{page_path}/move")  # no other node holds the model
    assert refused.status_code == 409
    shown = re.search(r'data-testid="move-refused">(.*?)</p>', refused.get_data(as_text=True), re.S).group(1)
    assert shown.startswith("No node can serve owner/tiny-gguf (tiny.gguf) in the lab tier")
    other = serving_node(console, hostname="other-node")
    copy = acquired_artifact(console, other)
    assert console.post(f"{page_path}/move", headers=HTMX).status_code == 400  # no CSRF token: nothing moves
    assert deployments(console)[0]["node_id"] == node["id"]
    moved = htmx_post(console, f"{page_path}/move")
    assert moved.status_code == 200 and 'data-state="pending"' in moved.get_data(as_text=True)
    (after,) = deployments(console)
    assert (after["node_id"], after["artifact_id"]) == (other["id"], copy["id"])
