"""Deployments through the admin and agent APIs (S2): created pending on the node that holds the
artifact, handed to that node in its heartbeat reply only when its etag is out of date, driven to
ready by the node's reports, stopped by the operator and confirmed by the node. SQLite and PostgreSQL.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent
from tests.support import ADMIN
from tests.support.nodes import agent, beat
from tests.support.runtime import ARTIFACT_PATH, acquired_artifact, serving_node, tiny_facts

DEPLOYMENTS = "/api/v1/admin/deployments"
FIELDS = {
    "id",
    "name",
    "state",
    "node_id",
    "artifact_id",
    "model_file",
    "tier",
    "context_length",
    "n_gpu_layers",
    "idle_unload_seconds",
    "placement",
    "error",
    "created_at",
    "ready_at",
    "last_request_at",
    "measured",
}
MEASURED = {"load_seconds": 1.25, "memory_bytes": 512 * 2**20, "context_length": 2048}


@pytest.fixture
def node(client):
    return serving_node(client)


@pytest.fixture
def artifact(client, node):
    return acquired_artifact(client, node)


def deploy(client, artifact, **body):
    return client.post(
        DEPLOYMENTS,
        json={"name": "qwen-chat", "artifact_id": artifact["id"], "model_file": "tiny.gguf", **body},
        headers=ADMIN,
    )


def deployed(client, artifact, **body) -> dict:
    response = deploy(client, artifact, **body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def shown(client, deployment_id: str) -> dict:
    response = client.get(f"{DEPLOYMENTS}/{deployment_id}", headers=ADMIN)
    assert response.status_code == 200
    return response.get_json()


def status(client, node, deployment_id: str, state: str, **body):
    return agent(client, node, f"deployments/{deployment_id}/status", state=state, **body)


def reported(client, node, deployment_id: str, state: str, **body) -> str:
    response = status(client, node, deployment_id, state, **body)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["id"] == deployment_id
    return response.get_json()["state"]


def actions(app, deployment_id: str) -> list[str]:
    """The deployment's audit trail, oldest first."""
    with app.app_context():
        found = db.session.scalars(sa.select(AuditEvent).order_by(AuditEvent.id))
        return [event.action for event in found if (event.details or {}).get("deployment_id") == deployment_id]


def snapshot(app) -> tuple[list, list]:
    """Every deployment row and audit event, to show a refusal changed nothing."""
    with app.app_context():
        rows = [tuple(row) for row in db.session.execute(sa.text("SELECT * FROM deployments ORDER BY id"))]
        events = [event.to_dict() for event in db.session.scalars(sa.select(AuditEvent).order_by(AuditEvent.id))]
    return rows, events


def test_create_answers_pending_on_the_node_that_holds_the_artifact_with_why(app, client, node, artifact):
    created = deployed(client, artifact)
    assert set(created) == FIELDS
    assert created["state"] == "pending"
    assert created["node_id"] == node["id"]
    placement = created["placement"]
    assert placement["node_id"] == node["id"]
    assert placement["why"].startswith("placed; fits: needs 56.9 MiB of 64.0 GiB free")
    estimate = placement["estimate"]  # S3: from tiny.gguf's header, at its own context (2,048)
    assert estimate["context_length"] == 2048 and estimate["on_gpu"] is False
    assert estimate["parts"]["weights"] == tiny_facts()["weights_bytes"]
    assert estimate["resident_bytes"] < estimate["peak_bytes"] < 128 * 2**20
    assert placement["free_bytes"] == 64 * 2**30  # nothing else deployed on it
    assert (created["tier"], created["idle_unload_seconds"]) == ("lab", 900)
    assert created["context_length"] is None and created["n_gpu_layers"] is None
    assert created["error"] is None and created["measured"] is None and created["ready_at"] is None
    assert shown(client, created["id"]) == created
    assert client.get(DEPLOYMENTS, headers=ADMIN).get_json() == {"deployments": [created]}
    assert actions(app, created["id"]) == ["deployment.created"]


def test_a_node_named_by_the_operator_is_placed_there_when_it_holds_the_artifact(client, node, artifact):
    created = deployed(client, artifact, node_id=node["id"], context_length=4096, n_gpu_layers=0)
    assert created["placement"]["why"].startswith("named by the operator; fits: needs")
    assert created["placement"]["estimate"]["context_length"] == 4096
    assert (created["tier"], created["context_length"], created["n_gpu_layers"]) == ("lab", 4096, 0)


