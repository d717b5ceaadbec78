"""GET /metrics (O1): never anonymous, parsed by prometheus_client's own parser, on both databases."""

from __future__ import annotations

import logging
import unicodedata
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app import create_app, scheduler
from app.config import ConfigError, load_settings
from app.extensions import db
from app.metrics import collect
from app.models import Deployment, Gpu, Job, Node, NodeLease, TelemetrySample
from app.timeutil import utcnow
from tests.support import ADMIN, OPERATOR_KEY, app_env, factories
from tests.support.metrics import publish, scrape
from tests.support.runtime import acquired_artifact, serving_node

METRICS_TOKEN = "mft-" + "m" * 40
GPU_A = "GPU-00000000-0000-0000-0000-00000000000a"
GPU_B = "GPU-00000000-0000-0000-0000-00000000000b"
BEARER_OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def values(samples, name: str, **labels: str) -> list[float]:
    """The values of `name`'s samples whose labels include `labels`."""
    return [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]


@pytest.fixture
def token_app(database_url, tmp_path):
    """The control plane with a separate MODELFORGE_METRICS_TOKEN."""
    application = create_app(app_env(database_url, tmp_path, MODELFORGE_METRICS_TOKEN=METRICS_TOKEN))
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "METRICS_TOKEN_REQUIRED"),
        ({"Authorization": "Bearer "}, "METRICS_TOKEN_REQUIRED"),
        ({"Authorization": "Basic " + OPERATOR_KEY}, "METRICS_TOKEN_REQUIRED"),
        ({"Authorization": "Bearer wrong-" + "x" * 40}, "METRICS_TOKEN_INVALID"),
        ({"Authorization": f"Bearer {OPERATOR_KEY}x"}, "METRICS_TOKEN_INVALID"),
        ({"X-ModelForge-Admin-Token": "wrong-" + "x" * 40}, "METRICS_TOKEN_INVALID"),
        ({"Authorization": f"Bearer {METRICS_TOKEN}"}, "METRICS_TOKEN_INVALID"),  # no metrics token configured
    ],
)
def test_metrics_are_never_anonymous(client, headers, code):
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    body = response.get_json()
    assert body["error"]["code"] == code and set(body["error"]) == {"code", "message", "next_step"}
    assert "modelforge_" not in response.get_data(as_text=True)
    for secret in (OPERATOR_KEY, METRICS_TOKEN, "wrong-"):
        assert secret not in response.get_data(as_text=True)  # P2: nothing presented is echoed


def test_the_operator_key_reads_metrics_in_its_header_or_as_a_bearer_token(client):
    for headers in (ADMIN, BEARER_OPERATOR):
        assert values(scrape(client, headers), "modelforge_nodes", status="online") == [0]


def test_the_metrics_token_reads_metrics_and_appears_in_no_log_or_reply(token_app, caplog):
    caplog.set_level(logging.DEBUG)
    client = token_app.test_client()
    samples = scrape(client, {"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert values(samples, "modelforge_nodes", status="pending") == [0]
    scrape(client, ADMIN)  # the operator key still reads them
    refused = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN[:-1]}"})
    assert refused.status_code == 401
    assert METRICS_TOKEN not in caplog.text and METRICS_TOKEN[:-1] not in refused.get_data(as_text=True)
    with token_app.app_context():
        assert METRICS_TOKEN not in repr(token_app.config["MODELFORGE"])


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("short", "MODELFORGE_METRICS_TOKEN must be at least 32 characters"),
        ("a" * 31, "MODELFORGE_METRICS_TOKEN must be at least 32 characters"),
        ("a" * 20 + " " + "a" * 20, "MODELFORGE_METRICS_TOKEN must be printable ASCII"),
        ("ä" * 40, "MODELFORGE_METRICS_TOKEN must be printable ASCII"),
    ],
)
def test_a_bad_metrics_token_stops_start_up_naming_the_variable_not_the_value(tmp_path, token, says):
    with pytest.raises(ConfigError, match=says) as refused:
        load_settings(
            {
                "MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY,
                "MODELFORGE_SECRET_KEY": "s",
                **{"MODELFORGE_METRICS_TOKEN": token},
            },
            tmp_path,
        )
    assert token not in str(refused.value)


