"""Storage roots, typed jobs under fenced leases, artifacts: the admin and agent APIs (J1–J3, L4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.jobs import queue
from app.models import AuditEvent, Job, NodeLease
from app.timeutil import isoformat, utcnow
from tests.support import ACQUIRE, ADMIN, factories
from tests.support.jobs import add_job, add_root, claim
from tests.support.nodes import agent, beat, online_node

COMMIT = "a" * 40


@pytest.fixture
def node(client):
    """An enrolled, online node whose agent advertises artifact.acquire.v1."""
    return online_node(client, capabilities=[ACQUIRE])


def actions(app, job_id):
    with app.app_context():
        events = db.session.scalars(sa.select(AuditEvent).order_by(AuditEvent.id))
        return [event.action for event in events if event.details.get("job_id") == job_id]


def test_a_storage_root_keeps_host_and_container_paths_apart(client, node):
    response = add_root(client, node["id"], container_path="/data/artifacts/model-registry/")
    assert response.status_code == 201
    root = response.get_json()
    assert root["host_path"] == "/mnt/cache/appdata/modelforge/model-registry"
    assert root["container_path"] == "/data/artifacts/model-registry"
    assert root["observed"] is None
    listed = client.get(f"/api/v1/admin/nodes/{node['id']}/storage-roots", headers=ADMIN).get_json()
    assert [item["id"] for item in listed["storage_roots"]] == [root["id"]]
    assert add_root(client, node["id"]).status_code == 409  # one name per node


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"container_path": "data/artifacts"}, "container_path"),
        ({"container_path": "/data/artifacts/../../etc"}, "container_path"),
        ({"host_path": "/mnt/user/\x00x"}, "host_path"),
        ({"min_free_bytes": -1}, "min_free_bytes"),
        ({"name": "has space"}, "name"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_storage_roots_are_refused_by_field(client, node, change, field):
    response = add_root(client, node["id"], **change)
    assert response.status_code == 400
    assert response.get_json()["error"]["field"] == field
    assert client.get(f"/api/v1/admin/nodes/{node['id']}/storage-roots", headers=ADMIN).get_json() == {
        "storage_roots": []
    }


def test_the_agent_learns_its_roots_by_etag_and_reports_what_it_sees(client, node):
    first = beat(client, node)
    assert first["storage_roots"] == [] and first["jobs_waiting"] == 0
    root = add_root(client, node["id"]).get_json()
    changed = beat(client, node, storage_roots_etag=first["storage_roots_etag"])
    assert changed["storage_roots_etag"] != first["storage_roots_etag"]
    assert changed["storage_roots"] == [
        {"id": root["id"], "name": "models", "container_path": root["container_path"], "min_free_bytes": 10 * 2**30}
    ]
    seen = {
        "id": root["id"],
        "exists": True,
        "writable": True,
        "free_bytes": 500 * 2**30,
        "total_bytes": 1000 * 2**30,
        "observed_at": isoformat(utcnow()),
    }
    same = beat(client, node, storage_roots_etag=changed["storage_roots_etag"], storage_roots=[seen])
    assert "storage_roots" not in same  # unchanged list: not sent again
    observed = client.get(f"/api/v1/admin/nodes/{node['id']}/storage-roots", headers=ADMIN).get_json()
    assert observed["storage_roots"][0]["observed"]["free_bytes"] == 500 * 2**30


def test_a_job_is_claimed_once_with_its_root_resolved_and_completes_into_an_artifact(app, client, node):
    root = add_root(client, node["id"]).get_json()
    job = add_job(client, node["id"], root["id"], revision="main")
    assert (job["state"], job["attempt"], job["max_attempts"]) == ("queued", 0, 3)
    assert beat(client, node)["jobs_waiting"] == 1

    claimed = claim(client, node)
    assert claimed.status_code == 200
    leased = claimed.get_json()["job"]
    assert (leased["id"], leased["attempt"]) == (job["id"], 1)
    assert leased["params"]["container_path"] == "/data/artifacts/model-registry"
    assert leased["params"]["min_free_bytes"] == 10 * 2**30
    assert leased["lease_seconds"] >= 3 and leased["progress_interval_seconds"] >= 1
    # A lost reply is harmless: asking again gives the same job and attempt, never a second one.
    assert claim(client, node).get_json()["job"]["attempt"] == 1
    assert beat(client, node)["jobs_waiting"] == 0

    progress = {"bytes_done": 10, "bytes_total": 100, "files_done": 1, "files_total": 3}
    renewed = agent(client, node, f"jobs/{job['id']}/progress", attempt=1, progress=progress)
    assert renewed.status_code == 200 and renewed.get_json()["cancel_requested"] is False

    final = "/data/artifacts/model-registry/models/owner/tiny/" + COMMIT
    result = {"commit": COMMIT, "container_path": final, "files": 3, "total_bytes": 100}
    done = agent(client, node, f"jobs/{job['id']}/complete", attempt=1, result=result)
    assert done.status_code == 200
    finished = client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()
    assert finished["state"] == "succeeded" and finished["finished_at"]
    assert finished["result"]["host_path"] == "/mnt/cache/appdata/modelforge/model-registry/models/owner/tiny/" + COMMIT
    artifacts = client.get(f"/api/v1/admin/nodes/{node['id']}/artifacts", headers=ADMIN).get_json()["artifacts"]
    assert [(a["repo_id"], a["commit"], a["files"], a["job_id"]) for a in artifacts] == [
        ("owner/tiny", COMMIT, 3, job["id"])
    ]
    assert finished["result"]["artifact_id"] == artifacts[0]["id"]
    assert actions(app, job["id"]) == ["job.created", "job.started", "job.succeeded"]
    assert claim(client, node).status_code == 204


def test_an_artifact_reported_outside_its_root_is_refused(client, node):
    root = add_root(client, node["id"]).get_json()
    job = add_job(client, node["id"], root["id"])
    claim(client, node)
    result = {"commit": COMMIT, "container_path": "/etc/evil", "files": 1, "total_bytes": 1}
    response = agent(client, node, f"jobs/{job['id']}/complete", attempt=1, result=result)
    assert response.status_code == 400
    assert client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()["state"] == "running"


def test_a_lapsed_lease_is_requeued_and_the_old_attempt_is_fenced_out(app, client, node):
    root = add_root(client, node["id"]).get_json()
    job = add_job(client, node["id"], root["id"])
    claim(client, node)
    with app.app_context():
        db.session.execute(sa.update(Job).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        db.session.commit()
        assert queue.sweep_expired_leases() == {"requeued": 1, "failed": 0, "cancelled": 0}
        assert queue.sweep_expired_leases() == {"requeued": 0, "failed": 0, "cancelled": 0}  # exactly once
    requeued = client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()
    assert (requeued["state"], requeued["error"]["code"]) == ("queued", "JOB_LEASE_LOST")

    progress = {"bytes_done": 99, "files_done": 0}
    late = agent(client, node, f"jobs/{job['id']}/progress", attempt=1, progress=progress)
    assert late.status_code == 409 and late.get_json()["error"]["code"] == "JOB_LEASE_LOST"
    assert client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json() == requeued

    assert claim(client, node).get_json()["job"]["attempt"] == 2
    stale = agent(
        client,
        node,
        f"jobs/{job['id']}/fail",
        attempt=1,
        error={"code": "HUB_UNAVAILABLE", "message": "x"},
        retryable=True,
    )
    assert stale.status_code == 409
    assert actions(app, job["id"]) == ["job.created", "job.started", "job.retried", "job.started"]


def test_failures_are_retried_by_class_until_the_attempts_run_out(app, client, node):
    root = add_root(client, node["id"]).get_json()
    job = add_job(client, node["id"], root["id"])
    unavailable = {"code": "HUB_UNAVAILABLE", "message": "503 from the Hub"}
    for attempt in (1, 2, 3):
        with app.app_context():  # skip the backoff wait
            db.session.execute(sa.update(Job).values(not_before=None))
            db.session.commit()
        assert claim(client, node).get_json()["job"]["attempt"] == attempt
        failed = agent(client, node, f"jobs/{job['id']}/fail", attempt=attempt, error=unavailable, retryable=True)
        assert failed.status_code == 200
    final = client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()
    assert (final["state"], final["attempt"], final["error"]["code"]) == ("failed", 3, "HUB_UNAVAILABLE")
    assert actions(app, job["id"]).count("job.retried") == 2 and actions(app, job["id"])[-1] == "job.failed"

    retried = client.post(f"/api/v1/admin/jobs/{job['id']}/retry", headers=ADMIN).get_json()
    assert (retried["state"], retried["max_attempts"]) == ("queued", 4)
    assert claim(client, node).get_json()["job"]["attempt"] == 4


def test_a_failure_that_retrying_cannot_mend_fails_at_once(client, node):
    root = add_root(client, node["id"]).get_json()
    job = add_job(client, node["id"], root["id"])
    claim(client, node)
    error = {"code": "HUB_REPO_NOT_FOUND", "message": "owner/tiny does not exist"}
    agent(client, node, f"jobs/{job['id']}/fail", attempt=1, error=error, retryable=False)
    final = client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()
    assert (final["state"], final["error"]["code"]) == ("failed", "HUB_REPO_NOT_FOUND")
    assert final["error"]["next_step"]


def test_cancel_stops_a_queued_job_at_once_and_a_running_one_at_its_next_report(app, client, node):
    root = add_root(client, node["id"]).get_json()
    queued = add_job(client, node["id"], root["id"], repo_id="owner/one")
    cancelled = client.post(f"/api/v1/admin/jobs/{queued['id']}/cancel", headers=ADMIN).get_json()
    assert cancelled["state"] == "cancelled"
    assert client.post(f"/api/v1/admin/jobs/{queued['id']}/cancel", headers=ADMIN).status_code == 409

    running = add_job(client, node["id"], root["id"], repo_id="owner/two")
    assert claim(client, node).get_json()["job"]["id"] == running["id"]
    asked = client.post(f"/api/v1/admin/jobs/{running['id']}/cancel", headers=ADMIN).get_json()
    assert (asked["state"], asked["cancel_requested"]) == ("running", True)
    progress = {"bytes_done": 1, "files_done": 0}
    reply = agent(client, node, f"jobs/{running['id']}/progress", attempt=1, progress=progress).get_json()
    assert reply["cancel_requested"] is True
    error = {"code": "JOB_CANCELLED", "message": "stopped on request"}
    agent(client, node, f"jobs/{running['id']}/fail", attempt=1, error=error, retryable=False)
    assert client.get(f"/api/v1/admin/jobs/{running['id']}", headers=ADMIN).get_json()["state"] == "cancelled"
    assert actions(app, running["id"])[-2:] == ["job.cancel_requested", "job.cancelled"]


def test_a_root_in_use_cannot_be_deleted_and_a_job_names_a_root_of_its_own_node(client, node):
    root = add_root(client, node["id"]).get_json()
    job = add_job(client, node["id"], root["id"])
    assert client.delete(f"/api/v1/admin/storage-roots/{root['id']}", headers=ADMIN).status_code == 409
    other = factories.enrolled_node(client)
    body = {"type": ACQUIRE, "node_id": other["node_id"], "params": {"repo_id": "a/b", "storage_root_id": root["id"]}}
    assert client.post("/api/v1/admin/jobs", json=body, headers=ADMIN).status_code == 409
    client.post(f"/api/v1/admin/jobs/{job['id']}/cancel", headers=ADMIN)
    assert client.delete(f"/api/v1/admin/storage-roots/{root['id']}", headers=ADMIN).status_code == 200
    assert client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).status_code == 200  # history stays


def test_no_work_for_a_node_that_is_not_online_enabled_and_compatible(app, client, node):
    root = add_root(client, node["id"]).get_json()
    add_job(client, node["id"], root["id"])
    with app.app_context():  # silent for ten minutes: offline by its heartbeat age
        db.session.execute(sa.update(NodeLease).values(last_heartbeat_at=utcnow() - timedelta(minutes=10)))
        db.session.commit()
    assert claim(client, node).status_code == 204
    beat(client, node)  # back online
    client.post(f"/api/v1/admin/nodes/{node['id']}/disable", headers=ADMIN)
    assert claim(client, node).status_code == 403
    client.post(f"/api/v1/admin/nodes/{node['id']}/enable", headers=ADMIN)
    incompatible = client.post(
        "/api/v1/agent/jobs/claim", json={**factories.versions(2), "capabilities": [ACQUIRE]}, headers=node["auth"]
    )
    assert incompatible.status_code == 426
    assert claim(client, node).status_code == 204  # the node is remembered as incompatible until it beats again
    beat(client, node)
    assert claim(client, node).status_code == 200


def test_a_node_gets_only_job_types_it_advertised(client):
    enrolled = factories.enrolled_node(client)
    auth = factories.bearer(enrolled["credential"])
    client.post("/api/v1/agent/inventory", json=factories.inventory_body(), headers=auth)  # no capabilities
    node = {"id": enrolled["node_id"], "auth": auth}
    root = add_root(client, node["id"]).get_json()
    add_job(client, node["id"], root["id"])
    assert beat(client, node)["jobs_waiting"] == 0
    assert agent(client, node, "jobs/claim", capabilities=[]).status_code == 204


def test_another_nodes_reports_do_not_touch_a_job(client, node):
    root = add_root(client, node["id"]).get_json()
    job = add_job(client, node["id"], root["id"])
    claim(client, node)
    other = factories.enrolled_node(client)
    intruder = {"id": other["node_id"], "auth": factories.bearer(other["credential"])}
    progress = {"bytes_done": 1, "files_done": 0}
    assert agent(client, intruder, f"jobs/{job['id']}/progress", attempt=1, progress=progress).status_code == 409
    assert client.get(f"/api/v1/admin/jobs/{job['id']}", headers=ADMIN).get_json()["progress"] is None


def test_jobs_list_filters_and_pages_newest_first(client, node):
    root = add_root(client, node["id"]).get_json()
    ids = [add_job(client, node["id"], root["id"], repo_id=f"owner/m{i}")["id"] for i in range(queue.PAGE_SIZE + 2)]
    first = client.get("/api/v1/admin/jobs?state=queued", headers=ADMIN).get_json()
    assert [job["id"] for job in first["jobs"]] == ids[::-1][: queue.PAGE_SIZE]
    rest = client.get(f"/api/v1/admin/jobs?before={first['next_before']}", headers=ADMIN).get_json()
    assert [job["id"] for job in rest["jobs"]] == ids[::-1][queue.PAGE_SIZE :] and rest["next_before"] is None
    assert client.get("/api/v1/admin/jobs?state=running", headers=ADMIN).get_json()["jobs"] == []
    assert client.get("/api/v1/admin/jobs?state=done", headers=ADMIN).status_code == 400


def test_the_node_shows_the_job_types_its_agent_advertised(client, node):
    described = client.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).get_json()
    assert described["capabilities"] == [ACQUIRE]