def test_the_production_tier_needs_a_production_eligible_node_named_or_not(app, client, node, artifact):
    before = snapshot(app)
    for named in ({}, {"node_id": node["id"]}):
        refused = deploy(client, artifact, tier="production", **named)
        assert refused.status_code == 409
        error = refused.get_json()["error"]
        assert error["code"] == "NO_NODE_FITS"
        (verdict,) = refused.get_json()["nodes"]
        assert verdict["node_id"] == node["id"] and verdict["fits"] is False
        assert verdict["reason"] == "not eligible for the production tier (production_eligible is false)"
    assert snapshot(app) == before


def test_a_named_node_that_does_not_hold_the_artifact_is_refused_naming_it(app, client, artifact):
    other = serving_node(client, hostname="other-node")
    before = snapshot(app)
    refused = deploy(client, artifact, node_id=other["id"])
    assert refused.status_code == 409
    error = refused.get_json()["error"]
    assert error["code"] == "NO_NODE_FITS"
    assert other["id"] in error["message"] and "does not hold" in error["message"] and error["next_step"]
    assert snapshot(app) == before


def test_an_unknown_artifact_is_not_found(app, client, artifact):
    before = snapshot(app)
    refused = deploy(client, {"id": str(uuid.uuid4())})
    assert refused.status_code == 404
    assert refused.get_json()["error"]["code"] == "ARTIFACT_NOT_FOUND"
    assert snapshot(app) == before


