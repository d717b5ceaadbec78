"""J5 at the control plane: each root's use (artifacts, partial downloads) and the node's
quarantine, as the heartbeat reports them with the roots' other figures; stored in the node's
inventory facts, refused by field when out of bounds, shown on the node page — and "unknown",
never 0, when an older agent does not report them. The heartbeat reply names the reported partial
directories whose jobs have ended, for the agent to remove."""

from __future__ import annotations

import re
from html import unescape

import pytest

from app.timeutil import isoformat, utcnow
from tests.support import ADMIN, factories
from tests.support.console import HTMX
from tests.support.jobs import add_job, add_root
from tests.support.nodes import beat, online_node, publish_inventory

ACQUIRE = "artifact.acquire.v1"
GiB = 2**30


@pytest.fixture
def node(client):
    return online_node(client, capabilities=[ACQUIRE])


def seen(root_id: str, usage: dict | None = None) -> dict:
    """One root as the agent observed it, with its use when given."""
    observed = {
        "id": root_id,
        "exists": True,
        "writable": True,
        "free_bytes": 500 * GiB,
        "total_bytes": 1000 * GiB,
        "observed_at": isoformat(utcnow()),
    }
    return observed if usage is None else {**observed, "usage": usage}


def use(**overrides) -> dict:
    return {
        "artifacts_bytes": 3 * GiB,
        "artifacts_unread_dirs": 0,
        "partials_bytes": 512 * 2**20,
        "partials_unread_dirs": 0,
        "partial_jobs": [],
        **overrides,
    }


def stored(client, node) -> dict | None:
    inventory = client.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).get_json()["inventory"]
    return inventory.get("storage_usage")


def test_each_roots_use_is_stored_and_the_reply_names_the_partials_of_ended_jobs(client, node):
    root = add_root(client, node["id"]).get_json()
    etag = beat(client, node)["storage_roots_etag"]
    cancelled = add_job(client, node["id"], root["id"])
    assert client.post(f"/api/v1/admin/jobs/{cancelled['id']}/cancel", headers=ADMIN).status_code == 200
    queued = add_job(client, node["id"], root["id"])
    unknown = "0b9cbbd8-0000-4000-8000-000000000000"
    other = online_node(client, hostname="other-node", capabilities=[ACQUIRE])
    theirs = add_job(client, other["id"], add_root(client, other["id"]).get_json()["id"])
    assert client.post(f"/api/v1/admin/jobs/{theirs['id']}/cancel", headers=ADMIN).status_code == 200

    partials = [cancelled["id"], queued["id"], unknown, theirs["id"]]
    reply = beat(
        client,
        node,
        storage_roots_etag=etag,
        storage_roots=[seen(root["id"], use(partials_unread_dirs=2, partial_jobs=partials))],
        quarantine_usage={"quarantine_bytes": 7 * 2**20, "quarantine_unread_dirs": 0},
    )
    # Only this node's own job that has ended: a queued one may resume, another node's is not its business.
    assert reply["finished_partial_jobs"] == [cancelled["id"]]
    usage = stored(client, node)
    assert usage["roots"] == {
        root["id"]: {
            "artifacts_bytes": 3 * GiB,
            "artifacts_unread_dirs": 0,
            "partials_bytes": 512 * 2**20,
            "partials_unread_dirs": 2,
        }
    }
    assert usage["quarantine"] == {"quarantine_bytes": 7 * 2**20, "quarantine_unread_dirs": 0}
    assert stored(client, other) is None
    # A new inventory replaces the node's facts but not what the heartbeat measured.
    publish_inventory(client, node)
    assert stored(client, node)["roots"][root["id"]]["artifacts_bytes"] == 3 * GiB
    # No partial reported: the reply names none.
    assert "finished_partial_jobs" not in beat(client, node, storage_roots_etag=etag, storage_roots=[seen(root["id"])])


def test_an_older_agent_that_reports_no_use_still_beats_and_nothing_is_made_up(client, node):
    root = add_root(client, node["id"]).get_json()
    etag = beat(client, node)["storage_roots_etag"]
    reply = beat(client, node, storage_roots_etag=etag, storage_roots=[seen(root["id"])])
    assert reply["status"] == "accepted" and "finished_partial_jobs" not in reply
    assert stored(client, node) is None
    observed = client.get(f"/api/v1/admin/nodes/{node['id']}/storage-roots", headers=ADMIN).get_json()
    assert observed["storage_roots"][0]["observed"]["free_bytes"] == 500 * GiB


