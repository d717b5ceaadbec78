"""S3 in the console: a benchmark on every benchmark-eligible node that holds the model, from the
node page's benchmark form, and the runs of one model side by side (C1, P5, W2).

The comparison has a table per model file and a row per node — its GPU model (or CPU), pp and tg
tokens/s, load time, peak GPU memory and RSS, the job and when it ran — the newest success first,
then the nodes with no run yet, said so; every figure comes from results stored by real agent
reports. It polls while a run is queued or running and stops once none is. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import Job
from tests.support import ADMIN, BENCHMARK, EVERY_TYPE
from tests.support.benchmarks import benchmark_node, cpu_node, cuda_node, fan_out
from tests.support.console import HTMX, htmx_post
from tests.support.nodes import agent
from tests.support.runtime import COMMIT, acquired_artifact, benchmark_result, create, rate

GIB = 2**30
FAST_GPU = "GPU-00000000-0000-0000-0000-0000000040a0"
IDLE_GPU = "GPU-00000000-0000-0000-0000-0000000040b0"
COMPARISON = f"/benchmarks?repo_id=owner/tiny-gguf&commit={COMMIT}"
# The page names the model file by file; these are the params every run below uses.
TINY = {"model_file": "tiny.gguf"}


def job_count(app) -> int:
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(Job))


def text(response) -> str:
    assert response.status_code == 200, response.get_data(as_text=True)[:2000]
    return unescape(response.get_data(as_text=True))


def row_of(html: str, node: dict) -> str:
    """The comparison row of one node (the first table's)."""
    start = html.index(f'data-node-id="{node["id"]}"')
    return html[start : html.index("</tr>", start)]


def benchmark_everywhere(console, node, artifact, **fields):
    """The node page's benchmark form, ticked to run on every node, as htmx posts it."""
    data = {
        "benchmark-artifact_id": artifact["id"],
        "benchmark-model_file": TINY["model_file"],
        "benchmark-everywhere": "y",
    }
    return htmx_post(console, f"/hardware/nodes/{node['id']}/benchmark", data={**data, **fields})


def run(console, node, job_id, **measured):
    """The node's agent claims the job and reports what its worker measured."""
    assert agent(console, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]["id"] == job_id
    artifact_id = console.get(f"/api/v1/admin/jobs/{job_id}", headers=ADMIN).get_json()["params"]["artifact_id"]
    result = benchmark_result(artifact_id, **measured)
    assert agent(console, node, f"jobs/{job_id}/complete", attempt=1, result=result).status_code == 200


@pytest.fixture
def fleet(console):
    """A CUDA node, a CPU node, an idle CUDA node and one that is not benchmark-eligible, each with a copy."""
    nodes = {
        "fast": cuda_node(console, "fast", FAST_GPU, "NVIDIA GeForce RTX 4090"),
        "cpu": cpu_node(console, "cpu"),
        "idle": cuda_node(console, "idle", IDLE_GPU, "NVIDIA GeForce RTX 4080"),
        "off": benchmark_node(console, "off", {"lab_eligible": True}),
    }
    copies = {name: acquired_artifact(console, node) for name, node in nodes.items()}
    return nodes, copies


def test_the_form_runs_everywhere_and_the_comparison_shows_each_nodes_newest_run_side_by_side(app, console, fleet):
    nodes, copies = fleet
    older = create(console, BENCHMARK, nodes["fast"]["id"], {"artifact_id": copies["fast"]["id"], **TINY})
    run(console, nodes["fast"], older.get_json()["id"], generate_tokens_per_second=rate(100.0))

    ticked = benchmark_everywhere(console, nodes["fast"], copies["fast"])
    assert ticked.status_code == 201, ticked.get_data(as_text=True)
    assert ticked.headers["HX-Redirect"] == COMPARISON
    listed = console.get("/api/v1/admin/jobs", headers=ADMIN).get_json()["jobs"]
    queued = {job["node_id"]: job["id"] for job in listed if job["state"] == "queued"}
    assert set(queued) == {nodes[name]["id"] for name in ("fast", "cpu", "idle")}
    landed = text(console.get(COMPARISON))
    assert (
        "Benchmark queued on 3 nodes; skipped — not benchmark-eligible (benchmark_eligible is false): GPU Node (off)."
        in landed
    )
    assert 'data-polling="true"' in landed and 'hx-trigger="every 5s"' in landed

    cpu_measured = {"prompt_tokens_per_second": rate(400.0), "generate_tokens_per_second": rate(20.0)}
    run(console, nodes["cpu"], queued[nodes["cpu"]["id"]], **cpu_measured)
    gpu_measured = {
        "gpu_uuids": [FAST_GPU],
        "n_gpu_layers": -1,
        "prompt_tokens_per_second": rate(5000.0),
        "generate_tokens_per_second": rate(150.0),
        "load_seconds": 1.25,
        "peak_gpu_memory_bytes": 8 * GIB,
        "peak_rss_bytes": GIB,
    }
    run(console, nodes["fast"], queued[nodes["fast"]["id"]], **gpu_measured)
    assert console.post(f"/api/v1/admin/jobs/{queued[nodes['idle']['id']]}/cancel", headers=ADMIN).status_code == 200

    html = text(console.get(COMPARISON))
    assert "owner/tiny-gguf" in html and 'data-model-file="tiny.gguf"' in html
    order = [re.search(rf'data-node-id="{nodes[name]["id"]}"', html).start() for name in ("fast", "cpu", "idle", "off")]
    assert order == sorted(order)  # the newest success first, then the nodes without one, by name

    fast = row_of(html, nodes["fast"])
    assert f'data-job-id="{queued[nodes["fast"]["id"]]}"' in fast  # the newest of its two runs
    assert re.search(r'data-testid="gpu"><bdi>NVIDIA GeForce RTX 4090<', fast)
    assert re.search(r'data-testid="pp">5000\.0 ± 50\.0 <span[^>]*>pp512<', fast)
    assert re.search(r'data-testid="tg">150\.0 ± 1\.5 <span[^>]*>tg128<', fast)
    assert 'data-testid="load">1.250 s<' in fast
    assert 'data-testid="gpu-memory">8.0 GiB<' in fast and 'data-testid="rss">1.0 GiB<' in fast
    assert f'href="/jobs/{queued[nodes["fast"]["id"]]}"' in fast and "newest of 2 runs" in fast

    cpu = row_of(html, nodes["cpu"])
    assert re.search(r'data-testid="gpu"><bdi>CPU<', cpu)
    assert "400.0 ± 4.0" in cpu and "20.0 ± 0.2" in cpu and "0.012 s" in cpu
    assert 'data-testid="gpu-memory">—<' in cpu and 'data-testid="rss">117.7 MiB<' in cpu  # no GPU: none measured

    idle = row_of(html, nodes["idle"])
    assert 'data-testid="no-run">no run yet<' in idle
    assert re.search(r'data-testid="gpu"><bdi>NVIDIA GeForce RTX 4080<', idle)  # what its worker runs on
    assert 'data-testid="since">cancelled<' in idle and "A new benchmark runs here." in idle
    off = row_of(html, nodes["off"])
    assert 'data-testid="no-run">no run yet<' in off
    assert "A new benchmark skips it: <bdi>not benchmark-eligible (benchmark_eligible is false)</bdi>." in off

    # Nothing is queued or running any more: the table is rendered without its trigger, so polling stops.
    fragment = text(console.get(COMPARISON, headers=HTMX))
    assert "<html" not in fragment and 'data-polling="false"' in fragment and "hx-trigger" not in fragment


def test_the_comparison_is_reached_from_a_benchmark_job_and_the_nodes_artifacts(console, fleet):
    nodes, copies = fleet
    job = fan_out(console, copies["cpu"]).get_json()["jobs"][0]
    linked = COMPARISON.replace("&", "&amp;")
    page = console.get(f"/jobs/{job['id']}").get_data(as_text=True)
    assert f'href="{linked}" data-testid="compare-link"' in page
    artifacts = console.get(f"/hardware/nodes/{nodes['cpu']['id']}/artifacts", headers=HTMX).get_data(as_text=True)
    assert f'href="{linked}" data-testid="artifact-benchmarks"' in artifacts


def test_when_no_node_qualifies_the_form_says_each_reason_inline_and_queues_nothing(app, console):
    node = benchmark_node(console, "lonely", {"lab_eligible": True})
    artifact = acquired_artifact(console, node)
    before = job_count(app)
    refused = benchmark_everywhere(console, node, artifact)
    assert refused.status_code == 409
    html = unescape(refused.get_data(as_text=True))
    assert 'data-testid="benchmark-form"' in html  # the form itself, ticked, with the refusal under the box
    assert "No node can run it — not benchmark-eligible (benchmark_eligible is false): GPU Node (lonely)." in html
    assert "mark it benchmark-eligible" in html
    assert job_count(app) == before
    # Unticked, the same form is the one-node path, as before: a job on this node.
    single = htmx_post(
        console,
        f"/hardware/nodes/{node['id']}/benchmark",
        data={"benchmark-artifact_id": artifact["id"], "benchmark-model_file": "tiny.gguf"},
    )
    assert single.status_code == 201 and single.headers["HX-Redirect"].startswith("/jobs/")


@pytest.mark.parametrize(
    "query",
    [
        "",
        f"repo_id=owner/tiny-gguf&commit={COMMIT.upper()}",
        f"repo_id=owner/tiny%00gguf&commit={COMMIT}",
        "repo_id=owner/tiny-gguf&commit=b",
        f"repo_id={'a' * 97}/b&commit={COMMIT}",
    ],
)
def test_a_comparison_names_one_model_or_is_refused_with_words_never_a_500(console, query):
    for headers in ({}, HTMX):
        refused = console.get(f"/benchmarks?{query}", headers=headers)
        assert refused.status_code == 400
        assert "repo_id=owner/name and commit=its 40 hex digits" in unescape(refused.get_data(as_text=True))


def test_a_model_nobody_ran_or_holds_is_said_so(console):
    html = text(console.get(f"/benchmarks?repo_id=owner/never&commit={'c' * 40}"))
    assert "No benchmark of this model has run" in html and "Held by 0 nodes now" in html


def test_odd_stored_results_show_as_dashes_never_a_500(app, console, fleet):
    nodes, copies = fleet
    job = create(console, BENCHMARK, nodes["cpu"]["id"], {"artifact_id": copies["cpu"]["id"], **TINY})
    odd = {
        "repo_id": "owner/tiny-gguf",
        "commit": COMMIT,
        "prompt_tokens_per_second": {"mean": "fast"},
        "load_seconds": True,
        "gpu_uuids": "GPU-1",
        "peak_rss_bytes": 1.5,
    }
    with app.app_context():
        db.session.execute(sa.update(Job).where(Job.id == job.get_json()["id"]).values(state="succeeded", result=odd))
        db.session.commit()
    row = row_of(text(console.get(COMPARISON)), nodes["cpu"])
    assert 'data-testid="pp">—<' in row and 'data-testid="load">—<' in row and 'data-testid="rss">—<' in row
    assert re.search(r'data-testid="gpu"><bdi>not reported<', row)  # an unreadable GPU list is not "the CPU"
