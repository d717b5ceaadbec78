"""The OpenAI-compatible API's refusals, in process (S4): each in OpenAI's error shape with our
`next_step`, before anything is sent to a node. What a node answers is tests/llama/test_openai_e2e.py's.
SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest

from tests.support import ADMIN
from tests.support.nodes import agent
from tests.support.runtime import acquired_artifact, serving_node

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Hello"}]
ERROR_FIELDS = {"message", "type", "code", "param", "next_step"}


@pytest.fixture
def key(client) -> str:
    minted = client.post("/api/v1/admin/api-keys", json={"name": "tests"}, headers=ADMIN)
    assert minted.status_code == 201
    return minted.get_json()["key"]


@pytest.fixture
def node(client):
    return serving_node(client)


def deploy(client, node, name: str = "tiny-chat", state: str | None = "ready") -> dict:
    artifact = acquired_artifact(client, node)
    created = client.post(
        "/api/v1/admin/deployments",
        json={"name": name, "artifact_id": artifact["id"], "model_file": "tiny.gguf"},
        headers=ADMIN,
    )
    assert created.status_code == 201, created.get_json()
    deployment = created.get_json()
    if state is not None:
        reported = agent(client, node, f"deployments/{deployment['id']}/status", state=state)
        assert reported.status_code == 200, reported.get_json()
    return deployment


def refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.get_json()
    error = response.get_json()["error"]
    assert set(error) == ERROR_FIELDS and error["code"] == code and error["next_step"], error
    return error


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Basic abc", "Bearer mfk_" + "A" * 43, "Bearer mfn_not-a-client-key"],
)
def test_without_a_valid_client_key_every_path_is_401(client, header):
    headers = {"Authorization": header} if header else {}
    for method, path in (("GET", "/v1/models"), ("POST", CHAT), ("POST", "/v1/completions")):
        response = client.open(path, method=method, json={"model": "x", "messages": MESSAGES}, headers=headers)
        error = refused(response, 401, "API_KEY_INVALID")
        assert error["type"] == "authentication_error" and response.headers["WWW-Authenticate"] == "Bearer"


def test_the_operator_key_is_not_a_client_key(client):
    refused(client.get("/v1/models", headers=bearer(ADMIN["X-ModelForge-Admin-Token"])), 401, "API_KEY_INVALID")


def test_models_lists_deployments_until_they_stop(client, key, node):
    deployment = deploy(client, node, state=None)
    listed = client.get("/v1/models", headers=bearer(key)).get_json()
    assert listed["object"] == "list" and [model["id"] for model in listed["data"]] == ["tiny-chat"]
    assert listed["data"][0]["object"] == "model" and isinstance(listed["data"][0]["created"], int)
    client.delete(f"/api/v1/admin/deployments/{deployment['id']}", headers=ADMIN)
    assert client.get("/v1/models", headers=bearer(key)).get_json()["data"] == []


def test_an_unknown_model_is_openais_model_not_found(client, key):
    error = refused(
        client.post(CHAT, json={"model": "nope", "messages": MESSAGES}, headers=bearer(key)), 404, "model_not_found"
    )
    assert error["param"] == "model" and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": MESSAGES}, "model"),
        (CHAT, {"model": "tiny-chat"}, "messages"),
        (CHAT, {"model": "tiny-chat", "messages": []}, "messages"),
        (CHAT, {"model": "tiny-chat", "messages": ["hi"]}, "messages[0]"),
        (CHAT, {"model": "tiny-chat", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            CHAT,
            {"model": "tiny-chat", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        (CHAT, {"model": "tiny-chat", "messages": MESSAGES, "n": 2}, "n"),
        (CHAT, {"model": "tiny-chat", "messages": MESSAGES, "stream": "yes"}, "stream"),
        (CHAT, {"model": "tiny-chat", "messages": MESSAGES, "stream_options": {"include_usage": 1}}, "stream_options"),
        ("/v1/completions", {"model": "tiny-chat"}, "prompt"),
        ("/v1/completions", {"model": "tiny-chat", "prompt": ["one", "two"]}, "prompt"),
        (CHAT, ["not", "an", "object"], "body"),
    ],
)
def test_a_badly_shaped_request_is_400_naming_the_field(client, key, node, path, body, param):
    deploy(client, node)
    error = refused(client.post(path, json=body, headers=bearer(key)), 400, "INVALID_PARAMETER")
    assert error["param"] == param


def test_a_body_that_is_not_json_is_400(client, key):
    response = client.post(CHAT, data=b"{nope", headers={**bearer(key), "Content-Type": "application/json"})
    assert refused(response, 400, "INVALID_PARAMETER")["param"] == "body"


def test_a_model_still_loading_is_503_with_retry_after(client, key, node):
    deploy(client, node, state="loading")
    response = client.post(CHAT, json={"model": "tiny-chat", "messages": MESSAGES}, headers=bearer(key))
    error = refused(response, 503, "DEPLOYMENT_NOT_READY")
    assert "loading" in error["message"] and response.headers["Retry-After"]


def test_a_ready_model_whose_node_has_no_relay_connection_is_503_node_unavailable(client, key, node):
    deploy(client, node)
    response = client.post(CHAT, json={"model": "tiny-chat", "messages": MESSAGES}, headers=bearer(key))
    error = refused(response, 503, "NODE_UNAVAILABLE")
    assert error["type"] == "server_error" and response.headers["Retry-After"]


def test_the_relay_refuses_a_caller_without_a_node_credential_before_any_upgrade(client):
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
               "Sec-WebSocket-Version": "13"}  # fmt: skip
    response = client.get("/api/v1/agent/relay", headers=upgrade)
    assert response.status_code == 401 and response.get_json()["error"]["code"] == "CREDENTIAL_REQUIRED"
    response = client.get("/api/v1/agent/relay", headers={**upgrade, "Authorization": "Bearer mfn_unknown"})
    assert response.status_code == 401 and response.get_json()["error"]["code"] == "CREDENTIAL_INVALID"


def test_the_playground_answers_refusals_in_openai_shape_for_the_page_to_show(app, client, node):
    from tests.support.console import signed_in

    deployment = deploy(client, node, state="loading")
    signed_in(client, f"/deployments/{deployment['id']}")
    url, token = f"/deployments/{deployment['id']}/playground", client.csrf
    empty = client.post(url, data={"csrf_token": token, "message": ""})
    assert refused(empty, 400, "INVALID_PARAMETER")["param"] == "message"
    too_hot = client.post(url, data={"csrf_token": token, "message": "hi", "temperature": "9"})
    assert refused(too_hot, 400, "INVALID_PARAMETER")["param"] == "temperature"
    loading = client.post(url, data={"csrf_token": token, "message": "hi"})
    assert "loading" in refused(loading, 503, "DEPLOYMENT_NOT_READY")["message"]
    agent(client, node, f"deployments/{deployment['id']}/status", state="ready")
    unreachable = client.post(url, data={"csrf_token": token, "message": "hi"})
    refused(unreachable, 503, "NODE_UNAVAILABLE")  # the node has no relay connection in this test
