"""A hostile enrolled node cannot grow its own state without bound or break what the operator reads (N4, P5).

Issue 15, item 2 and the bidi part of item 5: telemetry for GPUs no inventory listed, GPU rows
per node, undeclared inventory facts, nesting depth, labels, bidi controls, rows stored before
any of this was checked, and change audits that flood the log.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app import audit
from app.api import bodies
from app.api.validation import MAX_JSON_DEPTH, too_deep
from app.console.forms import parse_labels
from app.extensions import db
from app.jobs import runtime
from app.models import AuditEvent, Gpu, Node, NodeInventory, NodeLease, TelemetrySample
from app.nodes import publishing
from app.timeutil import utcnow
from tests.support import ADMIN, EVERY_TYPE, GENERATE, factories
from tests.support.bodies import RAW_INVENTORIES, new_uuid, strict_json
from tests.support.console import sign_in
from tests.support.nodes import agent, online_node
from tests.support.runtime import acquired_artifact, create, generate_result, worker

INVENTORY = "/api/v1/agent/inventory"
HEARTBEAT = "/api/v1/agent/heartbeat"


def count(model) -> int:
    return db.session.execute(sa.select(sa.func.count()).select_from(model)).scalar_one()


@pytest.fixture
def node(client):
    """An enrolled node that published one inventory with one GPU."""
    enrolled = factories.enrolled_node(client)
    enrolled["auth"] = factories.bearer(enrolled["credential"])
    assert client.post(INVENTORY, json=factories.inventory_body(), headers=enrolled["auth"]).status_code == 200
    return enrolled


# --------------------------------------------------------------------------- GPUs and telemetry


def test_telemetry_for_gpus_the_inventory_does_not_list_is_ignored_counted_and_creates_no_row(
    app, client, node, caplog
):
    listed = factories.gpu()["uuid"]
    samples = [factories.sample(listed)] + [factories.sample(new_uuid(1, i)) for i in range(63)]
    with caplog.at_level(logging.WARNING, logger="modelforge.publishing"):
        response = client.post(HEARTBEAT, json=factories.heartbeat_body(samples), headers=node["auth"])
    # Ignored, not refused: the heartbeat (liveness) of a node whose GPU set changed still counts.
    assert response.status_code == 200, response.get_data(as_text=True)
    with app.app_context():
        assert db.session.scalars(sa.select(Gpu.uuid)).all() == [listed]
        assert count(TelemetrySample) == 1
        assert db.session.get(NodeLease, node["node_id"]).status == "online"
    assert any("ignored 63 telemetry sample(s)" in record.getMessage() for record in caplog.records)


def test_gpu_rows_per_node_stay_bounded_however_many_uuids_inventories_name(app, client, node):
    for batch in range(5):
        gpus = [factories.gpu(new_uuid(batch, i)) for i in range(bodies.MAX_GPUS)]
        response = client.post(INVENTORY, json=factories.inventory_body(gpus), headers=node["auth"])
        assert response.status_code == 200, response.get_data(as_text=True)
        beat = factories.heartbeat_body([factories.sample(gpu["uuid"]) for gpu in gpus])
        assert client.post(HEARTBEAT, json=beat, headers=node["auth"]).status_code in (200, 429)
    with app.app_context():
        present = db.session.scalars(sa.select(Gpu.uuid).where(Gpu.present.is_(True))).all()
        assert sorted(present) == [new_uuid(4, i) for i in range(bodies.MAX_GPUS)]
        assert count(Gpu) <= bodies.MAX_GPUS + publishing.MAX_GONE_GPUS
        # Forgotten GPUs take their samples with them; none is left pointing nowhere.
        orphans = (
            sa.select(sa.func.count())
            .select_from(TelemetrySample)
            .where(TelemetrySample.gpu_id.not_in(sa.select(Gpu.id)))
        )
        assert db.session.execute(orphans).scalar_one() == 0


# --------------------------------------------------------------------------- inventory facts


def test_the_real_agents_facts_are_kept_and_unknown_ones_dropped(client, node):
    facts = {
        "os": "Debian GNU/Linux 12 (bookworm)",
        "architecture": "x86_64",
        "cpu_count": 1.5,
        "cpu_limited_by_cgroup": True,
        "memory_limited_by_cgroup": False,
        "storage": {
            "state": {"path": "/data/state", "total_bytes": 10**12, "free_bytes": 10**11},
            "hf-cache": {"path": "/data/hf", "total_bytes": None, "free_bytes": None, "unknown_reason": "No such file"},
        },
        "accelerator_mode": "nvidia",
        "gpu_unknown_reasons": {factories.gpu()["uuid"]: {"power_w": "Not Supported"}},
        "unknown_reasons": {"cpu_model": "no model name in /proc/cpuinfo"},
        "agent": {"version": "1.4.0", "python": "3.11.9"},
        "a_fact_from_a_newer_agent": {"nested": [1, 2, 3]},
    }
    body = factories.inventory_body(**facts)
    assert client.post(INVENTORY, json=body, headers=node["auth"]).status_code == 200
    shown = client.get(f"/api/v1/hardware/nodes/{node['node_id']}", headers=ADMIN).get_json()["inventory"]
    assert "a_fact_from_a_newer_agent" not in shown
    assert {key: shown[key] for key in facts if key != "a_fact_from_a_newer_agent"} == {
        key: value for key, value in facts.items() if key != "a_fact_from_a_newer_agent"
    }


@pytest.mark.parametrize(("fact", "field"), RAW_INVENTORIES)
def test_facts_that_once_broke_the_node_page_are_refused_by_name(app, client, node, fact, field):
    raw = b'{"protocol_version": 1, "agent_version": "1.0", "inventory": {"hostname": "h", "gpus": [], ' + fact + b"}}"
    headers = {"Content-Type": "application/json", **node["auth"]}
    response = client.post(INVENTORY, data=raw, headers=headers)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.get_json()["error"]["field"] == field
    with app.app_context():
        assert db.session.get(NodeInventory, node["node_id"]).facts["hostname"] == "gpu-node-1"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 960, 990])
def test_nesting_deeper_than_any_body_is_refused_before_parsing(client, node, depth):
    nested = b"[" * (depth - 2) + b"]" * (depth - 2)  # the body and `inventory` are two levels
    raw = b'{"protocol_version": 1, "agent_version": "1.0", "inventory": {"gpus": [], "x": ' + nested + b"}}"
    response = client.post(INVENTORY, data=raw, headers={"Content-Type": "application/json", **node["auth"]})
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "JSON_TOO_DEEP"


def test_nesting_up_to_the_limit_is_parsed(client, node):
    nested = b"[" * (MAX_JSON_DEPTH - 2) + b"]" * (MAX_JSON_DEPTH - 2)
    raw = b'{"protocol_version": 1, "agent_version": "1.0", "inventory": {"gpus": [], "x": ' + nested + b"}}"
    response = client.post(INVENTORY, data=raw, headers={"Content-Type": "application/json", **node["auth"]})
    assert response.status_code == 200, response.get_data(as_text=True)


# --------------------------------------------------------------------------- labels

HOSTILE_LABELS = [
    {"site": "nul\x00"},
    {"site": "two\nlines"},
    {"site": "\x1b[31mred"},
    {"site\n": "office"},
    {"site": "\ud800"},
    {"site": "bidi \u202e"},
    {"site": "arabic mark \u061c"},
]


@pytest.mark.parametrize("labels", HOSTILE_LABELS)
def test_labels_are_refused_alike_by_the_api_and_the_console(app, client, labels):
    response = client.post(
        "/api/v1/admin/node-enrollments", json=factories.enrollment_body(labels=labels), headers=ADMIN
    )
    assert response.status_code == 400 and response.get_json()["error"]["field"] == "labels"
    ((key, value),) = labels.items()
    with pytest.raises(ValueError, match="label"):
        parse_labels(f"{key}={value}")


# --------------------------------------------------------------------------- what is already stored

DEEP = [[[["x"]]]]
for _ in range(900):
    DEEP = [DEEP]


def store_hostile_rows(app, node_id: str, dialect: str) -> None:
    """Rows as an older control plane stored them: written straight into the database."""
    sqlite = dialect == "sqlite"
    facts = {
        "hostname": "host\u202e-evil",
        "os": "bad \ud800 os" if sqlite else "bad \u202e os",  # PostgreSQL cannot hold a lone surrogate
        "kernel": DEEP,
        "cpu_count": float("inf") if sqlite else 10**400,  # nor infinity in JSON
        "memory_total_bytes": 10**400,
        "storage": ["state"],
        "unknown_reasons": "everything",
        "architecture": {"a": float("nan")} if sqlite else {"a": -(10**30)},
    }
    with app.app_context():
        inventory = db.session.get(NodeInventory, node_id)
        inventory.facts = facts
        node = db.session.get(Node, node_id)
        node.hostname = "host\u202e-evil"
        node.labels = {"site": "x\ud800" if sqlite else "x\u202e"}
        lease = db.session.get(NodeLease, node_id)
        lease.health_status = "degraded"
        lease.health_detail = "detail\u202e 12:00"
        gpu = db.session.scalars(sa.select(Gpu).where(Gpu.node_id == node_id)).one()
        gpu.name = "gpu \u202e name"  # a lone surrogate fits only in a JSON column (escaped)
        gpu.memory_total_bytes = 2**63 - 1
        db.session.commit()


def test_what_is_already_stored_never_breaks_the_node_page_the_list_or_the_api(app, client, node, database_url):
    store_hostile_rows(app, node["node_id"], database_url.split(":")[0].split("+")[0])
    assert sign_in(client).status_code == 302
    page = client.get(f"/hardware/nodes/{node['node_id']}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert len(html) < 1_000_000
    # Agent text is isolated: a U+202E in it cannot reorder the server's own timestamps after it.
    assert "<bdi>host\u202e-evil</bdi>" in html
    assert "<bdi>detail\u202e 12:00</bdi>" in html
    assert "<bdi>gpu \u202e name</bdi>" in html
    assert client.get(f"/hardware/nodes/{node['node_id']}", headers={"HX-Request": "true"}).status_code == 200
    listing = client.get("/hardware/nodes")
    assert listing.status_code == 200 and "<bdi>host\u202e-evil</bdi>" in listing.get_data(as_text=True)

    for path in ("/api/v1/hardware/nodes", f"/api/v1/hardware/nodes/{node['node_id']}"):
        response = client.get(path, headers=ADMIN)
        assert response.status_code == 200
        described = strict_json(response.get_data(as_text=True))
        described = described["nodes"][0] if "nodes" in described else described
        assert described["inventory"]["memory_total_bytes"] is None  # beyond any count: shown as unknown
        assert described["inventory"]["cpu_count"] is None
        assert described["gpus"][0]["memory_total_bytes"] == 2**63 - 1


# --------------------------------------------------------------------------- change audits


def test_a_node_flipping_hostname_and_gpus_writes_one_event_of_each_kind_per_window(app, client, node):
    with app.app_context():
        publisher = publishing.Publisher(node["node_id"])
        versions = publishing.Versions("1.0", 1, "COMPATIBLE")
        for i in range(40):
            facts = {"hostname": f"host-{i % 2}"}
            gpus = [{"uuid": new_uuid(0, i % 2)}]
            publishing.record_inventory(publisher, versions, facts, gpus)
        audit.record(audit.OPERATOR, "node.disabled", node["node_id"])
        db.session.commit()
    events = client.get("/api/v1/admin/audit-events", query_string={"limit": 5}, headers=ADMIN).get_json()
    actions = [event["action"] for event in events["audit_events"]]
    assert actions[0] == "node.disabled"
    assert actions.count("node.hostname_changed") == 1 and actions.count("node.gpus_changed") == 1
    details = {event["action"]: event["details"] for event in events["audit_events"]}
    # The first change as written, then how many there were and the latest.
    assert details["node.hostname_changed"]["old"] == "gpu-node-1"
    assert details["node.hostname_changed"]["changes"] == 40
    assert details["node.hostname_changed"]["last"] == {"old": "host-0", "new": "host-1"}
    assert details["node.gpus_changed"]["changes"] == 41  # the first inventory added one too


def test_a_change_after_the_window_is_a_new_event(app, client, node):
    with app.app_context():
        publisher = publishing.Publisher(node["node_id"])
        versions = publishing.Versions("1.0", 1, "COMPATIBLE")
        publishing.record_inventory(publisher, versions, {"hostname": "a"}, [])
        db.session.execute(sa.update(AuditEvent).values(at=utcnow() - publishing.CHANGE_AUDIT_WINDOW))
        db.session.commit()
        publishing.record_inventory(publisher, versions, {"hostname": "b"}, [])
        changes = db.session.scalars(
            sa.select(AuditEvent.details).where(AuditEvent.action == "node.hostname_changed")
        ).all()
    assert changes == [{"old": "gpu-node-1", "new": "a"}, {"old": "a", "new": "b"}]


# --------------------------------------------------------------------------- through the real server


# --------------------------------------------------------------------------- depth, linear (issue 22 item 3)


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _random_json(rng: random.Random, depth: int):
    """Nested lists and objects whose strings hold brackets, quotes and backslashes; one child of
    each container goes on to `depth`, its siblings stay shallow (a few hundred values in all)."""
    leaves = ["[", "]", "{", '"', "\\", '\\"', "\\\\[", "a}b", "", 7, None, True]
    if depth <= 0:
        return rng.choice(leaves)
    siblings = [rng.choice(leaves + [[], {}, [[rng.choice(leaves)]]]) for _ in range(rng.randint(0, 3))]
    siblings.insert(rng.randint(0, len(siblings)), _random_json(rng, depth - 1))
    if rng.random() < 0.5:
        return siblings
    return {rng.choice(["k", "[", '"]', "\\"]) + str(i): value for i, value in enumerate(siblings)}


def test_the_depth_check_agrees_with_the_parser_on_every_body():
    """The linear check is exact: for any well-formed JSON, deeper than the limit or not as parsed."""
    rng = random.Random(22)
    for _ in range(3000):
        value = _random_json(rng, rng.randint(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 2))
        raw = json.dumps(value).encode()
        assert too_deep(raw) == (_depth(value) > MAX_JSON_DEPTH), raw[:200]
    chains = b"[" + b",".join([b"[" * 31 + b"]" * 31] * 1000) + b"]"  # 32 deep: allowed, slowest to shrink
    assert not too_deep(chains) and too_deep(b"[" + chains + b"]")


# --------------------------------------------------------------------------- the complete route (issue 22 item 3)


def complete_url(job_id: str) -> str:
    return f"/api/v1/agent/jobs/{job_id}/complete"


def test_an_unauthenticated_complete_is_refused_before_its_body_is_read(client, node):
    """4 MiB of JSON that is not even valid: refused 401 for the credential, never 400 for the body."""
    not_json = b'{"result": ' + b"[" * (runtime.MAX_COMPLETE_BYTES - 64)
    for headers, code in (({}, "CREDENTIAL_REQUIRED"), (factories.bearer("mfn_" + "x" * 43), "CREDENTIAL_INVALID")):
        response = client.post(
            complete_url(str(uuid.uuid4())), data=not_json, headers={"Content-Type": "application/json", **headers}
        )
        assert response.status_code == 401, response.get_data(as_text=True)[:300]
        assert response.get_json()["error"]["code"] == code


def test_a_node_that_does_not_run_the_job_keeps_the_general_body_limit(app, client, node):
    padded = {**factories.versions(), "attempt": 1, "result": {"pad": "x" * app.config["MAX_CONTENT_LENGTH"]}}
    response = client.post(complete_url(str(uuid.uuid4())), json=padded, headers=node["auth"])
    assert response.status_code == 413, response.get_data(as_text=True)[:300]
    assert response.get_json()["error"]["code"] == "REQUEST_TOO_LARGE"
    small = {**factories.versions(), "attempt": 1, "result": {"pad": "x"}}
    fenced = client.post(complete_url(str(uuid.uuid4())), json=small, headers=node["auth"])
    assert fenced.status_code == 409 and fenced.get_json()["error"]["code"] == "JOB_LEASE_LOST"


def test_the_node_that_runs_the_job_completes_it_with_a_result_over_the_general_limit(app, client):
    node = online_node(client, capabilities=EVERY_TYPE, runtime_worker=worker())
    artifact = acquired_artifact(client, node)
    prompts = [f"Prompt {i}" for i in range(runtime.MAX_PROMPTS)]
    params = {"artifact_id": artifact["id"], "model_file": "tiny.gguf", "prompts": prompts}
    job = create(client, GENERATE, node["id"], params).get_json()
    assert agent(client, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]["id"] == job["id"]
    long_text = "y" * (runtime.MAX_OUTPUT_LENGTH - 1)
    outputs = [
        {"prompt": prompt, "text": long_text, "prompt_tokens": 3, "completion_tokens": 16, "finish_reason": "length"}
        for prompt in prompts
    ]
    result = generate_result(artifact["id"], outputs=outputs)
    assert len(json.dumps(result)) > 3 * app.config["MAX_CONTENT_LENGTH"]
    done = agent(client, node, f"jobs/{job['id']}/complete", attempt=1, result=result)
    assert done.status_code == 200, done.get_data(as_text=True)[:300]
    assert done.get_json()["job"]["state"] == "succeeded"


# --------------------------------------------------------------------------- a node's clock (issue 22 item 13)


def rfc3339(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_readings_dated_ahead_are_dropped_counted_and_shown_and_the_heartbeat_counts(app, client):
    node = online_node(client, inventory=True)  # one GPU (factories.gpu()), online
    with app.app_context():
        db.session.execute(sa.update(NodeLease).values(status="offline"))
        db.session.commit()
        before = count(TelemetrySample)
    ahead = rfc3339(utcnow() + timedelta(minutes=15))
    samples = [factories.sample(sampled_at=ahead), factories.sample()]
    observation = {"id": str(uuid.uuid4()), "exists": True, "writable": True, "free_bytes": 1, "total_bytes": 2}
    body = factories.heartbeat_body(samples, storage_roots=[{**observation, "observed_at": ahead}])
    response = client.post(HEARTBEAT, json=body, headers=node["auth"])
    assert response.status_code == 200, response.get_data(as_text=True)
    warning = response.get_json()["clock_warning"]
    assert (warning["dropped_samples"], warning["dropped_observations"]) == (1, 1)
    assert 14 * 60 < warning["offset_seconds"] < 16 * 60
    assert "check the node's clock" in warning["next_step"].lower()
    with app.app_context():
        assert count(TelemetrySample) == before + 1  # the one the control plane could date
        assert db.session.get(NodeLease, node["id"]).status == "online"  # liveness kept
    described = client.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).get_json()
    assert described["status"] == "online"
    assert "dropped 2 reading(s)" in described["health"]["detail"]
    assert "check the node's clock" in described["health"]["detail"]
    sign_in(client)
    page = client.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    assert "dropped 2 reading(s)" in page and "check the node&#39;s clock" in page

    again = client.post(HEARTBEAT, json=factories.heartbeat_body([factories.sample()]), headers=node["auth"])
    assert "clock_warning" not in again.get_json()  # a clock put right: no warning, the note goes
    described = client.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).get_json()
    assert "clock" not in described["health"]["detail"]


def test_telemetry_from_a_clock_behind_is_stored_and_the_reply_says_why_it_is_not_fresh(app, client):
    node = online_node(client, inventory=True)
    with app.app_context():
        before = count(TelemetrySample)
    behind = rfc3339(utcnow() - timedelta(minutes=15))
    response = client.post(
        HEARTBEAT, json=factories.heartbeat_body([factories.sample(sampled_at=behind)]), headers=node["auth"]
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    warning = response.get_json()["clock_warning"]
    assert warning["dropped_samples"] == 0 and -16 * 60 < warning["offset_seconds"] < -14 * 60
    assert "behind" in warning["message"] and "/metrics" in warning["message"]
    with app.app_context():
        assert count(TelemetrySample) == before + 1