def test_a_name_is_taken_until_its_deployment_is_stopped(client, node, artifact):
    first = deployed(client, artifact)
    taken = deploy(client, artifact)
    assert taken.status_code == 409
    assert taken.get_json()["error"]["code"] == "DEPLOYMENT_NAME_TAKEN"
    assert client.delete(f"{DEPLOYMENTS}/{first['id']}", headers=ADMIN).status_code == 202
    assert deploy(client, artifact).status_code == 409  # stopping still holds it
    assert reported(client, node, first["id"], "stopped") == "stopped"
    second = deployed(client, artifact)
    assert second["id"] != first["id"]
    listed = client.get(DEPLOYMENTS, headers=ADMIN).get_json()["deployments"]
    assert [item["id"] for item in listed] == [second["id"], first["id"]]  # newest first


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "-starts-with-a-dash"}, "name"),
        ({"name": "has space"}, "name"),
        ({"name": "x" * 65}, "name"),
        ({"name": 7}, "name"),
        ({"artifact_id": "not-a-uuid"}, "artifact_id"),
        ({"model_file": "../escape.gguf"}, "model_file"),
        ({"model_file": "/abs.gguf"}, "model_file"),
        ({"node_id": "nope"}, "node_id"),
        ({"tier": "gold"}, "tier"),
        ({"context_length": 15}, "context_length"),
        ({"context_length": 8193}, "context_length"),
        ({"context_length": "4096"}, "context_length"),
        ({"n_gpu_layers": -2}, "n_gpu_layers"),
        ({"n_gpu_layers": 1001}, "n_gpu_layers"),
        ({"idle_unload_seconds": -1}, "idle_unload_seconds"),
        ({"idle_unload_seconds": 604_801}, "idle_unload_seconds"),
        ({"idle_unload_seconds": True}, "idle_unload_seconds"),
        ({"replicas": 2}, "replicas"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field_and_changes_nothing(app, client, artifact, change, field):
    before = snapshot(app)
    refused = deploy(client, artifact, **change)
    assert refused.status_code == 400, refused.get_json()
    assert refused.get_json()["error"]["field"] == field
    assert snapshot(app) == before


def test_a_name_clients_may_send_as_model_is_accepted(client, artifact):
    assert deployed(client, artifact, name="org/Qwen2.5-0.5B:q4_k_m")["name"] == "org/Qwen2.5-0.5B:q4_k_m"


def test_the_heartbeat_carries_deployments_only_when_the_etag_differs(client, node, artifact):
    first = beat(client, node)
    assert first["deployments_etag"] == "0" and first["deployments"] == []
    assert "deployments" not in beat(client, node, deployments_etag=first["deployments_etag"])
    created = deployed(client, artifact, context_length=2048)
    changed = beat(client, node, deployments_etag=first["deployments_etag"])
    assert changed["deployments_etag"] != first["deployments_etag"]
    assert changed["deployments"] == [
        {
            "id": created["id"],
            "name": "qwen-chat",
            "desired": "ready",
            "container_path": ARTIFACT_PATH,
            "model_file": "tiny.gguf",
            "context_length": 2048,
            "n_gpu_layers": None,
            "idle_unload_seconds": 900,  # S2: the default; the agent passes it to the worker
        }
    ]
    same = beat(client, node, deployments_etag=changed["deployments_etag"])
    assert "deployments" not in same and same["deployments_etag"] == changed["deployments_etag"]
    # A report is no change of what the node is asked for: the etag stays.
    reported(client, node, created["id"], "loading")
    assert "deployments" not in beat(client, node, deployments_etag=changed["deployments_etag"])
    assert client.delete(f"{DEPLOYMENTS}/{created['id']}", headers=ADMIN).status_code == 202
    stopping = beat(client, node, deployments_etag=changed["deployments_etag"])
    assert stopping["deployments_etag"] != changed["deployments_etag"]
    assert [(item["id"], item["desired"]) for item in stopping["deployments"]] == [(created["id"], "stopped")]
    reported(client, node, created["id"], "stopped")
    stopped = beat(client, node, deployments_etag=stopping["deployments_etag"])
    assert stopped["deployments"] == []  # a stopped deployment leaves the list


def test_another_nodes_deployments_are_not_in_its_heartbeat(client, artifact):
    deployed(client, artifact)
    other = serving_node(client, hostname="other-node")
    assert beat(client, other)["deployments"] == []


def test_reports_drive_pending_to_ready_then_stop_each_transition_audited_once(app, client, node, artifact):
    created = deployed(client, artifact)
    assert reported(client, node, created["id"], "loading") == "loading"
    assert reported(client, node, created["id"], "loading") == "loading"  # the same report again
    assert shown(client, created["id"])["state"] == "loading"
    assert reported(client, node, created["id"], "ready", measured=MEASURED) == "ready"
    assert reported(client, node, created["id"], "ready", measured=MEASURED) == "ready"
    ready = shown(client, created["id"])
    assert ready["measured"] == MEASURED and ready["ready_at"] is not None and ready["error"] is None
    deleted = client.delete(f"{DEPLOYMENTS}/{created['id']}", headers=ADMIN)
    assert deleted.status_code == 202 and deleted.get_json()["state"] == "stopping"
    again = client.delete(f"{DEPLOYMENTS}/{created['id']}", headers=ADMIN)
    assert again.status_code == 202 and again.get_json()["state"] == "stopping"
    assert reported(client, node, created["id"], "ready") == "stopping"  # the node will stop it
    assert reported(client, node, created["id"], "stopped") == "stopped"
    assert reported(client, node, created["id"], "stopped") == "stopped"
    last = client.delete(f"{DEPLOYMENTS}/{created['id']}", headers=ADMIN)
    assert last.status_code == 200 and last.get_json()["state"] == "stopped"
    assert actions(app, created["id"]) == [
        "deployment.created",
        "deployment.loading",
        "deployment.ready",
        "deployment.stopping",
        "deployment.stopped",
    ]


def test_a_failure_is_shown_with_its_next_step_and_a_retry_can_load_it(app, client, node, artifact):
    created = deployed(client, artifact)
    error = {"code": "MODEL_LOAD_FAILED", "message": "tiny.gguf is not a GGUF file"}
    assert reported(client, node, created["id"], "failed", error=error) == "failed"
    failed = shown(client, created["id"])["error"]
    assert failed["code"] == "MODEL_LOAD_FAILED" and failed["message"] == error["message"]
    assert "model_file" in failed["next_step"]
    unavailable = {"code": "RUNTIME_WORKER_UNAVAILABLE", "message": "no worker on the socket"}
    assert reported(client, node, created["id"], "loading") == "loading"
    assert reported(client, node, created["id"], "failed", error=unavailable) == "failed"
    assert "start the runtime worker" in shown(client, created["id"])["error"]["next_step"].lower()
    assert reported(client, node, created["id"], "ready", measured=MEASURED) == "ready"
    assert shown(client, created["id"])["error"] is None
    with app.app_context():
        failures = db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == "deployment.failed"))
        assert [event.details["error_code"] for event in failures] == [
            "MODEL_LOAD_FAILED",
            "RUNTIME_WORKER_UNAVAILABLE",
        ]


