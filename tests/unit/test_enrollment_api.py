"""Enrolment tokens through the API: mint, list, revoke, claim once, expiry (E1–E5, I4, P2)."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import AuditEvent, Credential, Enrollment, Node
from app.nodes import enrollment
from tests.support import ADMIN, factories

ENROLLMENTS = "/api/v1/admin/node-enrollments"


def rows(app, model):
    with app.app_context():
        return list(db.session.scalars(sa.select(model)))


def test_mint_returns_the_token_once_and_stores_only_its_hash(app, client):
    body = factories.mint(
        client,
        role="primary-inference",
        labels={"site": "office"},
        lab_eligible=True,
        benchmark_eligible=True,
    )
    token = body["token"]
    assert token.startswith("mfe_") and len(token) >= 4 + 43  # 256 bits, url-safe base64
    assert body["state"] == "pending"
    assert body["api_origin"] == "http://localhost"
    assert (body["role"], body["labels"]) == ("primary-inference", {"site": "office"})
    assert (body["production_eligible"], body["lab_eligible"], body["benchmark_eligible"]) == (
        False,
        True,
        True,
    )
    (stored,) = rows(app, Enrollment)
    assert stored.token_hash == hashlib.sha256(token.encode()).hexdigest()
    with app.app_context():
        dumped = json.dumps(
            [list(row) for row in db.session.execute(sa.text("SELECT * FROM enrollments"))], default=str
        )
        audit_dump = json.dumps([event.to_dict() for event in db.session.scalars(sa.select(AuditEvent))])
    assert token not in dumped and token not in audit_dump

    listed = client.get(ENROLLMENTS, headers=ADMIN).get_json()["enrollments"]
    assert [item["id"] for item in listed] == [body["id"]]
    assert "token" not in listed[0] and token not in json.dumps(listed)
    fetched = client.get(f"{ENROLLMENTS}/{body['id']}", headers=ADMIN)
    assert fetched.status_code == 200 and "token" not in fetched.get_json()
    assert fetched.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"expires_in_seconds": 900}, "display_name"),
        ({"display_name": "  ", "expires_in_seconds": 900}, "display_name"),
        ({"display_name": "n"}, "expires_in_seconds"),
        ({"display_name": "n", "expires_in_seconds": 59}, "expires_in_seconds"),
        ({"display_name": "n", "expires_in_seconds": 86401}, "expires_in_seconds"),
        ({"display_name": "n", "expires_in_seconds": "900"}, "expires_in_seconds"),
        ({"display_name": "n", "expires_in_seconds": True}, "expires_in_seconds"),
        ({"display_name": "n", "expires_in_seconds": 900, "labels": ["a"]}, "labels"),
        ({"display_name": "n", "expires_in_seconds": 900, "labels": {"site": 3}}, "labels.site"),
        (
            {"display_name": "n", "expires_in_seconds": 900, "production_eligible": "yes"},
            "production_eligible",
        ),
        ({"display_name": "n", "expires_in_seconds": 900, "expire_in_seconds": 5}, "expire_in_seconds"),
        ({"display_name": "a\x00b", "expires_in_seconds": 900}, "display_name"),
    ],
)
def test_mint_validation_names_the_field(app, client, body, field):
    response = client.post(ENROLLMENTS, json=body, headers=ADMIN)
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "VALIDATION_FAILED" and error["field"] == field
    assert error["message"].startswith(field) and error["next_step"]
    assert rows(app, Enrollment) == []


@pytest.mark.parametrize("headers", [{}, {"X-ModelForge-Admin-Token": "wrong" * 10}])
def test_admin_endpoints_need_the_operator_key(client, headers):
    response = client.post(ENROLLMENTS, json=factories.enrollment_body(), headers=headers)
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] in {"ADMIN_TOKEN_REQUIRED", "ADMIN_TOKEN_INVALID"}
    assert client.get("/api/v1/hardware/nodes", headers=headers).status_code == 401


def test_a_token_minted_production_eligible_gives_a_node_that_is_not_until_validated(app, client):
    """V1 over E1: the enrolment's flag is a request; only a validated node becomes production eligible."""
    minted = factories.mint(client, production_eligible=True)
    assert minted["production_eligible"] is True
    assert client.post("/api/v1/agent/enroll", json=factories.enroll_body(minted["token"])).status_code == 201

    (node,) = rows(app, Node)
    assert node.production_eligible is False
    (enrolled,) = [event for event in rows(app, AuditEvent) if event.action == "node.enrolled"]
    assert enrolled.details["production_eligibility_requested"] is True


