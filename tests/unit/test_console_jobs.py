"""The console for what nodes do, through Flask's test client (J4, J1–J3, C1, C3, P5).

Every job's life here is driven by the real agent API (claim, progress, complete, fail), on SQLite
and on PostgreSQL; the console is used the way htmx uses it (CSRF in `X-CSRFToken`).
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from html import unescape

import pytest
import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError

from app import rules
from app.api import bodies
from app.console import forms
from app.console.formatting import eta, human_rate, short_commit
from app.console.jobs import Seen, measure
from app.extensions import db
from app.jobs import queue
from app.models import Job, StorageRoot
from app.timeutil import isoformat, parse_rfc3339, utcnow
from tests.support import ACQUIRE, ADMIN, factories
from tests.support.console import HTMX, htmx_post
from tests.support.nodes import online_node
from tests.support.runtime import acquired_artifact, serving_node

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HOST_PATH = "/mnt/cache/appdata/modelforge/model-registry"
CONTAINER_PATH = "/data/artifacts/model-registry"
MiB = 2**20


@pytest.fixture
def node(console):
    """An enrolled, online node whose agent advertises artifact.acquire.v1."""
    return online_node(console, capabilities=[ACQUIRE])


def register_root(console, node_id: str, **fields: str):
    """The node page's register-root form, as htmx posts it."""
    data = {
        "name": "models",
        "host_path": HOST_PATH,
        "container_path": CONTAINER_PATH,
        "min_free": "10",
        "min_free_unit": "GiB",
        **fields,
    }
    return htmx_post(console, f"/hardware/nodes/{node_id}/storage-roots", data=data)


def roots_of(console, node_id: str) -> list[dict]:
    return console.get(f"/api/v1/admin/nodes/{node_id}/storage-roots", headers=ADMIN).get_json()["storage_roots"]


def a_root(console, node_id: str, **fields: str) -> dict:
    assert register_root(console, node_id, **fields).status_code == 201
    return next(root for root in roots_of(console, node_id) if root["name"] == fields.get("name", "models"))


def acquire(console, node_id: str, root_id: str, **fields: str):
    """The node page's acquire form, as htmx posts it."""
    data = {"repo_id": "owner/tiny", "revision": "main", "repo_type": "model", "storage_root_id": root_id, **fields}
    return htmx_post(console, f"/hardware/nodes/{node_id}/acquire", data=data)


def a_job(console, node_id: str, root_id: str, **fields: str) -> str:
    response = acquire(console, node_id, root_id, **fields)
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.headers["HX-Redirect"].rsplit("/", 1)[1]


def agent(console, node, path: str, **body):
    return console.post(f"/api/v1/agent/{path}", json={**factories.versions(), **body}, headers=node["auth"])


def claim(console, node) -> dict:
    response = agent(console, node, "jobs/claim", capabilities=[ACQUIRE])
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["job"]


def report(console, node, job_id: str, attempt: int = 1, **progress):
    response = agent(console, node, f"jobs/{job_id}/progress", attempt=attempt, progress=progress)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def api_job(console, job_id: str) -> dict:
    return console.get(f"/api/v1/admin/jobs/{job_id}", headers=ADMIN).get_json()


def job_count(app) -> int:
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(Job))


def fragment(console, path: str) -> str:
    response = console.get(path, headers=HTMX)
    assert response.status_code == 200, response.get_data(as_text=True)
    html = response.get_data(as_text=True)
    assert "<html" not in html
    return html


def progress_value(html: str) -> float | None:
    match = re.search(r'role="progressbar"[^>]*?aria-valuenow="([0-9.]+)"', html, re.S)
    return float(match.group(1)) if match else None


# --------------------------------------------------------------------------- jobs page


