"""A node's telemetry published in process, and GET /metrics scraped and parsed."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.support import ADMIN, factories


def scrape(client, headers=None) -> list:
    """Every sample of GET /metrics, through prometheus_client's text parser."""
    response = client.get("/metrics", headers=ADMIN if headers is None else headers)
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    assert response.content_type.startswith("text/plain; version=0.0.4")
    return [
        sample
        for family in text_string_to_metric_families(response.get_data(as_text=True))
        for sample in family.samples
    ]


def publish(client, node, gpus, telemetry):
    auth = factories.bearer(node["credential"])
    inventory = client.post("/api/v1/agent/inventory", json=factories.inventory_body(gpus), headers=auth)
    assert inventory.status_code == 200, inventory.get_json()
    heartbeat = client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(telemetry), headers=auth)
    assert heartbeat.status_code == 200, heartbeat.get_json()
