"""What the agent sends matches the control plane's schemas; how it reacts to refusals (A1–A3).

HTTP is mocked with `responses` here only to capture bodies and script refusals; the real
exchange with the real server is covered by test_agent_e2e.py.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest
import responses
from jsonschema import Draft202012Validator

import modelforge_node_agent as agent
from app.api import openapi

URL = "https://cp.lan"


def make(tmp_path, token="mfe_" + "x" * 43) -> agent.Agent:
    config = agent.load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": URL,
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": token,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_STATE_DIR": str(tmp_path / "state"),
        }
    )
    agent.ensure_state_dir(config)
    result = agent.run_preflight("cpu", agent.Nvml(), {})
    return agent.Agent(config, agent.Nvml(), result, threading.Event())


def reply(**extra):
    return {
        "status": "accepted",
        "compatibility": {"answer": "COMPATIBLE", "protocol_version": 1, "supported": [1], "action": "None"},
        "heartbeat_interval_seconds": 7,
        **extra,
    }


@responses.activate
def test_request_bodies_match_the_servers_schemas(tmp_path):
    responses.post(URL + "/api/v1/agent/enroll", json=reply(node_id="n", credential="mfn_" + "c" * 43), status=201)
    responses.post(URL + "/api/v1/agent/inventory", json=reply())
    responses.post(URL + "/api/v1/agent/heartbeat", json=reply())
    running = make(tmp_path)
    assert running.run(once=True) == 0
    sent = {call.request.url.rsplit("/", 1)[1]: json.loads(call.request.body) for call in responses.calls}
    for name, schema in (
        ("enroll", "EnrollRequest"),
        ("inventory", "InventoryRequest"),
        ("heartbeat", "HeartbeatRequest"),
    ):
        root = {"$ref": f"#/components/schemas/{schema}", "components": openapi.document()["components"]}
        errors = list(
            Draft202012Validator(root, format_checker=Draft202012Validator.FORMAT_CHECKER).iter_errors(sent[name])
        )
        assert errors == [], (name, errors[0].message if errors else None)
    assert sent["enroll"]["control_plane_url"] == URL and sent["enroll"]["protocol_version"] == 1
    assert responses.calls[2].request.headers["Authorization"] == "Bearer mfn_" + "c" * 43
    assert "Authorization" not in responses.calls[0].request.headers
    assert running.interval == 7.0  # the interval named in the reply is followed


@responses.activate
def test_incompatible_reply_is_logged_once_with_its_action(tmp_path, caplog):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "node-credential").write_text("mfn_" + "c" * 43)
    compatibility = {"answer": "TOO_OLD", "protocol_version": 1, "supported": [2], "action": "Upgrade the agent."}
    body = {
        "error": {"code": "PROTOCOL_INCOMPATIBLE", "message": "m", "next_step": "n"},
        "compatibility": compatibility,
    }
    responses.post(URL + "/api/v1/agent/inventory", json=body, status=426)
    running = make(tmp_path)
    waits = []
    running.stop.wait = lambda seconds: waits.append(seconds) or len(waits) >= 3
    caplog.set_level(logging.INFO, logger="modelforge_node_agent")
    agent.log.propagate = True
    with pytest.raises(agent.Exit) as stopped:
        running.run()
    assert stopped.value.code == 0
    lines = [record.getMessage() for record in caplog.records if "426" in record.getMessage()]
    assert sum("compatibility TOO_OLD. Upgrade the agent." in line for line in lines) == 1
    assert all(16 * 0.8 <= wait <= 16 * 1.2 for wait in waits)  # checks slowly, at the cap
    assert "c" * 43 not in caplog.text


@responses.activate
def test_server_errors_back_off_and_never_log_the_body(tmp_path, caplog):
    responses.post(URL + "/api/v1/agent/enroll", body="secret echo mfe_" + "x" * 43, status=502)
    running = make(tmp_path)
    waits = []
    running.stop.wait = lambda seconds: waits.append(seconds) or len(waits) >= 4
    caplog.set_level(logging.INFO, logger="modelforge_node_agent")
    agent.log.propagate = True
    with pytest.raises(agent.Exit):
        running.run()
    assert "HTTP 502 ERROR on POST /api/v1/agent/enroll (backoff 1s…16s); next try in 1s" in caplog.text
    assert "x" * 43 not in caplog.text and "secret echo" not in caplog.text
    nominal = [1, 2, 4, 8]
    assert all(n * 0.8 <= wait <= n * 1.2 for n, wait in zip(nominal, waits, strict=True))


@responses.activate
def test_a_reply_whose_error_is_not_an_object_still_exits_4(tmp_path):
    responses.post(URL + "/api/v1/agent/enroll", json={"error": "Not Found"}, status=404)
    running = make(tmp_path)
    with pytest.raises(agent.Exit) as stopped:
        running.run(once=True)
    assert stopped.value.code == agent.EXIT_ENROLLMENT_REFUSED


@responses.activate
def test_a_refused_inventory_does_not_stop_heartbeats(tmp_path, caplog):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "node-credential").write_text("mfn_" + "c" * 43)
    refused = {"error": {"code": "VALIDATION_FAILED", "message": "m", "next_step": "n", "field": "inventory.gpus"}}
    responses.post(URL + "/api/v1/agent/inventory", json=refused, status=400)
    responses.post(URL + "/api/v1/agent/heartbeat", json=reply())
    caplog.set_level(logging.INFO, logger="modelforge_node_agent")
    agent.log.propagate = True
    assert make(tmp_path).run(once=True) == 0
    assert [call.request.url.rsplit("/", 1)[1] for call in responses.calls] == ["inventory", "heartbeat"]
    assert "HTTP 400 VALIDATION_FAILED on POST /api/v1/agent/inventory: inventory refused" in caplog.text


@responses.activate
def test_inventory_goes_out_at_start_on_change_and_hourly_only(tmp_path, monkeypatch):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "node-credential").write_text("mfn_" + "c" * 43)
    responses.post(URL + "/api/v1/agent/inventory", json=reply())
    running = make(tmp_path)
    running.start()
    facts = {"hostname": "a", "storage": {}, "gpus": []}
    monkeypatch.setattr(agent, "collect_inventory", lambda config, gpus: dict(facts))
    sent = []
    for now, change in [(0, None), (30, None), (61, None), (122, "b"), (150, None), (3800, None)]:
        if change:
            facts["hostname"] = change
        before = len(responses.calls)
        running.maybe_publish_inventory(now)
        sent.append(len(responses.calls) > before)
    # start; within the check window; unchanged; changed; within the window; an hour since the last
    assert sent == [True, False, False, True, False, True]