def test_the_jobs_page_lists_filters_and_polls_only_while_a_job_is_live(console, node):
    root = a_root(console, node["id"])
    first = a_job(console, node["id"], root["id"], repo_id="owner/first", revision="v1.0")
    second = a_job(console, node["id"], root["id"], repo_id="owner/second")
    page = console.get("/jobs")
    assert page.status_code == 200 and "HX-Request" in page.headers["Vary"]
    html = page.get_data(as_text=True)
    assert "<html" in html and 'aria-current="page">Jobs</a>' in html
    table = fragment(console, "/jobs")
    assert 'id="jobs-table"' in table and 'hx-trigger="every 5s"' in table and 'data-polling="true"' in table
    assert table.index(second) < table.index(first)  # newest first
    row = table.split(f'data-job-id="{first}"')[1].split("</tr>")[0]
    for fact in ("queued", ACQUIRE, "GPU Node", "owner/first", "@ v1.0", " UTC"):
        assert fact in row, fact
    assert "of 3" not in row and 'data-testid="job-reason"' not in row  # a first attempt, nothing wrong: no words

    htmx_post(console, f"/jobs/{first}/cancel")
    cancelled = fragment(console, "/jobs?state=cancelled")
    assert first in cancelled and second not in cancelled
    assert "hx-trigger" not in cancelled and 'data-polling="false"' in cancelled  # nothing live: no poll
    queued = fragment(console, f"/jobs?state=queued&type={ACQUIRE}&node={node['id']}")
    assert second in queued and first not in queued
    assert f'hx-get="/jobs?node={node["id"]}&amp;type={ACQUIRE}&amp;state=queued"' in queued  # the poll keeps filters
    other = online_node(console, hostname="other-node", capabilities=[ACQUIRE])
    assert "No job matches this filter." in fragment(console, f"/jobs?node={other['id']}")


@pytest.mark.parametrize("query", ["state=done", "type=x", "node=nobody", "state=%00", "before=not-a-job"])
def test_the_jobs_page_refuses_a_bad_filter_with_a_message(console, query):
    response = console.get(f"/jobs?{query}")
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert "Pick a value from the list." in html or "Not a page marker." in html


def test_the_jobs_page_pages_by_the_last_job_shown(app, console, node):
    root = a_root(console, node["id"])
    ids = [a_job(console, node["id"], root["id"], repo_id=f"owner/m{i}") for i in range(queue.PAGE_SIZE + 2)]
    first = fragment(console, "/jobs")
    assert re.findall(r'data-job-id="([^"]+)"', first) == ids[::-1][: queue.PAGE_SIZE]
    older = unescape(re.search(r'href="([^"]+)" data-testid="older"', first).group(1))
    assert older == f"/jobs?before={ids[2]}"
    rest = fragment(console, older)
    assert re.findall(r'data-job-id="([^"]+)"', rest) == [ids[1], ids[0]]
    assert 'data-testid="older"' not in rest and "← Newest" in rest


# --------------------------------------------------------------------------- one job, live


def test_the_job_page_polls_while_the_job_runs_shows_progress_and_stops_when_it_ends(console, node):
    root = a_root(console, node["id"])
    job_id = a_job(console, node["id"], root["id"])
    page = console.get(f"/jobs/{job_id}")
    assert page.status_code == 200 and "<html" in page.get_data(as_text=True)
    queued = fragment(console, f"/jobs/{job_id}")
    assert 'id="job-live"' in queued and 'hx-trigger="every 2s"' in queued and 'data-state="queued"' in queued
    assert progress_value(queued) is None and "size not known yet" in queued
    assert "Cancel job" in queued and "Retry job" not in queued

    assert claim(console, node)["id"] == job_id
    report(console, node, job_id, bytes_done=10 * MiB, bytes_total=40 * MiB, files_done=1, files_total=3)
    running = fragment(console, f"/jobs/{job_id}")
    assert 'hx-trigger="every 2s"' in running and 'data-state="running"' in running
    assert progress_value(running) == 25.0
    assert "10.0 MiB of 40.0 MiB" in running and "1 of 3 files" in running
    assert "measuring rate…" in running  # one report: no rate yet
    assert 'data-testid="job-attempts"' not in running and "Lease expires" in running  # the first attempt
    # The poll URL carries the report it showed; the next report gives the rate between the two.
    poll = unescape(re.search(r'hx-get="([^"]+)"', running).group(1))
    reported_at = api_job(console, job_id)["progress"]["updated_at"]
    assert f"seen_bytes={10 * MiB}" in poll and "seen_at=" in poll
    earlier = isoformat(parse_rfc3339(reported_at) - timedelta(seconds=5))
    measured = fragment(console, f"/jobs/{job_id}?seen_bytes=0&seen_at={earlier}")
    assert "2.0 MiB/s" in measured  # 10 MiB in 5 s, in the units sizes are shown in
    assert "about 15 s left" in measured  # 30 MiB to go at that rate

    final = f"{CONTAINER_PATH}/models/owner/tiny/{COMMIT}"
    result = {"commit": COMMIT, "container_path": final, "files": 3, "total_bytes": 40 * MiB}
    assert agent(console, node, f"jobs/{job_id}/complete", attempt=1, result=result).status_code == 200
    done = fragment(console, poll)
    assert 'data-state="succeeded"' in done and 'data-polling="false"' in done
    assert "hx-trigger" not in done and "hx-get" not in done  # rendered without its trigger: polling stops
    assert progress_value(done) == 100.0
    assert f"{HOST_PATH}/models/owner/tiny/{COMMIT}" in done and final in done
    assert COMMIT in done and 'data-testid="artifact-link"' in done
    assert "Cancel job" not in done and "Retry job" not in done


