"""Lab and benchmark eligibility are scheduler metadata the operator sets at will, through the API
and the node page (S3); production eligibility keeps its evidence-checked path (V1). Placement
follows the flags at once. SQLite and PostgreSQL.
"""

from __future__ import annotations

import re

import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent
from tests.support import ADMIN, factories
from tests.support.console import HTMX, htmx_post, signed_in
from tests.support.nodes import beat, publish_inventory
from tests.support.runtime import acquired_artifact, worker


def plain_node(client) -> dict:
    """A node enrolled as the wizard did before it offered lab use: no flag set, a worker answering."""
    enrolled = factories.enrolled_node(client)
    node = {**enrolled, "id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    publish_inventory(client, node, runtime_worker=worker())
    beat(client, node)
    return node


def flags(client, node) -> dict:
    return client.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).get_json()["eligibility"]


def test_a_node_made_lab_eligible_takes_the_deployment_it_was_refused(app, client):
    node = plain_node(client)
    artifact = acquired_artifact(client, node)
    body = {"name": "chat", "artifact_id": artifact["id"], "model_file": "tiny.gguf"}
    refused = client.post("/api/v1/admin/deployments", json=body, headers=ADMIN)
    assert refused.status_code == 409
    assert refused.get_json()["nodes"][0]["reason"] == "not eligible for the lab tier (lab_eligible is false)"

    path = f"/api/v1/admin/nodes/{node['id']}/eligibility"
    reply = client.post(path, json={"lab_eligible": True}, headers=ADMIN)
    assert reply.status_code == 200, reply.get_json()
    assert reply.get_json()["eligibility"] == flags(client, node)
    assert flags(client, node) == {"production_eligible": False, "lab_eligible": True, "benchmark_eligible": False}
    assert client.post("/api/v1/admin/deployments", json=body, headers=ADMIN).status_code == 201
    assert client.post(path, json={"lab_eligible": True}, headers=ADMIN).status_code == 200  # no change: not audited
    with app.app_context():
        events = list(db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == "node.eligibility")))
    assert [event.details for event in events] == [{"lab_eligible": {"old": False, "new": True}}]


def test_production_eligibility_is_not_set_here_and_bad_bodies_are_400s(client):
    node = plain_node(client)
    path = f"/api/v1/admin/nodes/{node['id']}/eligibility"
    for body, field in (
        ({"production_eligible": True}, "production_eligible"),
        ({"lab_eligible": "yes"}, "lab_eligible"),
        ({"benchmark_eligible": 1}, "benchmark_eligible"),
    ):
        refused = client.post(path, json=body, headers=ADMIN)
        assert refused.status_code == 400 and refused.get_json()["error"]["field"] == field, refused.get_json()
    assert flags(client, node)["production_eligible"] is False
    assert client.post(path, json={"lab_eligible": True}).status_code == 401
    missing = client.post(
        "/api/v1/admin/nodes/00000000-0000-4000-8000-000000000000/eligibility", json={}, headers=ADMIN
    )
    assert missing.status_code == 404


def test_the_node_page_allows_and_clears_lab_and_benchmark_use(client):
    node = plain_node(client)
    console = signed_in(client, f"/hardware/nodes/{node['id']}")
    page = console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    assert 'data-testid="toggle-lab_eligible"' in page and "Allow lab</button>" in page
    path = f"/hardware/nodes/{node['id']}/eligibility/lab_eligible/on"
    assert console.post(path, headers=HTMX).status_code == 400  # no CSRF token: nothing changes
    assert flags(client, node)["lab_eligible"] is False
    panel = htmx_post(console, path)
    assert panel.status_code == 200 and "Clear lab</button>" in panel.get_data(as_text=True)
    assert flags(client, node)["lab_eligible"] is True
    assert htmx_post(console, f"/hardware/nodes/{node['id']}/eligibility/production_eligible/on").status_code == 404
    assert htmx_post(console, f"/hardware/nodes/{node['id']}/eligibility/lab_eligible/maybe").status_code == 404
    assert htmx_post(console, f"/hardware/nodes/{node['id']}/eligibility/benchmark_eligible/on").status_code == 200
    assert flags(client, node) == {"production_eligible": False, "lab_eligible": True, "benchmark_eligible": True}


def test_the_wizard_offers_a_lab_and_benchmark_node_by_default(client):
    console = signed_in(client, "/hardware/nodes")
    form = console.get("/hardware/enroll").get_data(as_text=True)
    for flag in ("lab_eligible", "benchmark_eligible"):
        box = re.search(rf'<input[^>]*id="{flag}"[^>]*>', form).group(0)
        assert "checked" in box, box
    production = re.search(r'<input[^>]*id="production_eligible"[^>]*>', form)
    assert production is None or "checked" not in production.group(0)  # E4: never from the wizard