@pytest.mark.parametrize(
    ("usage", "quarantine", "field"),
    [
        (use(artifacts_bytes=-1), None, "storage_roots[0].usage.artifacts_bytes"),
        (use(artifacts_bytes="12"), None, "storage_roots[0].usage.artifacts_bytes"),
        (use(partials_bytes=True), None, "storage_roots[0].usage.partials_bytes"),
        (use(partials_bytes=2**63), None, "storage_roots[0].usage.partials_bytes"),
        (use(artifacts_unread_dirs=-3), None, "storage_roots[0].usage.artifacts_unread_dirs"),
        (use(partial_jobs=["../etc"]), None, "storage_roots[0].usage.partial_jobs[0]"),
        (use(partial_jobs=[f"job-{n}" for n in range(65)]), None, "storage_roots[0].usage.partial_jobs"),
        ("3 GiB", None, "storage_roots[0].usage"),
        (None, {"quarantine_bytes": -5}, "quarantine_usage.quarantine_bytes"),
        (None, {"quarantine_bytes": 1.5}, "quarantine_usage.quarantine_bytes"),
    ],
)
def test_bad_use_figures_are_refused_by_field_and_nothing_is_stored(client, node, usage, quarantine, field):
    root = add_root(client, node["id"]).get_json()
    etag = beat(client, node)["storage_roots_etag"]
    body = factories.heartbeat_body(storage_roots_etag=etag, storage_roots=[seen(root["id"], usage)])
    if quarantine is not None:
        body["quarantine_usage"] = quarantine
    response = client.post("/api/v1/agent/heartbeat", json=body, headers=node["auth"])
    assert response.status_code == 400
    assert response.get_json()["error"]["field"] == field
    assert stored(client, node) is None
    observed = client.get(f"/api/v1/admin/nodes/{node['id']}/storage-roots", headers=ADMIN).get_json()
    assert observed["storage_roots"][0]["observed"] is None  # the whole beat was refused


def test_use_reported_for_another_nodes_root_is_not_stored(client, node):
    other = online_node(client, hostname="other-node", capabilities=[ACQUIRE])
    theirs = add_root(client, other["id"]).get_json()
    mine = add_root(client, node["id"]).get_json()
    etag = beat(client, node)["storage_roots_etag"]
    beat(client, node, storage_roots_etag=etag, storage_roots=[seen(theirs["id"], use()), seen(mine["id"], use())])
    assert list(stored(client, node)["roots"]) == [mine["id"]]
    assert stored(client, other) is None


# --------------------------------------------------------------------------- the node page


def roots_panel(console, node) -> str:
    response = console.get(f"/hardware/nodes/{node['id']}/storage-roots", headers=HTMX)
    assert response.status_code == 200
    return unescape(response.get_data(as_text=True))


def words(html: str) -> str:
    """What a person reads: the text without its tags, one space between words."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def row_of(html: str, root_id: str) -> str:
    return words(html.split(f'data-root-id="{root_id}"')[1].split("</tr>")[0])


def test_the_node_page_splits_each_roots_use_and_says_unknown_never_zero(console):
    node = online_node(console, capabilities=[ACQUIRE])
    root = add_root(console, node["id"]).get_json()
    etag = beat(console, node)["storage_roots_etag"]
    # An older agent: the root is observed, its use is not reported.
    beat(console, node, storage_roots_etag=etag, storage_roots=[seen(root["id"])])
    row = row_of(roots_panel(console, node), root["id"])
    assert "artifacts unknown" in row and "partials unknown" in row and "0 B" not in row
    assert "Quarantine: unknown" in words(roots_panel(console, node))

    reported = use(artifacts_bytes=3 * GiB, partials_bytes=0, partials_unread_dirs=0)
    beat(
        console,
        node,
        storage_roots_etag=etag,
        storage_roots=[seen(root["id"], reported)],
        quarantine_usage={"quarantine_bytes": 7 * 2**20, "quarantine_unread_dirs": 0},
    )
    html = roots_panel(console, node)
    row = row_of(html, root["id"])
    assert "artifacts 3.0 GiB" in row and "partials 0 B" in row  # measured as empty: truly 0
    assert "Quarantine: 7.0 MiB" in words(html)
    # A directory the agent could not read: what was counted, said to be a lower bound.
    beat(
        console,
        node,
        storage_roots_etag=etag,
        storage_roots=[seen(root["id"], use(artifacts_bytes=None, partials_bytes=2**20, partials_unread_dirs=1))],
        quarantine_usage={"quarantine_bytes": None, "quarantine_unread_dirs": 0},
    )
    html = roots_panel(console, node)
    row = row_of(html, root["id"])
    assert "artifacts unknown" in row and "partials at least 1.0 MiB (1 directory could not be read)" in row
    assert "Quarantine: unknown" in words(html)
    page = words(unescape(console.get(f"/hardware/nodes/{node['id']}/storage").get_data(as_text=True)))
    assert "partials at least 1.0 MiB" in page  # the Storage tab includes the same partial