def test_the_rate_is_measured_between_successive_reports():
    job = Job(state="running", progress={"bytes_done": 300, "bytes_total": 1000, "files_done": 0})
    at = utcnow()
    job.progress["updated_at"] = isoformat(at)
    view, carried = measure(job, None)
    assert (view.percent, view.rate, view.eta_seconds) == (30.0, None, None)
    assert carried == Seen(300, parse_rfc3339(isoformat(at)), None)
    view, carried = measure(job, Seen(100, at - timedelta(seconds=2), None))
    assert (view.rate, view.eta_seconds) == (100.0, 7.0)
    same, again = measure(job, carried)  # no new report since: the rate it had stays
    assert same.rate == 100.0 and again == carried
    restarted, _ = measure(job, Seen(900, at - timedelta(seconds=2), 50.0))  # a new attempt began lower
    assert restarted.rate is None


def test_cancel_and_retry_from_the_job_page(app, console, node):
    root = a_root(console, node["id"])
    job_id = a_job(console, node["id"], root["id"])
    path = f"/jobs/{job_id}"
    for action in ("cancel", "retry"):  # C1: no token, no change
        assert console.post(f"{path}/{action}", headers=HTMX).status_code == 400
        assert console.post(f"{path}/{action}", headers={**HTMX, "X-CSRFToken": "forged"}).status_code == 400
    assert api_job(console, job_id)["state"] == "queued"

    cancelled = htmx_post(console, f"{path}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.headers["HX-Retarget"] == "#job-live" and cancelled.headers["HX-Reswap"] == "outerHTML"
    html = cancelled.get_data(as_text=True)
    assert 'data-state="cancelled"' in html and "Retry job" in html and "hx-trigger" not in html
    assert 'id="job-notice"' in html and 'hx-swap-oob="true"' in html  # an old refusal is cleared
    assert api_job(console, job_id)["state"] == "cancelled"

    refused = htmx_post(console, f"{path}/cancel")  # the error handlers answer; the panel stays
    assert refused.status_code == 409 and "HX-Retarget" not in refused.headers
    assert "JOB_FINISHED" in refused.get_data(as_text=True) and "already cancelled" in refused.get_data(as_text=True)

    retried = htmx_post(console, f"{path}/retry")
    assert retried.status_code == 200 and 'data-state="queued"' in retried.get_data(as_text=True)
    assert 'hx-trigger="every 2s"' in retried.get_data(as_text=True)
    assert htmx_post(console, f"{path}/retry").status_code == 409

    assert claim(console, node)["attempt"] == 1
    asked = htmx_post(console, f"{path}/cancel").get_data(as_text=True)
    assert 'data-state="running"' in asked and "stopping…" in asked and "Cancel job" not in asked
    assert report(console, node, job_id, bytes_done=1, files_done=0)["cancel_requested"] is True
    error = {"code": "JOB_CANCELLED", "message": "stopped on request"}
    agent(console, node, f"jobs/{job_id}/fail", attempt=1, error=error, retryable=False)
    ended = fragment(console, path)
    assert 'data-state="cancelled"' in ended and "hx-trigger" not in ended
    assert "Cancelled by the operator while it ran." in ended and 'data-testid="job-cancelled"' in ended
    assert 'class="mf-error"' not in ended and 'data-testid="job-error"' not in ended  # neutral, not an error

    plain = console.post(f"{path}/retry", headers={"X-CSRFToken": console.csrf})  # outside htmx
    assert plain.status_code == 303 and plain.headers["Location"] == path


@pytest.mark.parametrize("path", ["/jobs/%00", "/jobs/not-a-uuid", "/jobs/0b9cbbd8-0000-4000-8000-000000000000"])
def test_an_unknown_job_is_an_html_404(console, path):
    for headers in ({}, HTMX):
        response = console.get(path, headers=headers)
        assert response.status_code == 404 and "JOB_NOT_FOUND" in response.get_data(as_text=True)
    assert htmx_post(console, path + "/cancel").status_code == 404


# --------------------------------------------------------------------------- acquire


def test_the_acquire_form_queues_the_job_the_api_would(app, console, node):
    root = a_root(console, node["id"])
    response = acquire(
        console,
        node["id"],
        root["id"],
        repo_id=" owner/tiny-GGUF ",
        revision="refs/pr/1",
        repo_type="dataset",
        allow_patterns="*.gguf\n\n  config.json  \n",
    )
    assert response.status_code == 201
    job_id = response.headers["HX-Redirect"].removeprefix("/jobs/")
    created = api_job(console, job_id)
    assert (created["type"], created["node_id"], created["state"], created["max_attempts"]) == (
        ACQUIRE,
        node["id"],
        "queued",
        3,
    )
    assert created["params"] == {
        "repo_id": "owner/tiny-GGUF",
        "revision": "refs/pr/1",
        "repo_type": "dataset",
        "storage_root_id": root["id"],
        "allow_patterns": ["*.gguf", "config.json"],
        "ignore_patterns": None,
    }
    # the same request through the API stores the same shape of params
    body = {"type": ACQUIRE, "node_id": node["id"], "params": {**created["params"], "repo_id": "owner/other"}}
    through_api = console.post("/api/v1/admin/jobs", json=body, headers=ADMIN).get_json()
    assert through_api["params"].keys() == created["params"].keys()
    leased = claim(console, node)
    assert leased["params"]["container_path"] == CONTAINER_PATH  # the agent gets the root resolved
    plain = console.post(
        f"/hardware/nodes/{node['id']}/acquire",
        data={"repo_id": "owner/x", "revision": "main", "repo_type": "model", "storage_root_id": root["id"]},
        headers={"X-CSRFToken": console.csrf},
    )
    assert plain.status_code == 303 and plain.headers["Location"].startswith("/jobs/")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"repo_id": "no-owner"}, "Write the repository as owner/name"),
        ({"repo_id": "owner/name/extra"}, "Write the repository as owner/name"),
        ({"repo_id": "owner/<script>"}, "Write the repository as owner/name"),
        ({"repo_id": ""}, "Name the repository as owner/name."),
        ({"repo_id": "o/" + "n" * 95}, "Field cannot be longer than 96 characters."),
        ({"revision": "main branch"}, "A branch, tag or commit"),
        ({"revision": ""}, "Name a branch, tag or commit"),
        ({"repo_type": "space"}, "Not a valid choice."),
        ({"allow_patterns": "ok\n" + "x" * 201}, "Line 2: a pattern is up to 200 printable characters."),
        ({"ignore_patterns": "a\u202eb"}, "Line 1: a pattern is up to 200 printable characters."),
        ({"ignore_patterns": "\n".join(f"p{i}" for i in range(65))}, "At most 64 patterns."),
        ({"storage_root_id": "0b9cbbd8-0000-4000-8000-000000000000"}, "Pick one of this node's storage roots."),
    ],
)
def test_the_acquire_form_refuses_bad_input_clearly_and_creates_nothing(app, console, node, fields, message):
    root = a_root(console, node["id"])
    response = acquire(console, node["id"], root["id"], **fields)
    assert response.status_code == 422 and "HX-Redirect" not in response.headers
    html = response.get_data(as_text=True)
    assert 'id="node-acquire"' in html and message in unescape(html)
    assert job_count(app) == 0