def test_claim_gives_one_node_one_credential_and_spends_the_token(app, client):
    minted = factories.mint(client, role="gpu", labels={"rack": "2"}, lab_eligible=True)
    body = factories.enroll_body(minted["token"])
    response = client.post("/api/v1/agent/enroll", json=body)
    assert response.status_code == 201
    reply = response.get_json()
    assert reply["node_id"] == body["node_id"]
    assert reply["credential"].startswith("mfn_")
    assert reply["heartbeat_interval_seconds"] == 15
    assert reply["compatibility"]["answer"] == "COMPATIBLE"
    assert response.headers["Cache-Control"] == "no-store"

    (node,) = rows(app, Node)
    assert (node.id, node.hostname, node.display_name) == (body["node_id"], "gpu-node-1", "GPU Node")
    assert (node.role, node.labels, node.lab_eligible, node.production_eligible) == (
        "gpu",
        {"rack": "2"},
        True,
        False,
    )
    (credential,) = rows(app, Credential)
    assert credential.token_hash == hashlib.sha256(reply["credential"].encode()).hexdigest()
    consumed = client.get(f"{ENROLLMENTS}/{minted['id']}", headers=ADMIN).get_json()
    assert consumed["state"] == "consumed" and consumed["node_id"] == body["node_id"]
    assert consumed["consumed_at"] is not None

    again = client.post("/api/v1/agent/enroll", json=factories.enroll_body(minted["token"]))
    assert again.status_code == 409
    assert again.get_json()["error"]["code"] == "ENROLLMENT_TOKEN_CONSUMED"
    assert len(rows(app, Node)) == 1 and len(rows(app, Credential)) == 1
    actions = [event.action for event in rows(app, AuditEvent)]
    assert actions == ["enrollment.created", "node.enrolled"]


def test_claim_through_another_origin_is_refused_and_the_token_survives(app, client):
    minted = factories.mint(client)
    response = client.post(
        "/api/v1/agent/enroll",
        json=factories.enroll_body(minted["token"], origin="https://other.example:8443"),
    )
    assert response.status_code == 409
    body = response.get_json()
    assert body["error"]["code"] == "API_ORIGIN_MISMATCH"
    assert body["expected_origin"] == "http://localhost"
    assert "http://localhost" in body["error"]["message"]
    assert minted["token"] not in json.dumps(body)
    assert rows(app, Node) == []
    # E3: the right origin still works — the refusal did not spend the token.
    ok = client.post("/api/v1/agent/enroll", json=factories.enroll_body(minted["token"], origin="http://LOCALHOST:80/"))
    assert ok.status_code == 201


def test_public_api_origin_setting_is_recorded(database_url, tmp_path):
    from app import create_app
    from tests.support import app_env

    application = create_app(app_env(database_url, tmp_path, MODELFORGE_PUBLIC_API_ORIGIN="https://modelforge.lan/"))
    client = application.test_client()
    minted = factories.mint(client)
    assert minted["api_origin"] == "https://modelforge.lan"
    refused = client.post("/api/v1/agent/enroll", json=factories.enroll_body(minted["token"]))
    assert refused.get_json()["expected_origin"] == "https://modelforge.lan"
    accepted = client.post(
        "/api/v1/agent/enroll", json=factories.enroll_body(minted["token"], origin="https://modelforge.lan")
    )
    assert accepted.status_code == 201
    with application.app_context():
        db.engine.dispose()


def test_unknown_revoked_and_expired_tokens_are_refused(app, client):
    unknown = client.post("/api/v1/agent/enroll", json=factories.enroll_body("mfe_" + "x" * 43))
    assert (unknown.status_code, unknown.get_json()["error"]["code"]) == (401, "ENROLLMENT_TOKEN_INVALID")

    revoked = factories.mint(client)
    revoke = client.post(f"{ENROLLMENTS}/{revoked['id']}/revoke", headers=ADMIN)
    assert revoke.status_code == 200 and revoke.get_json()["state"] == "revoked"
    refused = client.post("/api/v1/agent/enroll", json=factories.enroll_body(revoked["token"]))
    assert (refused.status_code, refused.get_json()["error"]["code"]) == (410, "ENROLLMENT_TOKEN_REVOKED")

    expired = factories.mint(client)
    factories.expire_enrollments(app, expired["id"])
    refused = client.post("/api/v1/agent/enroll", json=factories.enroll_body(expired["token"]))
    assert (refused.status_code, refused.get_json()["error"]["code"]) == (410, "ENROLLMENT_TOKEN_EXPIRED")
    assert rows(app, Node) == []


def test_sweep_marks_expired_tokens_once_and_audits_each(app, client):
    expired = factories.mint(client)
    live = factories.mint(client)
    factories.expire_enrollments(app, expired["id"], seconds_ago=5)
    with app.app_context():
        assert enrollment.sweep_expired() == 1
        assert enrollment.sweep_expired() == 0  # a second run changes nothing
    states = {item["id"]: item["state"] for item in client.get(ENROLLMENTS, headers=ADMIN).get_json()["enrollments"]}
    assert states == {expired["id"]: "expired", live["id"]: "pending"}
    expired_events = [e for e in rows(app, AuditEvent) if e.action == "enrollment.expired"]
    assert [e.details["enrollment_id"] for e in expired_events] == [expired["id"]]
    assert client.get(ENROLLMENTS + "?state=expired", headers=ADMIN).get_json()["enrollments"][0]["id"] == expired["id"]
    bad = client.get(ENROLLMENTS + "?state=bogus", headers=ADMIN)
    assert bad.status_code == 400 and bad.get_json()["error"]["field"] == "state"