def test_gpu_series_are_the_newest_fresh_sample_and_nothing_invented(app, client):
    node = factories.enrolled_node(client)
    gpus = [factories.gpu(GPU_A), factories.gpu(GPU_B, pci_bus_id="00000000:02:00.0", memory_total_bytes=8 * 2**30)]
    # GPU A: every metric read; GPU B: no sample at all.
    publish(client, node, gpus, [factories.sample(GPU_A, temperature_c=None)])
    samples = scrape(client)
    a = {"node_id": node["node_id"], "node_name": "GPU Node", "gpu_uuid": GPU_A}
    assert values(samples, "modelforge_gpu_utilization_percent", **a) == [37.0]
    assert values(samples, "modelforge_gpu_memory_used_bytes", **a) == [2_000_000_000]
    assert values(samples, "modelforge_gpu_memory_total_bytes", **a) == [17_171_480_576]
    assert values(samples, "modelforge_gpu_power_watts", **a) == [123.4]
    assert values(samples, "modelforge_gpu_temperature_celsius", **a) == []  # NVML could not read it (P3)
    assert values(samples, "modelforge_gpu_info", gpu_name="NVIDIA GeForce RTX 4080", **a) == [1]
    gpu_families = [name for name, _, _ in collect.GPU_FAMILIES] + ["modelforge_gpu_info"]
    assert not [s for s in samples if s.name in gpu_families and s.labels["gpu_uuid"] == GPU_B]  # never sampled

    # The same sample, older than the freshness window (MODELFORGE_NODE_STALE_AFTER_SECONDS): gone.
    with app.app_context():
        old = utcnow() - timedelta(seconds=46)
        db.session.execute(sa.update(TelemetrySample).values(sampled_at=old))
        db.session.commit()
    samples = scrape(client)
    assert not [s for s in samples if s.name in gpu_families]


def test_nodes_by_status_and_heartbeat_age_follow_the_stored_heartbeat(app, client):
    online, silent, pending = (factories.enrolled_node(client) for _ in range(3))
    for node in (online, silent):
        publish(client, node, [factories.gpu(f"GPU-{uuid.uuid4()}")], [])
    with app.app_context():
        db.session.execute(
            sa.update(NodeLease)
            .where(NodeLease.node_id == silent["node_id"])
            .values(last_heartbeat_at=utcnow() - timedelta(seconds=600))
        )
        db.session.execute(sa.update(Node).where(Node.id == online["node_id"]).values(disabled=True))
        db.session.commit()
    samples = scrape(client)
    counts = {s.labels["status"]: s.value for s in samples if s.name == "modelforge_nodes"}
    # No sweep has run: the status is computed from the stored time (L1), as the API shows it.
    assert counts == {"online": 1, "stale": 0, "offline": 1, "pending": 1}
    assert values(samples, "modelforge_nodes_disabled") == [1]
    status = {s.labels["node_id"]: s.labels["status"] for s in samples if s.name == "modelforge_node_status"}
    assert status == {online["node_id"]: "online", silent["node_id"]: "offline", pending["node_id"]: "pending"}
    ages = {s.labels["node_id"]: s.value for s in samples if s.name == "modelforge_node_heartbeat_age_seconds"}
    assert set(ages) == {online["node_id"], silent["node_id"]}  # a pending node has no age to show
    assert ages[online["node_id"]] < 30 and 600 <= ages[silent["node_id"]] < 700


def test_jobs_are_counted_by_type_and_state(app, client):
    node = factories.enrolled_node(client)
    with app.app_context():
        for job_type, state in [
            ("artifact.acquire.v1", "queued"),
            ("artifact.acquire.v1", "queued"),
            ("artifact.acquire.v1", "failed"),
            ("runtime.benchmark.v1", "succeeded"),
        ]:
            db.session.add(Job(type=job_type, node_id=node["node_id"], params={}, state=state))
        db.session.commit()
    jobs = {(s.labels["type"], s.labels["state"]): s.value for s in scrape(client) if s.name == "modelforge_jobs"}
    assert jobs == {
        ("artifact.acquire.v1", "queued"): 2,
        ("artifact.acquire.v1", "failed"): 1,
        ("runtime.benchmark.v1", "succeeded"): 1,
    }


def test_deployments_are_counted_by_state_and_each_live_one_has_its_state(app, client):
    node = serving_node(client)
    artifact = acquired_artifact(client, node)
    for name, state in [("chat", "ready"), ("code", "loading"), ("old", "stopped")]:
        body = {"name": name, "artifact_id": artifact["id"], "model_file": "tiny.gguf"}
        created = client.post("/api/v1/admin/deployments", json=body, headers=ADMIN).get_json()
        with app.app_context():
            db.session.get(Deployment, created["id"]).state = state
            db.session.commit()
    samples = scrape(client)
    counts = {s.labels["state"]: s.value for s in samples if s.name == "modelforge_deployments"}
    # Every state is there, 0 too: a panel shows a count that dropped to none as 0, not as a gap.
    assert counts == {"pending": 0, "loading": 1, "ready": 1, "unloaded": 0, "failed": 0, "stopping": 0, "stopped": 1}
    live = {s.labels["deployment"]: s.labels["state"] for s in samples if s.name == "modelforge_deployment_state"}
    assert live == {"chat": "ready", "code": "loading"}  # a stopped one is history, not a series