def test_a_root_of_another_node_is_refused_by_name(app, console, node):
    a_root(console, node["id"])
    other = online_node(console, hostname="other-node", capabilities=[ACQUIRE])
    foreign = a_root(console, other["id"], name="theirs")
    response = acquire(console, node["id"], foreign["id"])
    assert response.status_code == 422
    assert "Pick one of this node&#39;s storage roots." in response.get_data(as_text=True)
    assert job_count(app) == 0


def test_without_a_root_the_node_page_asks_for_one_first(console, node):
    html = console.get(f"/hardware/nodes/{node['id']}/storage").get_data(as_text=True)
    assert "Register a storage root first" in html and 'name="repo_id"' not in html
    assert "No storage roots yet" in html and "No artifacts on this node yet." in html


# --------------------------------------------------------------------------- storage roots


def test_register_a_root_in_gib_or_mib_and_the_page_shows_both_paths(app, console, node):
    response = register_root(console, node["id"], min_free="1.5", min_free_unit="GiB", host_path=HOST_PATH + "/")
    assert response.status_code == 201
    assert response.headers["HX-Trigger"] == "storage-roots-changed"  # the roots and acquire panels refetch
    html = response.get_data(as_text=True)
    assert 'id="storage-root-form"' in html and "Storage root models registered" in html
    assert 'value="models"' not in html  # the form comes back empty
    (root,) = roots_of(console, node["id"])
    assert (root["host_path"], root["container_path"], root["min_free_bytes"]) == (
        HOST_PATH,
        CONTAINER_PATH,
        3 * 2**29,
    )
    assert register_root(console, node["id"], name="small", min_free="512", min_free_unit="MiB").status_code == 201
    assert {r["name"]: r["min_free_bytes"] for r in roots_of(console, node["id"])}["small"] == 512 * MiB

    roots = fragment(console, f"/hardware/nodes/{node['id']}/storage-roots")
    assert 'id="node-roots"' in roots and "storage-roots-changed from:body" in roots
    row = roots.split(f'data-root-id="{root["id"]}"')[1].split("</tr>")[0]
    assert f"<code>{HOST_PATH}</code>" in row and f"<code>{CONTAINER_PATH}</code>" in row
    assert "1.5 GiB" in row and "not yet observed" in row
    acquire_panel = fragment(console, f"/hardware/nodes/{node['id']}/acquire")
    assert f'value="{root["id"]}"' in acquire_panel and "models — /data/artifacts/model-registry" in acquire_panel
    page = console.get(f"/hardware/nodes/{node['id']}/storage").get_data(as_text=True)
    assert HOST_PATH in page and CONTAINER_PATH in page and 'id="node-acquire"' in page
    outside = console.get(f"/hardware/nodes/{node['id']}/storage-roots")
    assert outside.status_code == 302 and outside.headers["Location"].endswith("/storage")  # outside htmx: the tab


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        ({"name": "has space"}, 422, "Up to 63 letters, digits"),
        ({"name": ""}, 422, "Name the root"),
        ({"host_path": "relative/path"}, 422, "Write an absolute path, starting with /."),
        ({"container_path": "/data/artifacts/../../etc"}, 422, "without empty, . or .. parts"),
        ({"container_path": "/data//artifacts"}, 422, "without empty, . or .. parts"),
        ({"host_path": "/mnt/\u200buser"}, 422, "Use printable characters only."),
        ({"min_free": "-1"}, 422, "Write a size of 0 or more."),
        ({"min_free": "NaN"}, 422, "Write a size of 0 or more."),
        ({"min_free": "ten"}, 422, "Not a valid decimal value."),
        ({"min_free": "9999999999"}, 422, "more space than any disk holds"),
    ],
)
def test_a_bad_root_is_refused_by_field_and_nothing_is_stored(console, node, fields, status, message):
    response = register_root(console, node["id"], **fields)
    assert response.status_code == status and "HX-Trigger" not in response.headers
    assert message in unescape(response.get_data(as_text=True))
    assert roots_of(console, node["id"]) == []