def test_only_pending_tokens_can_be_revoked(app, client):
    node = factories.enrolled_node(client)
    (consumed,) = rows(app, Enrollment)
    response = client.post(f"{ENROLLMENTS}/{consumed.id}/revoke", headers=ADMIN)
    assert response.status_code == 409
    assert response.get_json()["error"]["code"] == "ENROLLMENT_NOT_PENDING"
    assert rows(app, Enrollment)[0].state == "consumed"
    assert client.post(f"{ENROLLMENTS}/{uuid.uuid4()}/revoke", headers=ADMIN).status_code == 404
    assert node["node_id"]


def test_incompatible_agent_gets_426_and_the_token_is_not_spent(app, client):
    minted = factories.mint(client)
    cases = [
        (2, "TOO_NEW"),
        (0, "TOO_OLD"),
        ("1", "UNKNOWN"),
        (None, "UNKNOWN"),
        (2**63, "UNKNOWN"),
        (True, "UNKNOWN"),
    ]
    for version, answer in cases:
        body = factories.enroll_body(minted["token"], protocol_version=version)
        response = client.post("/api/v1/agent/enroll", json=body)
        assert response.status_code == 426
        reply = response.get_json()
        assert reply["error"]["code"] == "PROTOCOL_INCOMPATIBLE"
        assert reply["compatibility"]["answer"] == answer
        assert reply["compatibility"]["supported"] == [1]
        assert reply["compatibility"]["protocol_version"] == version
        assert reply["compatibility"]["action"]
    assert client.post("/api/v1/agent/enroll", json=factories.enroll_body(minted["token"])).status_code == 201


def test_a_node_with_an_active_credential_cannot_enrol_again_until_revoked(app, client):
    first = factories.enrolled_node(client)
    second_token = factories.mint(client)["token"]
    body = factories.enroll_body(second_token, node_id=first["node_id"])
    refused = client.post("/api/v1/agent/enroll", json=body)
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "NODE_ALREADY_ENROLLED"
    # I4: the refusal did not spend the second token.
    assert client.get(ENROLLMENTS + "?state=pending", headers=ADMIN).get_json()["enrollments"]

    revoke = client.post(f"/api/v1/admin/nodes/{first['node_id']}/credential/revoke", headers=ADMIN)
    assert revoke.status_code == 200 and revoke.get_json()["active"] is False
    again = client.post("/api/v1/agent/enroll", json=body)
    assert again.status_code == 201 and again.get_json()["node_id"] == first["node_id"]
    assert len(rows(app, Node)) == 1
    active = [c for c in rows(app, Credential) if c.revoked_at is None]
    assert len(active) == 1
    events = [e for e in rows(app, AuditEvent) if e.action == "node.enrolled"]
    assert [e.details["re_enrolled"] for e in events] == [False, True]


def test_re_enrolling_a_production_eligible_node_clears_the_flag_audited(app, client):
    """V1: a re-enrolled node starts ineligible again, and the audit trail says why."""
    first = factories.enrolled_node(client)
    node_id = first["node_id"]
    with app.app_context():
        db.session.get(Node, node_id).production_eligible = True
        db.session.commit()
    assert client.post(f"/api/v1/admin/nodes/{node_id}/credential/revoke", headers=ADMIN).status_code == 200
    body = factories.enroll_body(factories.mint(client)["token"], node_id=node_id)
    assert client.post("/api/v1/agent/enroll", json=body).status_code == 201
    assert [node.production_eligible for node in rows(app, Node)] == [False]
    cleared = [e for e in rows(app, AuditEvent) if e.action == "node.production_eligibility_cleared"]
    assert [(e.node_id, e.details["reasons"]) for e in cleared] == [(node_id, ["re-enrolled"])]


def test_second_node_id_with_same_hostname_is_flagged(client):
    first = factories.enrolled_node(client, hostname="tower")
    factories.enrolled_node(client, hostname="tower")
    node = client.get(f"/api/v1/hardware/nodes/{first['node_id']}", headers=ADMIN).get_json()
    assert node["suspected_duplicate_hostname"] is True
    lone = factories.enrolled_node(client, hostname="other")
    assert (
        client.get(f"/api/v1/hardware/nodes/{lone['node_id']}", headers=ADMIN).get_json()[
            "suspected_duplicate_hostname"
        ]
        is False
    )
