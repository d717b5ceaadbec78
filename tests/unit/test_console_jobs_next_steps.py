"""What a job page says and offers (J2, J4, issue 25): a human title, attempts only when they tell
something, params by name, why a job failed in the list, Retry only where another attempt can help
and otherwise the form that can, an operator's cancel in neutral words.

Each job's life is driven by the real agent API (claim, progress, fail, complete) through Flask's
test client, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import re
from html import unescape

import pytest

from app.console import job_words
from app.jobs import failures, queue
from app.jobs.failures import Remedy
from tests.support import ACQUIRE, ADMIN, EVERY_TYPE
from tests.support.console import HTMX, htmx_post
from tests.support.jobs import add_job, add_root, claim
from tests.support.nodes import agent, online_node
from tests.support.runtime import acquired_artifact, benchmark_result, create, worker


@pytest.fixture
def node(console):
    return online_node(console, capabilities=EVERY_TYPE, runtime_worker=worker())


@pytest.fixture
def root(console, node):
    response = add_root(console, node["id"], min_free_bytes=0)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def job_page(console, job_id: str) -> str:
    response = console.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.get_data(as_text=True)[:2000]
    return unescape(response.get_data(as_text=True))


def jobs_row(console, job_id: str) -> str:
    html = unescape(console.get("/jobs", headers=HTMX).get_data(as_text=True))
    return html.split(f'data-job-id="{job_id}"')[1].split("</tr>")[0]


def fail(console, node, job_id: str, code: str, message: str, retryable: bool = False, attempt: int = 1):
    error = {"code": code, "message": message}
    response = agent(console, node, f"jobs/{job_id}/fail", attempt=attempt, error=error, retryable=retryable)
    assert response.status_code == 200, response.get_json()


def failed_acquire(console, node, root, code: str, message: str, **params) -> str:
    job = add_job(console, node["id"], root["id"], **params)
    assert claim(console, node).get_json()["job"]["id"] == job["id"]
    fail(console, node, job["id"], code, message)
    return job["id"]


def retry_button(html: str) -> str | None:
    match = re.search(r'<button class="([^"]+)"[^>]*data-testid="job-retry"', html)
    return match.group(1) if match else None


# --------------------------------------------------------------------------- Retry only where it can help


def test_a_repository_typo_offers_no_retry_but_the_form_to_fix_it_and_the_list_says_why(console, node, root):
    job_id = failed_acquire(
        console, node, root, "HUB_REPO_NOT_FOUND", "owner/tinny: no such repository (HTTP 404)", repo_id="owner/tinny"
    )
    html = job_page(console, job_id)
    assert "Retry job" not in html and retry_button(html) is None
    fix = re.search(r'<a class="mf-button" href="([^"]+)" data-testid="job-fix">([^<]+)</a>', html)
    assert fix and fix.groups() == (
        f"/hardware/nodes/{node['id']}/storage#node-acquire",
        "Fix the repository name and acquire again →",
    )
    assert "Retrying would fail the same way" in html
    assert "Failed: repository not found" in html and "owner/tinny: no such repository (HTTP 404)" in html

    row = jobs_row(console, job_id)
    assert re.search(r'data-testid="job-reason">repository not found<', row)
    assert f'">Download</a><br><code class="mf-small">{ACQUIRE}</code>' in row  # what it does, its type beside
    jobs = unescape(console.get("/jobs").get_data(as_text=True))
    assert f'<option value="{ACQUIRE}">Download ({ACQUIRE})</option>' in jobs
    # J2: the retry itself stays what the API offers (a failed job as a new attempt); the page no longer offers it.
    assert htmx_post(console, f"/jobs/{job_id}/retry").status_code == 200


@pytest.mark.parametrize(
    ("code", "section", "words"),
    [
        (
            "STORAGE_ROOT_UNAVAILABLE",
            "storage#node-roots",
            "Fix the storage root (or register another) and acquire again",
        ),
        ("HUB_REVISION_NOT_FOUND", "storage#node-acquire", "Fix the revision and acquire again"),
        ("JOB_PARAMS_INVALID", "storage#node-acquire", "Change the job's settings and start it again"),
    ],
)
def test_an_unusable_root_or_bad_params_point_at_what_to_change(console, node, root, code, section, words):
    job_id = failed_acquire(console, node, root, code, "refused")
    html = job_page(console, job_id)
    assert retry_button(html) is None
    assert f'href="/hardware/nodes/{node["id"]}/{section}" data-testid="job-fix">{words} →</a>' in html


def test_a_file_that_is_not_a_gguf_model_sends_the_operator_to_pick_another(console, node):
    artifact = acquired_artifact(console, node)
    job = create(console, queue.BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"})
    job_id = job.get_json()["id"]
    assert agent(console, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]["id"] == job_id
    fail(console, node, job_id, "MODEL_LOAD_FAILED", 'not a GGUF file: it starts with “{"mo”, not “GGUF”')
    html = job_page(console, job_id)
    assert retry_button(html) is None
    assert f'href="/hardware/nodes/{node["id"]}/work#node-runtime-jobs" data-testid="job-fix">' in html
    assert "Pick a GGUF model file of the artifact and run it again" in html
    assert re.search(r'data-testid="job-reason">the model did not load<', jobs_row(console, job_id))


def test_a_transient_failure_keeps_a_primary_retry_and_a_fix_first_one_a_secondary(console, node, root):
    down = failed_acquire(console, node, root, "HUB_UNAVAILABLE", "HTTP 503 from the Hub")
    html = job_page(console, down)
    assert retry_button(html) == "mf-button" and 'data-testid="job-fix"' not in html
    gated = failed_acquire(console, node, root, "HUB_AUTH_REQUIRED", "HTTP 401: gated")
    html = job_page(console, gated)
    assert retry_button(html) == "mf-button mf-secondary" and 'data-testid="job-fix"' not in html
    assert "MODELFORGE_HF_TOKEN" in html  # the next step says what to fix before retrying


def test_every_code_the_control_plane_words_is_classed_and_each_new_job_code_names_its_fix(app):
    assert set(queue._NEXT_STEPS) <= set(failures.REMEDIES)
    assert failures.remedy("SOMETHING_NEW") == Remedy.RETRY and failures.remedy(None) == Remedy.RETRY
    unfixed = {code for code, remedy in failures.REMEDIES.items() if remedy == Remedy.NEW_JOB} - set(job_words._FIXES)
    assert unfixed == {"JOB_PARAMS_INVALID"}  # worded by the job's type: its own form


# --------------------------------------------------------------------------- cancel, title, attempts, params


def test_an_operators_cancel_reads_as_neutral_words_with_retry_as_a_second_choice(console, node, root):
    job = add_job(console, node["id"], root["id"])
    htmx_post(console, f"/jobs/{job['id']}/cancel")
    html = job_page(console, job["id"])
    assert 'data-testid="job-cancelled"' in html and "Cancelled by the operator before it ran." in html
    assert 'class="mf-error"' not in html and 'role="alert"' not in html
    assert retry_button(html) == "mf-button mf-secondary"
    assert "JOB_CANCELLED" not in jobs_row(console, job["id"]) and 'data-testid="job-reason"' not in jobs_row(
        console, job["id"]
    )


def test_the_title_says_what_the_job_does_with_the_type_as_a_detail(console, node, root):
    job = add_job(console, node["id"], root["id"], repo_id="owner/tiny-GGUF")
    html = job_page(console, job["id"])
    assert "<title>Download model owner/tiny-GGUF to GPU Node" in html
    assert re.search(r'<h1 data-testid="job-title"><bdi>Download model owner/tiny-GGUF to GPU Node</bdi></h1>', html)
    assert re.search(rf'data-testid="job-kind"><code>{ACQUIRE}</code> · job <code>{job["id"]}</code>', html)
    assert "<h1>artifact.acquire.v1" not in html

    artifact = acquired_artifact(console, online_node(console, hostname="runner", capabilities=EVERY_TYPE))
    runner = artifact["node_id"]
    for job_type, words in ((queue.BENCHMARK, "Benchmark model"), (queue.GENERATE, "Run model")):
        params = {"artifact_id": artifact["id"], "model_file": "tiny.gguf", "prompts": ["Hi"]}
        if job_type == queue.BENCHMARK:
            params.pop("prompts")
        created = create(console, job_type, runner, params).get_json()
        assert f"<title>{words} owner/tiny-gguf on GPU Node" in job_page(console, created["id"])


def test_attempts_show_only_when_they_say_something(console, node, root):
    job = add_job(console, node["id"], root["id"])
    assert 'data-testid="job-attempts"' not in job_page(console, job["id"])  # not started
    claim(console, node)
    assert 'data-testid="job-attempts"' not in job_page(console, job["id"])  # the first attempt runs
    fail(console, node, job["id"], "HUB_UNAVAILABLE", "HTTP 503 from the Hub", retryable=True)
    html = job_page(console, job["id"])
    assert re.search(r'data-testid="job-attempts">Attempt 1 of 3 failed; attempt 2 is next', html)
    assert 'class="mf-error"' not in html and "The last attempt failed; it will be retried." in html
    assert "retrying: the Hub or the network failed" in jobs_row(console, job["id"])

    second = add_job(console, node["id"], root["id"], repo_id="owner/other")
    htmx_post(console, f"/jobs/{job['id']}/cancel")  # out of the way: one job runs per node
    assert claim(console, node).get_json()["job"]["id"] == second["id"]
    result = {"commit": "c" * 40, "container_path": f"{root['container_path']}/models/owner/other/{'c' * 40}"}
    done = agent(
        console, node, f"jobs/{second['id']}/complete", attempt=1, result={**result, "files": 1, "total_bytes": 1}
    )
    assert done.status_code == 200, done.get_json()
    html = job_page(console, second["id"])
    assert "Attempt" not in html and " of 3" not in html  # a first attempt that succeeded says nothing
    assert "of 3" not in jobs_row(console, second["id"])


def test_a_later_attempt_says_which(console, node, root):
    job = add_job(console, node["id"], root["id"])
    claim(console, node)
    fail(console, node, job["id"], "HUB_UNAVAILABLE", "HTTP 503", retryable=True)
    console.post(f"/api/v1/admin/jobs/{job['id']}/cancel", headers=ADMIN)
    console.post(f"/api/v1/admin/jobs/{job['id']}/retry", headers=ADMIN)
    assert claim(console, node).get_json()["job"]["attempt"] == 2
    assert re.search(r'data-testid="job-attempts">Attempt 2 of 3<', job_page(console, job["id"]))


def test_params_are_labelled_and_ids_shown_as_the_names_they_stand_for(console, node, root):
    job = add_job(console, node["id"], root["id"], allow_patterns=["*.gguf"], revision="v1")
    html = job_page(console, job["id"])
    params = html.split('data-testid="job-params"')[1].split("</dl>")[0]
    for label in ("Repository", "Revision", "Storage root", "Only files matching"):
        assert f"<dt>{label}</dt>" in params, label
    words = re.sub(r"<[^>]+>", " ", params)  # what the page reads out
    assert root["id"] not in params and "storage_root_id" not in words
    assert f'<a href="/hardware/nodes/{node["id"]}/storage#node-roots">models</a>' in params
    assert "<code>*.gguf</code>" in params

    artifact = acquired_artifact(console, online_node(console, hostname="runner", capabilities=EVERY_TYPE))
    params = {"artifact_id": artifact["id"], "model_file": "tiny.gguf", "n_gpu_layers": 0}
    bench = create(console, queue.BENCHMARK, artifact["node_id"], params).get_json()
    shown = job_page(console, bench["id"]).split('data-testid="job-params"')[1].split("</dl>")[0]
    assert "artifact_id" not in re.sub(r"<[^>]+>", " ", shown)
    storage = f"/hardware/nodes/{artifact['node_id']}/storage#artifact-{artifact['id']}"
    assert f'<a href="{storage}">owner/tiny-gguf @ bbbbbbb</a>' in shown
    assert "<dt>GPU layers</dt>" in shown and "none (CPU only)" in shown
    for word in ("None", "False", "True", "[]"):
        assert f">{word}<" not in shown


# --------------------------------------------------------------------------- CPU only on a node with GPUs


def test_a_cpu_only_run_on_a_node_that_lists_a_gpu_is_warned_about(console, node):
    artifact = acquired_artifact(console, node)
    asked = create(
        console,
        queue.BENCHMARK,
        node["id"],
        {"artifact_id": artifact["id"], "model_file": "tiny.gguf", "n_gpu_layers": 0},
    ).get_json()
    html = job_page(console, asked["id"])
    warning = html.split('data-testid="cpu-only-warning"')[1].split("</div>")[0]
    assert (
        "Runs on the CPU only" in warning
        and "NVIDIA GeForce RTX 4080" in warning
        and "GPU layers was set to 0" in warning
    )

    htmx_post(console, f"/jobs/{asked['id']}/cancel")
    ran = create(
        console, queue.BENCHMARK, node["id"], {"artifact_id": artifact["id"], "model_file": "tiny.gguf"}
    ).get_json()
    assert 'data-testid="cpu-only-warning"' not in job_page(console, ran["id"])  # all layers asked: nothing yet
    assert agent(console, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]["id"] == ran["id"]
    done = agent(console, node, f"jobs/{ran['id']}/complete", attempt=1, result=benchmark_result(artifact["id"]))
    assert done.status_code == 200, done.get_json()
    warning = job_page(console, ran["id"]).split('data-testid="cpu-only-warning"')[1].split("</div>")[0]
    assert "Ran on the CPU only" in warning and "the runtime worker used no GPU" in warning