def test_outside_htmx_the_forms_answer_on_the_node_page(console, node):
    path = f"/hardware/nodes/{node['id']}"
    tab = f"{path}/storage"  # the tab the forms are on
    plain = {"X-CSRFToken": console.csrf}
    fields = {"name": "models", "host_path": HOST_PATH, "container_path": CONTAINER_PATH, "min_free": "0"}
    refused = console.post(f"{path}/storage-roots", data={**fields, "name": "bad name"}, headers=plain)
    assert refused.status_code == 303 and refused.headers["Location"] == tab
    assert "Name: Up to 63 letters" in console.get(tab).get_data(as_text=True)  # said once, then gone
    assert "Name: Up to 63 letters" not in console.get(tab).get_data(as_text=True)
    assert roots_of(console, node["id"]) == []
    assert console.post(f"{path}/storage-roots", data=fields, headers=plain).status_code == 303
    assert "Storage root models registered" in console.get(tab).get_data(as_text=True)
    (root,) = roots_of(console, node["id"])
    refused = console.post(f"{path}/acquire", data={"repo_id": "x", "storage_root_id": root["id"]}, headers=plain)
    assert refused.status_code == 303 and "Repository: Write the repository as owner/name" in unescape(
        console.get(tab).get_data(as_text=True)
    )
    deleted = console.post(f"{path}/storage-roots/{root['id']}/delete", headers=plain)
    assert deleted.status_code == 303 and "Storage root models deleted" in console.get(tab).get_data(as_text=True)


