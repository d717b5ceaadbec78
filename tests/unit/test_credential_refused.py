"""After a restore, an agent whose credential the restored database never saw (re-enrolled or
rotated after the backup) gets 401 and exits 5: the console shows which node that is and what to do
(issue 22, item 14). The secret itself is never kept or logged."""

from __future__ import annotations

import logging
from datetime import timedelta

import sqlalchemy as sa

from app import tokens
from app.api import auth
from app.extensions import db
from app.models import Node
from tests.support import factories
from tests.support.console import HTMX, htmx_post, signed_in
from tests.support.nodes import online_node, publish_inventory

BANNER = 'data-testid="credential-refused-banner"'
LIST_BADGE = 'data-testid="credential-refused"'


def refused_at(app, node_id: str):
    with app.app_context():
        return db.session.get(Node, node_id).credential_refused_at


def test_an_unknown_credential_with_a_nodes_gpus_is_shown_on_that_node(app, client, caplog):
    node = online_node(client)
    other = online_node(client, inventory=False)
    publish_inventory(
        client, other, inventory=factories.inventory_body([factories.gpu("GPU-another-node")])["inventory"]
    )
    console = signed_in(app.test_client())
    assert BANNER not in console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)

    # What the restored database never saw: the credential a rotation after the backup issued.
    presented = tokens.issue(tokens.NODE_CREDENTIAL_PREFIX).secret
    with caplog.at_level(logging.INFO):
        refused = client.post(
            "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=factories.bearer(presented)
        )
    assert refused.status_code == 401
    assert refused.get_json()["error"]["code"] == "CREDENTIAL_INVALID"
    first = refused_at(app, node["id"])
    assert first is not None
    assert refused_at(app, other["id"]) is None  # only the node whose GPU the request named

    page = console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    assert BANNER in page
    assert "presented a credential that no longer matches" in page
    assert "Rotate credential" in page and "re-enrol" in page
    # The live panel the page polls carries it too, and the list marks the node.
    assert BANNER in console.get(f"/hardware/nodes/{node['id']}", headers=HTMX).get_data(as_text=True)
    listing = console.get("/hardware/nodes").get_data(as_text=True)
    assert listing.count(LIST_BADGE) == 1 and f'data-node-id="{node["id"]}"' in listing
    assert BANNER not in console.get(f"/hardware/nodes/{other['id']}").get_data(as_text=True)

    # Never the secret: not in the log, not in any row.
    assert presented not in caplog.text
    with app.app_context():
        for table in db.metadata.sorted_tables:
            for row in db.session.execute(sa.select(table)):
                assert presented not in repr(tuple(row)), table.name
                assert tokens.digest(presented) not in repr(tuple(row)), table.name


def test_refusals_write_at_most_once_a_minute_per_node(app, client):
    node = online_node(client)
    presented = factories.bearer(tokens.issue(tokens.NODE_CREDENTIAL_PREFIX).secret)
    inventory = client.post("/api/v1/agent/inventory", json=factories.inventory_body(), headers=presented)
    assert inventory.status_code == 401  # an inventory's GPUs name the node as well
    first = refused_at(app, node["id"])
    assert first is not None
    for _ in range(5):
        assert (
            client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=presented).status_code
            == 401
        )
    assert refused_at(app, node["id"]) == first  # read, found recent, not written again
    with app.app_context():
        written = auth.note_refused_credential({factories.gpu()["uuid"]})
        assert written == []
        db.session.execute(
            sa.update(Node).where(Node.id == node["id"]).values(credential_refused_at=first - timedelta(minutes=2))
        )
        db.session.commit()
        assert auth.note_refused_credential({factories.gpu()["uuid"]}) == [node["id"]]


def test_the_hint_goes_once_the_agent_is_back_or_the_operator_rotates(app, client):
    node = online_node(client)
    unknown = factories.bearer(tokens.issue(tokens.NODE_CREDENTIAL_PREFIX).secret)

    def refuse_once_more():
        with app.app_context():  # past the once-a-minute bound
            db.session.execute(sa.update(Node).values(credential_refused_at=None))
            db.session.commit()
        body = factories.heartbeat_body()
        assert client.post("/api/v1/agent/heartbeat", json=body, headers=unknown).status_code == 401

    console = signed_in(app.test_client())
    refuse_once_more()
    assert BANNER in console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    # The agent beats again with a credential that matches (its old file put back): gone.
    assert (
        client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=node["auth"]).status_code == 200
    )
    assert BANNER not in console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)

    refuse_once_more()
    assert BANNER in console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    # The step the hint names: Rotate credential (the console's form): gone, in the list too.
    rotated = htmx_post(console, f"/hardware/nodes/{node['id']}/credential/rotate")
    assert rotated.status_code == 200
    assert BANNER not in console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    assert LIST_BADGE not in console.get("/hardware/nodes").get_data(as_text=True)


def test_a_refusal_naming_no_known_gpu_writes_nothing(app, client):
    node = online_node(client)
    unknown = factories.bearer(tokens.issue(tokens.NODE_CREDENTIAL_PREFIX).secret)
    body = factories.heartbeat_body(telemetry=[factories.sample("GPU-not-in-any-inventory")])
    assert client.post("/api/v1/agent/heartbeat", json=body, headers=unknown).status_code == 401
    assert (
        client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(telemetry=[]), headers=unknown).status_code
        == 401
    )
    assert refused_at(app, node["id"]) is None
