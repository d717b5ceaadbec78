"""J1: storage roots are checked before a job fails on them (issue 25, item 4).

A root's container path must lie below the artifact directory the node's agent reported; a root
the agent reports it cannot use (missing, not writable, refused with a reason) takes no acquire
job, through the API or the console's form."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.jobs import storage
from app.models import AuditEvent, Job
from app.timeutil import isoformat, utcnow
from tests.support import ACQUIRE, ADMIN, factories
from tests.support.console import signed_in
from tests.support.jobs import add_root
from tests.support.nodes import beat, online_node

ARTIFACT_DIR = "/data/artifacts"


def artifact_dir_facts(path: str = ARTIFACT_DIR) -> dict[str, object]:
    """The inventory's `storage` facts as the agent sends them (N4), with its artifact directory."""
    return {"artifacts": {"path": path, "total_bytes": 2**40, "free_bytes": 2**39}}


@pytest.fixture
def node(client):
    """An online node whose agent advertises acquire jobs and reported /data/artifacts as its artifact directory."""
    made = online_node(client, inventory=False)
    body = {**factories.inventory_body(storage=artifact_dir_facts()), "capabilities": [ACQUIRE]}
    assert client.post("/api/v1/agent/inventory", json=body, headers=made["auth"]).status_code == 200
    return made


def listed(client, node_id):
    return client.get(f"/api/v1/admin/nodes/{node_id}/storage-roots", headers=ADMIN).get_json()["storage_roots"]


def audited(app, action):
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(AuditEvent).where(AuditEvent.action == action))


# --------------------------------------------------------------------------- the container path


@pytest.mark.parametrize(
    "container_path",
    ["/etc/models", "/data/artifacts-elsewhere/models", "/data", "/srv/data/artifacts/models"],
)
def test_a_root_outside_the_reported_artifact_directory_is_refused_and_nothing_is_stored(
    app, client, node, container_path
):
    response = add_root(client, node["id"], container_path=container_path)
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert (error["code"], error["field"]) == ("STORAGE_ROOT_OUTSIDE_ARTIFACT_DIR", "container_path")
    assert container_path in error["message"] and ARTIFACT_DIR in error["message"]
    assert f"{ARTIFACT_DIR}/" in error["next_step"]  # a path that would do, not just "fix it"
    assert listed(client, node["id"]) == [] and audited(app, "storage_root.created") == 0


@pytest.mark.parametrize("container_path", ["/data/artifacts", "/data/artifacts/model-registry", "/data/artifacts/a/b"])
def test_a_root_at_or_below_the_artifact_directory_is_registered_and_says_what_it_was_checked_against(
    client, node, container_path
):
    response = add_root(client, node["id"], container_path=container_path)
    assert response.status_code == 201, response.get_json()
    assert response.get_json()["checked_against"] == ARTIFACT_DIR
    assert [root["container_path"] for root in listed(client, node["id"])] == [container_path]


def test_a_root_on_a_node_that_has_not_reported_its_artifact_directory_is_registered_unchecked(client):
    """Accepted, and said so: the agent checks the path itself when it is told of the root, and
    the row shows its refusal (below)."""
    unreported = online_node(client)  # an inventory without `storage` facts
    response = add_root(client, unreported["id"], container_path="/anywhere/models")
    assert response.status_code == 201, response.get_json()
    assert response.get_json()["checked_against"] is None


@pytest.mark.parametrize(
    ("artifact_dir", "container_path", "problem"),
    [
        ("/data/artifacts", "/data/artifacts/models", None),
        ("/data/artifacts/", "/data/artifacts/models", None),  # as a path the agent may have reported
        ("/data/artifacts", "/data/artifactsX", "outside"),
        ("/data/artifacts", "/data/artifacts/../x", "without"),
        ("/data/artifacts", "data/artifacts/x", "absolute"),
        ("/", "/anything", None),
    ],
)
def test_the_container_path_rule(artifact_dir, container_path, problem):
    found = storage.container_path_problem(container_path, artifact_dir)
    assert (found is None) if problem is None else (problem in found)


# --------------------------------------------------------------------------- roots the agent cannot use


def observed(root_id: str, **facts: object) -> dict[str, object]:
    """A heartbeat's observation of one root: a usable one unless `facts` say otherwise."""
    return {
        "id": root_id,
        "exists": True,
        "writable": True,
        "free_bytes": 500 * 2**30,
        "total_bytes": 1000 * 2**30,
        "observed_at": isoformat(utcnow()),
        **facts,
    }


def report(client, node, *observations):
    etag = beat(client, node)["storage_roots_etag"]
    beat(client, node, storage_roots_etag=etag, storage_roots=list(observations))


def acquire(client, node_id, root_id):
    body = {"type": ACQUIRE, "node_id": node_id, "params": {"repo_id": "owner/tiny", "storage_root_id": root_id}}
    return client.post("/api/v1/admin/jobs", json=body, headers=ADMIN)


def job_count(app):
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(Job))


