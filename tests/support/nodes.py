"""A node as its agent would make it, through the Flask test client: enrolled, an inventory
published, one heartbeat with telemetry; and the agent API calls the tests make for it."""

from __future__ import annotations

from tests.support import factories
from tests.support.agent import WORKING_NODE


def publish_inventory(client, node: dict, **facts: object):
    """POST an inventory: factories.inventory_body() with `facts` as top-level body fields
    (capabilities, runtime_worker, ...)."""
    response = client.post(
        "/api/v1/agent/inventory", json={**factories.inventory_body(), **facts}, headers=node["auth"]
    )
    assert response.status_code == 200, response.get_json()
    return response


def agent(client, node: dict, path: str, **body):
    """POST /api/v1/agent/<path> as the node, with the agent's version fields."""
    return client.post(f"/api/v1/agent/{path}", json={**factories.versions(), **body}, headers=node["auth"])


def beat(client, node: dict, **extra) -> dict:
    """One heartbeat (factories.heartbeat_body(**extra)); returns the reply."""
    response = client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(**extra), headers=node["auth"])
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def online_node(client, hostname: str | None = None, inventory: bool = True, **facts: object) -> dict:
    """An enrolled node (lab- and benchmark-eligible) that published an inventory (unless `inventory`
    is False; `facts` as in publish_inventory) and one heartbeat. Returns the enrol reply plus "id"
    and "auth"."""
    enrolled = factories.enrolled_node(client, WORKING_NODE, **({} if hostname is None else {"hostname": hostname}))
    node = {**enrolled, "id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    if inventory:
        publish_inventory(client, node, **facts)
    beat(client, node)
    return node


def silence(app, node_id: str, seconds: float = 3600) -> None:
    """Make the node's last heartbeat `seconds` old, straight in the database (an agent gone quiet)."""
    from datetime import timedelta

    import sqlalchemy as sa

    from app.extensions import db
    from app.models import NodeLease
    from app.timeutil import utcnow

    with app.app_context():
        db.session.execute(
            sa.update(NodeLease)
            .where(NodeLease.node_id == node_id)
            .values(last_heartbeat_at=utcnow() - timedelta(seconds=seconds))
        )
        db.session.commit()