def test_a_ready_deployment_whose_worker_restarted_goes_back_to_loading(client, node, artifact):
    created = deployed(client, artifact)
    reported(client, node, created["id"], "ready", measured=MEASURED)
    assert reported(client, node, created["id"], "loading") == "loading"
    assert shown(client, created["id"])["ready_at"] is None


def test_another_nodes_report_is_not_found_and_changes_nothing(app, client, artifact):
    created = deployed(client, artifact)
    other = serving_node(client, hostname="other-node")
    before = snapshot(app)
    refused = status(client, other, created["id"], "ready")
    assert refused.status_code == 404
    assert refused.get_json()["error"]["code"] == "DEPLOYMENT_NOT_FOUND"
    unknown_id = str(uuid.uuid4())
    unknown = status(client, other, unknown_id, "ready")
    assert unknown.status_code == 404
    # Word for word what an unknown id hears: the node learns nothing of another's deployments.
    assert (
        refused.get_json()["error"]["message"].replace(created["id"], unknown_id)
        == (unknown.get_json()["error"]["message"])
    )
    assert snapshot(app) == before


def test_a_report_after_stopped_changes_nothing(app, client, node, artifact):
    created = deployed(client, artifact)
    client.delete(f"{DEPLOYMENTS}/{created['id']}", headers=ADMIN)
    reported(client, node, created["id"], "stopped")
    before = snapshot(app)
    for state in ("loading", "ready", "failed"):
        assert reported(client, node, created["id"], state) == "stopped"
    assert snapshot(app) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "pending"}, "state"),
        ({"state": "ready", "measured": {"load_seconds": -1}}, "measured.load_seconds"),
        ({"state": "ready", "measured": {"memory_bytes": 1.5}}, "measured.memory_bytes"),
        ({"state": "failed", "error": {"code": "lower", "message": "x"}}, "error.code"),
        ({"state": "failed", "error": {"code": "X", "message": "x" * 1001}}, "error.message"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(app, client, node, artifact, body, field):
    created = deployed(client, artifact)
    before = snapshot(app)
    refused = agent(client, node, f"deployments/{created['id']}/status", **body)
    assert refused.status_code == 400, refused.get_json()
    assert refused.get_json()["error"]["field"] == field
    assert snapshot(app) == before


def test_ids_that_are_not_uuids_are_not_found(client, node):
    for response in (
        client.get(f"{DEPLOYMENTS}/not-a-uuid", headers=ADMIN),
        client.delete(f"{DEPLOYMENTS}/not-a-uuid", headers=ADMIN),
        status(client, node, "not-a-uuid", "ready"),
    ):
        assert response.status_code == 404
        assert response.get_json()["error"]["code"] == "DEPLOYMENT_NOT_FOUND"


def test_the_list_filters_by_node(client, node, artifact):
    created = deployed(client, artifact)
    other = serving_node(client, hostname="other-node")
    mine = client.get(DEPLOYMENTS, query_string={"node_id": node["id"]}, headers=ADMIN).get_json()
    assert [item["id"] for item in mine["deployments"]] == [created["id"]]
    theirs = client.get(DEPLOYMENTS, query_string={"node_id": other["id"]}, headers=ADMIN).get_json()
    assert theirs == {"deployments": []}


def test_the_admin_routes_need_the_operator_key(client):
    one = f"{DEPLOYMENTS}/{uuid.uuid4()}"
    for response in (client.get(DEPLOYMENTS), client.post(DEPLOYMENTS, json={}), client.get(one), client.delete(one)):
        assert response.status_code == 401


def test_answered_requests_are_counted_on_the_deployment_beside_what_the_node_measured(app, client, node, artifact):
    from app.serving import deployments

    created = deployed(client, artifact)
    assert reported(client, node, created["id"], "ready", measured=MEASURED) == "ready"
    with app.app_context():
        deployments.note_served(created["id"], deployments.Served(12, 0.25, 40.0))
        deployments.note_served(created["id"], deployments.Served(8, 0.5, None))
        deployments.note_served(str(uuid.uuid4()), deployments.Served(1, 0.1, 1.0))  # gone: nothing happens
    after = shown(client, created["id"])
    assert after["measured"] == {
        **MEASURED,
        "requests": 2,
        "generated_tokens": 20,
        "time_to_first_token_seconds": 0.5,
        "tokens_per_second": None,
    }
    assert after["last_request_at"] is not None