UNUSABLE = [
    (
        {"exists": False, "writable": False, "free_bytes": None, "total_bytes": None,
         "problem": "parent not writable: cannot create models in /data/artifacts/locked"},
        "parent not writable",
    ),
    (
        {"exists": False, "writable": False, "free_bytes": None, "total_bytes": None,
         "problem": "is a symlink: /data/artifacts/linked is never followed"},
        "is a symlink",
    ),
    ({"exists": False, "writable": False, "free_bytes": None, "total_bytes": None}, "missing"),  # an older agent
    ({"writable": False}, "not writable"),
]  # fmt: skip


@pytest.mark.parametrize(("facts", "reason"), UNUSABLE)
def test_acquire_onto_a_root_the_agent_reports_unusable_is_refused_409(app, client, node, facts, reason):
    root = add_root(client, node["id"]).get_json()
    report(client, node, observed(root["id"], **facts))
    assert listed(client, node["id"])[0]["observed"]["problem"] == facts.get("problem")
    response = acquire(client, node["id"], root["id"])
    assert response.status_code == 409, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "STORAGE_ROOT_UNAVAILABLE" and reason in error["message"]
    assert "models" in error["message"] and error["next_step"]
    assert job_count(app) == 0


def test_the_acquire_form_with_every_root_usable_offers_them_all_without_a_note(client, node):
    add_root(client, node["id"])
    signed_in(client)
    form = client.get(f"/hardware/nodes/{node['id']}/acquire", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "disabled" not in form and "not offered" not in form and "aria-describedby" not in form


def test_acquire_onto_a_root_not_yet_observed_or_usable_is_queued(client, node):
    """A root the agent has not reported on yet is not refused: the agent checks it when it claims."""
    unseen = add_root(client, node["id"], name="unseen").get_json()
    assert acquire(client, node["id"], unseen["id"]).status_code == 201
    usable = add_root(client, node["id"], name="usable", container_path="/data/artifacts/usable").get_json()
    report(client, node, observed(usable["id"]))
    assert acquire(client, node["id"], usable["id"]).status_code == 201


def test_a_root_that_becomes_usable_takes_jobs_again(client, node):
    root = add_root(client, node["id"]).get_json()
    report(client, node, observed(root["id"], exists=False, writable=False, problem="the parent directory is missing"))
    assert acquire(client, node["id"], root["id"]).status_code == 409
    report(client, node, observed(root["id"]))  # the operator fixed it; the agent saw it at its next beat
    assert listed(client, node["id"])[0]["observed"]["problem"] is None
    assert acquire(client, node["id"], root["id"]).status_code == 201


# --------------------------------------------------------------------------- the console


def test_the_console_form_refuses_a_path_outside_the_artifact_directory_inline_with_a_next_step(app, client, node):
    csrf = signed_in(client).csrf
    form = {
        "csrf_token": csrf,
        "name": "models",
        "host_path": "/mnt/models",
        "container_path": "/srv/models",
        "min_free": "10",
        "min_free_unit": "GiB",
    }
    response = client.post(f"/hardware/nodes/{node['id']}/storage-roots", data=form, headers={"HX-Request": "true"})
    assert response.status_code == 422
    page = response.get_data(as_text=True)
    assert "/srv/models is outside the node&#39;s artifact directory /data/artifacts" in page
    assert "/data/artifacts/models" in page  # the next step names a path that would do
    assert listed(client, node["id"]) == []


def test_the_console_says_when_a_root_could_not_be_checked(client):
    unreported = online_node(client)
    csrf = signed_in(client).csrf
    form = {"csrf_token": csrf, "name": "models", "host_path": "/mnt/models", "container_path": "/srv/models"}
    form |= {"min_free": "0", "min_free_unit": "GiB"}
    response = client.post(
        f"/hardware/nodes/{unreported['id']}/storage-roots", data=form, headers={"HX-Request": "true"}
    )
    assert response.status_code == 201
    assert "has not reported its artifact directory yet" in response.get_data(as_text=True)


def test_the_roots_table_shows_the_agents_refusal_and_the_acquire_form_does_not_offer_the_root(app, client, node):
    refused = add_root(client, node["id"], name="locked", container_path="/data/artifacts/locked/models").get_json()
    usable = add_root(client, node["id"], name="usable", container_path="/data/artifacts/usable").get_json()
    problem = "parent not writable: cannot create models in /data/artifacts/locked"
    report(
        client,
        node,
        observed(refused["id"], exists=False, writable=False, free_bytes=None, total_bytes=None, problem=problem),
        observed(usable["id"]),
    )
    csrf = signed_in(client).csrf
    roots = client.get(f"/hardware/nodes/{node['id']}/storage-roots", headers={"HX-Request": "true"})
    assert problem in roots.get_data(as_text=True)

    form = client.get(f"/hardware/nodes/{node['id']}/acquire", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert f'<option disabled value="{refused["id"]}">' in form and "not usable: parent not writable" in form
    assert f'<option selected value="{usable["id"]}">' in form  # the usable one is the default
    assert 'aria-describedby="acquire-root-hint"' in form and "1 root not offered" in form

    chosen = {"csrf_token": csrf, "repo_id": "owner/tiny", "revision": "main", "repo_type": "model"}
    response = client.post(
        f"/hardware/nodes/{node['id']}/acquire",
        data={**chosen, "storage_root_id": refused["id"]},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 422
    assert "parent not writable" in response.get_data(as_text=True) and job_count(app) == 0
