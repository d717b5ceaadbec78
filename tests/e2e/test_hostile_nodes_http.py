"""A hostile or misconfigured node through the real server (gunicorn): it cannot grow its GPUs or break the node
list, and a clock far ahead costs it its readings, never its liveness (issue 22)."""

from __future__ import annotations

import glob

import pytest
import requests

from app.api import bodies
from tests.support import ADMIN, factories
from tests.support.agent import FAKE_RTX_4080, fake_nvml_scenario, nvidia_agent
from tests.support.bodies import RAW_INVENTORIES, new_uuid, strict_json


def test_a_hostile_node_over_http_cannot_grow_its_gpus_or_break_the_node_list(server):
    minted = requests.post(
        server.url + "/api/v1/admin/node-enrollments", json=factories.enrollment_body(), headers=ADMIN, timeout=10
    ).json()
    body = factories.enroll_body(minted["token"], origin=server.url + "/")
    credential = requests.post(server.url + "/api/v1/agent/enroll", json=body, timeout=10).json()["credential"]
    auth = factories.bearer(credential)
    url = server.url + "/api/v1/agent/"
    assert requests.post(url + "inventory", json=factories.inventory_body(), headers=auth, timeout=10).ok
    for batch in range(10):  # 640 new UUIDs (a rate limit may refuse some beats: either way no row)
        samples = [factories.sample(new_uuid(batch, i)) for i in range(bodies.MAX_GPUS)]
        beat = requests.post(url + "heartbeat", json=factories.heartbeat_body(samples), headers=auth, timeout=10)
        assert beat.status_code in (200, 429), beat.text
    headers = {"Content-Type": "application/json", **auth}
    for fact, field in [(param.values[0], param.values[1]) for param in RAW_INVENTORIES]:
        raw = b'{"protocol_version": 1, "agent_version": "1.0", "inventory": {"gpus": [], ' + fact + b"}}"
        refused = requests.post(url + "inventory", data=raw, headers=headers, timeout=10)
        assert refused.status_code in (400, 429), refused.text
        if refused.status_code == 400:
            assert refused.json()["error"]["field"] == field
    deep = b'{"protocol_version": 1, "agent_version": "1.0", "inventory": {"gpus": [], "x": ' + b"[" * 960
    refused = requests.post(url + "inventory", data=deep + b"]" * 960 + b"}}", headers=headers, timeout=10)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "JSON_TOO_DEEP"
    listed = requests.get(server.url + "/api/v1/hardware/nodes", headers=ADMIN, timeout=10)
    assert listed.status_code == 200
    (described,) = strict_json(listed.text)["nodes"]
    assert [gpu["uuid"] for gpu in described["gpus"]] == [factories.gpu()["uuid"]]
    assert described["inventory"]["memory_total_bytes"] == 64 * 2**30


def _libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("libfaketime is not installed (Debian package faketime; .ci/run installs it)")
    return found[0]


def test_an_agent_whose_clock_runs_15_minutes_ahead_comes_online_and_is_told_to_check_it(server, tmp_path):
    """Issue 22 item 13, the real agent under libfaketime: its samples are dropped, its liveness kept,
    and the control plane's words reach its log and the node's page."""
    running, _ = nvidia_agent(tmp_path, server, fake_nvml_scenario(FAKE_RTX_4080))
    running.env.update(LD_PRELOAD=_libfaketime(), FAKETIME="+15m", FAKETIME_DONT_FAKE_MONOTONIC="1")
    assert running.run("--once", timeout=60) == 0, running.log()
    assert (
        "the control plane says about this node's clock: dropped 1 reading(s) dated up to 15 min ahead" in running.log()
    )
    assert "Check the node's clock" in running.log()
    described = requests.get(f"{server.url}/api/v1/hardware/nodes/{running.node_id()}", headers=ADMIN, timeout=10)
    assert described.json()["status"] == "online"
    assert described.json()["telemetry"] == []  # nothing stored with a time the control plane cannot believe
    assert "check the node's clock" in described.json()["health"]["detail"]