def test_a_second_root_of_the_same_name_is_a_clear_409(console, node):
    a_root(console, node["id"])
    response = register_root(console, node["id"], host_path="/mnt/other")
    assert response.status_code == 409
    assert "This node already has a storage root named &#39;models&#39;." in response.get_data(as_text=True)
    assert len(roots_of(console, node["id"])) == 1


def test_a_root_in_use_is_not_deleted_and_says_why(app, console, node):
    root = a_root(console, node["id"])
    job_id = a_job(console, node["id"], root["id"])
    path = f"/hardware/nodes/{node['id']}/storage-roots/{root['id']}/delete"
    assert console.post(path, headers=HTMX).status_code == 400  # no CSRF token: nothing happens
    refused = htmx_post(console, path)
    assert refused.status_code == 409 and "HX-Trigger" not in refused.headers
    html = refused.get_data(as_text=True)
    assert "STORAGE_ROOT_IN_USE" in html and "1 queued or running job(s) use this storage root." in html
    assert "<html" not in html  # a fragment for #storage-notice
    assert len(roots_of(console, node["id"])) == 1

    htmx_post(console, f"/jobs/{job_id}/cancel")
    deleted = htmx_post(console, path)
    assert deleted.status_code == 200 and deleted.headers["HX-Trigger"] == "storage-roots-changed"
    assert "Storage root models deleted; its files stay on the node." in deleted.get_data(as_text=True)
    assert roots_of(console, node["id"]) == []
    job_page = fragment(console, f"/jobs/{job_id}")
    assert "deleted since" in job_page  # the job's history stays


def test_a_root_is_deleted_only_through_its_own_node(console, node):
    root = a_root(console, node["id"])
    other = online_node(console, hostname="other-node", capabilities=[ACQUIRE])
    for path in (
        f"/hardware/nodes/{other['id']}/storage-roots/{root['id']}/delete",
        f"/hardware/nodes/{node['id']}/storage-roots/%00/delete",
        f"/hardware/nodes/{node['id']}/storage-roots/0b9cbbd8-0000-4000-8000-000000000000/delete",
    ):
        response = htmx_post(console, path)
        assert response.status_code == 404 and "STORAGE_ROOT_NOT_FOUND" in response.get_data(as_text=True)
    assert len(roots_of(console, node["id"])) == 1


# --------------------------------------------------------------------------- node page: observed, artifacts


