"""The console speaks in words (C2, C5, V1): a populated console (nodes, a failed job, acceptance
evidence with fields missing, audit events holding None, False and []) renders no Python repr on any
page, shows times as `<time>` for the reader's time zone and sizes and rates in one set of units."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from app import audit
from app.console.formatting import audit_actor, audit_details, human_rate, plain, utc
from app.extensions import db
from tests.support.acceptance import inspect_text, publish
from tests.support.console import htmx_post
from tests.support.jobs import add_job, add_root, claim
from tests.support.nodes import agent, online_node

# What a Python value looks like when it reaches a page unformatted.
REPR = re.compile(r"\b(None|True|False)\b|\[\]|\{\}|\bb'|\bb\"|=None|=\[")


class _MainText(HTMLParser):
    """The text a reader sees inside <main>, less <pre> blocks (raw evidence, labelled as such)."""

    def __init__(self):
        super().__init__()
        self.depth = {"main": 0, "pre": 0, "script": 0}
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.depth:
            self.depth[tag] += 1

    def handle_endtag(self, tag):
        if tag in self.depth:
            self.depth[tag] -= 1

    def handle_data(self, data):
        if self.depth["main"] and not self.depth["pre"] and not self.depth["script"]:
            self.text.append(data)


def shown_text(html: str) -> str:
    if "<main" not in html:
        html = f"<main>{html}</main>"
    parser = _MainText()
    parser.feed(html)
    return " ".join(" ".join(parser.text).split())


def reprs(html: str) -> list[str]:
    text = shown_text(html)
    return [text[max(match.start() - 40, 0) : match.end() + 40] for match in REPR.finditer(text)]


@pytest.fixture
def populated(app, console):
    """A node with GPUs NVML reports and nvidia-smi does not, a container paste with its state left
    out, a failed job, and audit events whose details hold None, False and []."""
    node = online_node(console)
    publish(console, node, "a" * 32, smi_output="nvidia-smi: command not found")
    document = json.loads(inspect_text(hardened=False))
    document[0]["State"] = {"StartedAt": "2026-12-01T00:00:00Z"}  # no Status, no Running
    del document[0]["HostConfig"]["Privileged"]
    path = f"/hardware/nodes/{node['id']}/acceptance/container-status"
    response = htmx_post(console, path, data={"inspect": json.dumps(document)}, content_type="multipart/form-data")
    assert response.status_code == 200, response.get_data(as_text=True)
    root = add_root(console, node["id"]).get_json()
    job = add_job(console, node["id"], root["id"])
    assert claim(console, node).get_json()["job"]["id"] == job["id"]
    error = {"code": "HUB_REPO_NOT_FOUND", "message": "owner/tiny does not exist on the Hub"}
    assert agent(console, node, f"jobs/{job['id']}/fail", attempt=1, error=error, retryable=False).status_code == 200
    with app.app_context():
        audit.record(audit.OPERATOR, "node.updated", node["id"], previous=None, production_eligible=False, removed=[])
        audit.record(audit.agent_actor(node["id"]), "node.reported", node["id"], job_id=job["id"], flags={"a": True})
        db.session.commit()
    return {"node": node, "job": job}


def test_no_page_of_a_populated_console_shows_a_python_repr(console, populated):
    node_id = populated["node"]["id"]
    node_page = console.get(f"/hardware/nodes/{node_id}").get_data(as_text=True)
    # Every tab of the node page, whatever tabs there are.
    tabs = sorted(set(re.findall(rf'href="(/hardware/nodes/{node_id}(?:/[a-z-]+)?)"', node_page)))
    pages = [
        "/hardware/nodes",
        *tabs,
        f"/hardware/nodes/{node_id}/acceptance",
        "/jobs",
        f"/jobs/{populated['job']['id']}",
        "/audit",
        f"/audit?node={node_id}",
        "/settings",
        "/settings/api-keys",
        "/deployments",
        "/hardware/enroll",
    ]
    found = {}
    for path in pages:
        response = console.get(path)
        assert response.status_code == 200, path
        if hits := reprs(response.get_data(as_text=True)):
            found[path] = hits
    assert found == {}


def test_audit_details_and_actors_read_as_words_with_links(app, console, populated):
    node, job = populated["node"], populated["job"]
    html = console.get(f"/audit?node={node['id']}").get_data(as_text=True)
    text = shown_text(html)
    assert "previous: none" in text and "production eligible: no" in text and "removed: none" in text
    assert "flags: a: yes" in text
    assert f'href="/jobs/{job["id"]}"' in html, "a job id in the details links to the job"
    assert f"agent on {node['display_name']}" in text and f"agent:{node['id']}" not in text
    with app.test_request_context():
        assert audit_actor("system") == "ModelForge" and audit_actor("operator") == "operator"
        assert str(audit_details({})) == "—"
        details = str(audit_details({"expires_at": "2026-12-03T05:48:02.123456Z"}))
        assert '<time datetime="2026-12-03T05:48:02Z" data-local-time>2026-12-03 05:48:02 UTC</time>' in details


def test_a_gpu_only_nvml_reported_is_not_compared_never_agreed(console, populated):
    html = console.get(f"/hardware/nodes/{populated['node']['id']}/acceptance").get_data(as_text=True)
    compare = re.search(r'<table class="mf-table mf-gpu-compare".*?</table>', html, re.S)[0]
    assert "not compared" in compare and "✓</span> yes" not in compare
    assert "Only NVML reported this GPU." in compare
    assert " MiB<" not in compare or "GiB" not in compare, "one unit for memory in one table"


def test_a_container_paste_missing_fields_says_so_in_words(console, populated):
    html = console.get(f"/hardware/nodes/{populated['node']['id']}/acceptance").get_data(as_text=True)
    checks = shown_text(re.search(r'<ul class="mf-checks" data-testid="container-checks">.*?</ul>', html, re.S)[0])
    assert "no status reported" in checks and "status None" not in checks
    assert "writable root" in checks and "not reported" in checks


def test_words_for_values_times_and_rates():
    assert plain(None) == "none" and plain(False) == "no" and plain([]) == "none" and plain(b"GGUF") == "GGUF"
    assert plain(["a", 1, None]) == "a, 1, none" and plain({"dry_run": True}) == "dry run: yes"
    assert str(utc("2026-11-30T04:18:33.123456Z")) == (
        '<time datetime="2026-11-30T04:18:33Z" data-local-time>2026-11-30 04:18:33 UTC</time>'
    )
    assert utc(None) == "—"
    assert human_rate(2 * 2**20) == "2.0 MiB/s" and human_rate(512) == "512 B/s" and human_rate(None) == "—"