def test_http_series_are_labelled_by_route_template_never_by_path_or_id(client):
    node = factories.enrolled_node(client)
    assert client.get(f"/api/v1/hardware/nodes/{node['node_id']}", headers=ADMIN).status_code == 200
    missing = str(uuid.uuid4())
    assert client.get(f"/api/v1/hardware/nodes/{missing}", headers=ADMIN).status_code == 404
    assert client.get(f"/no/such/page/{missing}").status_code in (302, 404)
    assert client.open("/healthz", method="BREW").status_code == 405
    samples = scrape(client)
    requests = {
        (s.labels["route"], s.labels["method"], s.labels["status"])
        for s in samples
        if s.name == "modelforge_http_requests_total"
    }
    assert ("/api/v1/hardware/nodes/<node_id>", "GET", "200") in requests
    assert ("/api/v1/hardware/nodes/<node_id>", "GET", "404") in requests
    assert ("<unmatched>", "other", "405") in requests  # a made-up method is not a label value
    assert ("<unmatched>", "GET", "404") in requests or ("<unmatched>", "GET", "302") in requests
    latency = [s for s in samples if s.name == "modelforge_http_request_duration_seconds_count"]
    assert any(s.labels["route"] == "/api/v1/hardware/nodes/<node_id>" for s in latency)
    http = [s for s in samples if s.name.startswith("modelforge_http_")]
    for sample in http:
        for value in sample.labels.values():
            assert node["node_id"] not in value and missing not in value and "/no/such" not in value


HOSTILE_NAMES = [
    'quote " backslash \\ newline \n end',
    "\u202eevil bidi\u202c and \u2066isolate\u2069",
    "tab\tbell\x07escape\x1b[31m",
    "x" * 5000,  # SQLite keeps it whole; PostgreSQL's varchar(200) cuts it (below)
    '} 1\nmodelforge_nodes{status="online"} 999',
]


def test_hostile_node_names_cannot_break_the_exposition(app, client):
    node_ids = []
    with app.app_context():
        longest = None if db.engine.dialect.name == "sqlite" else 200
        for name in HOSTILE_NAMES:  # written straight to the table, as an old row could hold them
            name = name[:longest]
            node_id = str(uuid.uuid4())
            node_ids.append(node_id)
            db.session.add(Node(id=node_id, display_name=name, hostname="h"))
            db.session.add(NodeLease(node_id=node_id, last_heartbeat_at=utcnow(), status="online"))
            db.session.flush()
            db.session.add(
                Gpu(node_id=node_id, uuid=f"GPU-{name[:40]}", name=name, first_seen_at=utcnow(), last_seen_at=utcnow())
            )
        db.session.flush()
        for gpu in db.session.scalars(sa.select(Gpu)):
            db.session.add(
                TelemetrySample(gpu_id=gpu.id, sampled_at=utcnow(), utilization_gpu_percent=float("nan"), power_w=50.0)
            )
        db.session.commit()
    samples = scrape(client)
    assert values(samples, "modelforge_nodes", status="online") == [len(HOSTILE_NAMES)]  # the injected 999 is a label
    names = {s.labels["node_id"]: s.labels["node_name"] for s in samples if s.name == "modelforge_node_status"}
    assert set(names) == set(node_ids)
    for name in names.values():  # bounded, and no control character (a newline would end the sample)
        assert len(name) <= collect.MAX_LABEL_LENGTH and not any(unicodedata.category(c) == "Cc" for c in name)
    # Quote and backslash escaped on the way out, intact on the way in; the newline made harmless.
    assert names[node_ids[0]] == 'quote " backslash \\ newline \ufffd end'
    assert names[node_ids[1]] == HOSTILE_NAMES[1]  # bidi controls are text, not structure
    assert len(values(samples, "modelforge_gpu_power_watts")) == len(HOSTILE_NAMES)
    assert values(samples, "modelforge_gpu_utilization_percent") == []  # NaN is no measurement


def test_a_label_is_encodable_printable_and_bounded_whatever_a_row_holds():
    assert collect.label("lone \ud800 surrogate") == "lone \ufffd surrogate"
    assert collect.label("nul\x00") == "nul\ufffd"
    assert collect.label(None) == ""
    assert len(collect.label("y" * 10_000)) == collect.MAX_LABEL_LENGTH
    assert collect.labels(node_name='a"b\\c\nd') == '{node_name="a\\"b\\\\c\ufffdd"}'


def test_sweep_durations_are_measured_by_the_scheduler_that_ran_them(app, client):
    work = lambda: {"done": 0}  # noqa: E731
    assert scheduler.run_if_due(app, "metrics-test-sweep", 1, work, "test:1")
    samples = scrape(client)
    assert values(samples, "modelforge_sweep_runs_total", sweep="metrics-test-sweep") == [1]
    assert values(samples, "modelforge_sweep_duration_seconds_count", sweep="metrics-test-sweep") == [1]
    (took,) = values(samples, "modelforge_sweep_last_duration_seconds", sweep="metrics-test-sweep")
    (total,) = values(samples, "modelforge_sweep_duration_seconds_sum", sweep="metrics-test-sweep")
    assert 0 <= took == total < 1
    (finished,) = values(samples, "modelforge_sweep_last_finished_timestamp_seconds", sweep="metrics-test-sweep")
    assert abs(finished - utcnow().timestamp()) < 60


def test_a_database_error_during_a_scrape_is_a_json_503_never_a_500(tmp_path):
    application = create_app(app_env(f"sqlite:///{tmp_path}/missing-dir/none.sqlite3", tmp_path))
    response = application.test_client().get("/metrics", headers=ADMIN)
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "DATABASE_UNAVAILABLE"