def test_the_node_page_shows_what_the_agent_observed_and_the_artifacts_it_holds(console, node):
    root = a_root(console, node["id"])
    a_root(console, node["id"], name="empty", container_path="/data/artifacts/empty")
    etag = console.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=node["auth"]).get_json()
    seen = {
        "id": root["id"],
        "exists": True,
        "writable": True,
        "free_bytes": 5 * 2**30,
        "total_bytes": 1000 * 2**30,
        "observed_at": isoformat(utcnow()),
    }
    body = factories.heartbeat_body(storage_roots_etag=etag["storage_roots_etag"], storage_roots=[seen])
    assert console.post("/api/v1/agent/heartbeat", json=body, headers=node["auth"]).status_code == 200
    job_id = a_job(console, node["id"], root["id"], revision="v2")
    claim(console, node)
    final = f"{CONTAINER_PATH}/models/owner/tiny/{COMMIT}"
    result = {"commit": COMMIT, "container_path": final, "files": 4, "total_bytes": 3 * MiB}
    assert agent(console, node, f"jobs/{job_id}/complete", attempt=1, result=result).status_code == 200

    html = console.get(f"/hardware/nodes/{node['id']}/storage").get_data(as_text=True)
    roots = html.split('id="node-roots"')[1].split("</table>")[0]
    observed = roots.split(f'data-root-id="{root["id"]}"')[1].split("</tr>")[0]
    assert "exists" in observed and "writable" in observed and "5.0 GiB free of 1000.0 GiB" in observed
    assert "below the guard" in observed and " UTC" in observed  # 5 GiB free, 10 GiB to keep
    assert "not yet observed" in roots
    artifacts = fragment(console, f"/hardware/nodes/{node['id']}/artifacts")
    assert 'id="node-artifacts"' in artifacts and 'hx-trigger="every 10s"' in artifacts
    row = artifacts.split("data-artifact-id=")[1].split("</tr>")[0]
    for fact in ("owner/tiny", "v2 →", COMMIT[:7], f'title="{COMMIT}"', "3.0 MiB", f"/jobs/{job_id}", final):
        assert fact in row, fact
    assert f"{HOST_PATH}/models/owner/tiny/{COMMIT}" in row
    assert f"/hardware/nodes/{node['id']}/storage#artifact-" in fragment(console, f"/jobs/{job_id}")


# --------------------------------------------------------------------------- P5: hostile text


def test_hostile_text_in_params_and_errors_is_escaped(console, node):
    root = a_root(console, node["id"])
    hostile = "<script>alert(1)</script>"
    job_id = a_job(console, node["id"], root["id"], allow_patterns=hostile, ignore_patterns='"><img src=x>')
    claim(console, node)
    error = {"code": "HUB_REPO_NOT_FOUND", "message": "<img src=x onerror=alert(2)>"}
    agent(console, node, f"jobs/{job_id}/fail", attempt=1, error=error, retryable=False)
    for html in (console.get(f"/jobs/{job_id}").get_data(as_text=True), fragment(console, "/jobs")):
        assert "<script>alert" not in html and "<img src=x" not in html
    page = console.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&#34;&gt;&lt;img src=x&gt;" in page


# --------------------------------------------------------------------------- rules and formatting


SAMPLES = {
    "repo_id": [
        "owner/name",
        "a/b",
        "o-1/n.2_3",
        "owner",
        "owner/",
        "/name",
        ".o/n",
        "o/n/x",
        "o/n\n",
        "o /n",
        "o/" + "n" * 94,
    ],
    "revision": ["main", "refs/pr/1", "v1.0", "a" * 40, "", "main branch", "x" * 201, "tag\n", "é"],
    "name": ["models", "a", "m.o-d_1", "has space", ".hidden", "-x", "x" * 63, "x" * 64, "ok\n"],
    "path": [
        "/a",
        "/a/",
        "/data/artifacts/x",
        "/",
        "a",
        "/a//b",
        "/a/./b",
        "/a/../b",
        "/a/..b",
        "/.x",
        "/a\u200bb",
        "/" + "p" * 999,
    ],
}


