"""A hostile node through the real server (gunicorn): it cannot grow its GPUs or break the node list."""

from __future__ import annotations

import requests

from app.api import bodies
from tests.support import ADMIN, factories
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
