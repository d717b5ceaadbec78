"""deploy/grafana/modelforge.json charts only series GET /metrics exports (O1)."""

from __future__ import annotations

import json
import re

from app import scheduler
from app.extensions import db
from app.metrics import inference
from app.models import Job
from tests.support import ADMIN, PROJECT_ROOT, factories
from tests.support.metrics import publish, scrape

DASHBOARD = PROJECT_ROOT / "deploy" / "grafana" / "modelforge.json"
METRIC = re.compile(r"\bmodelforge_[a-z0-9_]+\b")
# The label names a PromQL expression groups by or matches on: `by (a, b)` and `{a="…", b=~"…"}`.
GROUPED = re.compile(r"\bby \(([^)]*)\)")
MATCHED = re.compile(r"([a-z_]+)\s*=~?\s*\"")


def expressions(dashboard: dict) -> list[str]:
    """Every PromQL expression the dashboard runs: its panels' targets and its variables' queries."""
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


def test_the_dashboard_is_valid_json_with_unique_panels_on_one_prometheus_datasource():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] and dashboard["title"] == "ModelForge"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]


def test_every_expression_names_only_series_and_labels_that_metrics_exports(app, client):
    # Something of every family: a node with a sampled GPU, a job, a sweep run, API traffic.
    node = factories.enrolled_node(client)
    publish(client, node, [factories.gpu()], [factories.sample()])
    with app.app_context():
        db.session.add(Job(type="artifact.acquire.v1", node_id=node["node_id"], params={}, state="queued"))
        db.session.commit()
    assert scheduler.run_if_due(app, "liveness", 1, lambda: {}, "test:1")
    assert client.get("/api/v1/hardware/nodes", headers=ADMIN).status_code == 200
    # One answered request, counted as app/api/openai.py counts it (the e2e tier relays real ones).
    answered = inference.Tracked("tiny-chat")
    answered.see({"event": "token", "text": "Hi"})
    answered.see({"event": "finished", "usage": {"completion_tokens": 1}, "timings": {"tokens_per_second": 40.0}})
    samples = scrape(client)
    exported = {sample.name for sample in samples}
    labels = {name for sample in samples for name in sample.labels} | {"le"}

    checked = 0
    for expression in expressions(json.loads(DASHBOARD.read_text(encoding="utf-8"))):
        names = METRIC.findall(expression)
        assert names, f"{expression!r} charts no ModelForge series"
        for name in names:
            assert name in exported, f"{expression!r} names {name}, which GET /metrics does not export"
            checked += 1
        used = {label.strip() for group in GROUPED.findall(expression) for label in group.split(",")}
        used |= set(MATCHED.findall(expression))
        assert used <= labels, f"{expression!r} uses labels {sorted(used - labels)} no series has"
    assert checked >= 15