def _api_accepts(field: str, value: str) -> bool:
    adapters = {
        "repo_id": TypeAdapter(bodies.RepoId),
        "revision": TypeAdapter(bodies.Revision),
        "path": TypeAdapter(bodies.AbsolutePath),
    }
    try:
        if field == "name":
            bodies.StorageRootCreate(name=value, host_path="/a", container_path="/b", min_free_bytes=0)
        else:
            adapters[field].validate_python(value)
    except ValidationError:
        return False
    return True


def _console_accepts(field: str, value: str) -> bool:
    if field == "path":
        return rules.absolute_path_problem(value) is None
    pattern, limit = {
        "repo_id": (rules.REPO_ID_PATTERN, rules.MAX_REPO_ID_LENGTH),
        "revision": (rules.REVISION_PATTERN, rules.MAX_REVISION_LENGTH),
        "name": (rules.ROOT_NAME_PATTERN, 63),
    }[field]
    return bool(value) and len(value) <= limit and re.fullmatch(pattern, value) is not None


@pytest.mark.parametrize(("field", "value"), [(field, value) for field, values in SAMPLES.items() for value in values])
def test_the_console_refuses_exactly_what_the_api_refuses(field, value):
    """One rule (app/rules.py), two engines: the console's Python `re` and the API's pydantic (Rust) agree."""
    assert _console_accepts(field, value) == _api_accepts(field, value)


def test_sizes_rates_and_times_read_at_a_glance():
    assert human_rate(2_097_152) == "2.0 MiB/s" and human_rate(5_000) == "4.9 KiB/s" and human_rate(None) == "—"
    assert eta(14.2) == "about 15 s" and eta(600) == "about 10 min" and eta(None) == "—"
    assert short_commit(COMMIT) == "0123456" and short_commit(None) == "—"
    form_bytes = Decimal("1.5") * forms.SIZE_UNITS["GiB"]
    assert int(form_bytes) == 3 * 2**29


def test_nothing_in_the_console_changes_a_root_of_an_unknown_node(app, console):
    response = register_root(console, "0b9cbbd8-0000-4000-8000-000000000000")
    assert response.status_code == 404 and "NODE_NOT_FOUND" in response.get_data(as_text=True)
    with app.app_context():
        assert db.session.scalar(sa.select(sa.func.count()).select_from(StorageRoot)) == 0


def test_an_artifact_is_deleted_from_the_node_page_behind_a_confirmation_and_refused_while_deployed(console):
    """J5: the artifacts table's Delete asks first, names what holds an artifact in use, and shows
    the delete job while it runs."""
    node = serving_node(console)
    artifact = acquired_artifact(console, node)
    page = console.get(f"/hardware/nodes/{node['id']}/storage").get_data(as_text=True)
    assert "Its files (" in page and "are removed from the disk" in page  # the hx-confirm
    body = {"name": "held", "artifact_id": artifact["id"], "model_file": "tiny.gguf"}
    assert console.post("/api/v1/admin/deployments", json=body, headers=ADMIN).status_code == 201
    path = f"/hardware/nodes/{node['id']}/artifacts/{artifact['id']}/delete"
    assert console.post(path, headers=HTMX).status_code == 400  # no CSRF token: nothing happens
    refused = htmx_post(console, path)
    assert refused.status_code == 409
    html = refused.get_data(as_text=True)
    assert "ARTIFACT_IN_USE" in html and "deployment held" in html and "<html" not in html

    deployment = console.get("/api/v1/admin/deployments", headers=ADMIN).get_json()["deployments"][0]
    console.delete(f"/api/v1/admin/deployments/{deployment['id']}", headers=ADMIN)
    console.post(
        f"/api/v1/agent/deployments/{deployment['id']}/status",
        json={**factories.versions(), "state": "stopped", "error": None, "measured": None},
        headers=node["auth"],
    )
    deleting = htmx_post(console, path)
    assert deleting.status_code == 200
    assert 'data-testid="artifact-deleting"' in deleting.get_data(as_text=True)
    other = htmx_post(console, f"/hardware/nodes/{node['id']}/artifacts/00000000-0000-4000-8000-000000000000/delete")
    assert other.status_code == 404
