"""The runtime worker and runtime jobs in the console (W1, W2, J4, C1, C3, P5).

The node page shows the worker (or why there is none), the benchmark runs and the last smoke test;
its forms queue benchmark and generate jobs with CSRF and inline errors, as htmx posts them; the
job page shows phase and steps and a readable result. Odd stored values never make a 500.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
import sqlalchemy as sa

from app.console import forms
from app.extensions import db
from app.models import Job, NodeLease
from tests.support import ACQUIRE, ADMIN, EVERY_TYPE, factories
from tests.support.console import HTMX, htmx_post
from tests.support.nodes import agent, online_node, publish_inventory
from tests.support.runtime import acquired_artifact, benchmark_result, create, generate_result, tiny_facts, worker


@pytest.fixture
def node(console):
    return online_node(console, capabilities=EVERY_TYPE, runtime_worker=worker())


@pytest.fixture
def artifact(console, node):
    return acquired_artifact(console, node)


def page(console, node) -> str:
    """The node page's Jobs & runtime tab, where "Run a model" and the runtime worker are."""
    response = console.get(f"/hardware/nodes/{node['id']}/work")
    assert response.status_code == 200, response.get_data(as_text=True)[:2000]
    return unescape(response.get_data(as_text=True))


def runtime_panel(console, node) -> str:
    response = console.get(f"/hardware/nodes/{node['id']}/runtime", headers=HTMX)
    assert response.status_code == 200
    html = unescape(response.get_data(as_text=True))
    assert "<html" not in html
    return html


def post_form(console, node, kind: str, **fields):
    data = {f"{kind}-{name}": value for name, value in fields.items()}
    return htmx_post(console, f"/hardware/nodes/{node['id']}/{kind}", data=data)


def job_count(app) -> int:
    with app.app_context():
        return db.session.scalar(sa.select(sa.func.count()).select_from(Job))


def finish(console, node, job_id, result):
    assert agent(console, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]["id"] == job_id
    response = agent(console, node, f"jobs/{job_id}/complete", attempt=1, result=result)
    assert response.status_code == 200, response.get_json()


# --------------------------------------------------------------------------- the worker on the node page


def test_the_node_page_shows_a_compatible_worker_with_its_engine(console, node):
    html = page(console, node)
    assert "Runtime worker" in html
    worker_part = html[html.index('data-testid="worker"') :]
    assert "0.1.0" in worker_part and "llama.cpp 0.3.36" in worker_part
    assert re.search(r'data-testid="worker-answer">COMPATIBLE<', html)
    assert "gets no runtime jobs" not in html


@pytest.mark.parametrize(("protocol", "answer"), [(0, "TOO_OLD"), (2, "TOO_NEW"), ("garbage", "UNKNOWN")])
def test_an_incompatible_worker_is_said_to_get_no_runtime_jobs_with_its_action(console, node, protocol, answer):
    publish_inventory(console, node, capabilities=EVERY_TYPE, runtime_worker=worker(protocol))
    html = runtime_panel(console, node)
    assert f">{answer}<" in html
    assert f"This worker is {answer}: the node gets no runtime jobs." in html
    assert "worker protocol 1" in html or "official runtime worker release" in html  # the action


def test_without_a_worker_the_page_says_why(console, node):
    publish_inventory(
        console,
        node,
        capabilities=EVERY_TYPE,
        runtime_worker=None,
        runtime_worker_problem="no socket at /run/modelforge/worker.sock",
    )
    html = runtime_panel(console, node)
    assert "No worker answering: no socket at /run/modelforge/worker.sock." in html
    assert "gets no runtime jobs" in html
    bare = online_node(console, capabilities=EVERY_TYPE)
    assert "No runtime worker reported" in runtime_panel(console, bare)


# --------------------------------------------------------------------------- the forms


def test_a_benchmark_is_queued_from_the_node_page_with_defaults(app, console, node, artifact):
    html = page(console, node)
    assert 'data-testid="benchmark-form"' in html and 'name="benchmark-csrf_token"' in html
    assert f'<option selected value="{artifact["id"]}">owner/tiny-gguf @ bbbbbbb</option>' in html
    assert '<select id="benchmark-model_file" name="benchmark-model_file"><option selected value="tiny.gguf">' in html

    response = post_form(
        console, node, "benchmark", artifact_id=artifact["id"], model_file="tiny.gguf", repetitions="3"
    )
    assert response.status_code == 201, response.get_data(as_text=True)
    job_id = response.headers["HX-Redirect"].rsplit("/", 1)[1]
    job = console.get(f"/api/v1/admin/jobs/{job_id}", headers=ADMIN).get_json()
    assert (job["type"], job["params"]) == (
        "runtime.benchmark.v1",
        {
            "artifact_id": artifact["id"],
            "model_file": "tiny.gguf",
            "n_gpu_layers": -1,
            "prompt_tokens": 512,
            "generate_tokens": 128,
            "repetitions": 3,
        },
    )


def test_a_smoke_test_takes_one_prompt_per_line(console, node, artifact):
    response = post_form(
        console,
        node,
        "generate",
        artifact_id=artifact["id"],
        model_file="tiny.gguf",
        prompts="Hello\r\n\r\n The capital of France is\n",
        max_tokens="",
    )
    assert response.status_code == 201, response.get_data(as_text=True)
    job_id = response.headers["HX-Redirect"].rsplit("/", 1)[1]
    job = console.get(f"/api/v1/admin/jobs/{job_id}", headers=ADMIN).get_json()
    assert job["params"]["prompts"] == ["Hello", " The capital of France is"]
    assert job["params"]["max_tokens"] == 64


@pytest.mark.parametrize(
    ("kind", "fields", "message"),
    [
        # W2: the model file is one the artifact holds, checked on the server whatever the select offered.
        ("benchmark", {"model_file": "../tiny.gguf"}, "Pick one of the GGUF files of owner/tiny-gguf."),
        ("benchmark", {"model_file": "other.gguf"}, "Pick one of the GGUF files of owner/tiny-gguf."),
        ("generate", {"model_file": "config.json", "prompts": "x"}, "Pick one of the GGUF files of owner/tiny-gguf."),
        ("benchmark", {"model_file": ""}, "Pick one of the GGUF files of owner/tiny-gguf."),
        ("benchmark", {"model_file": "tiny.gguf", "repetitions": "51"}, "Between 1 and 50."),
        ("benchmark", {"model_file": "tiny.gguf", "n_gpu_layers": "lots"}, "Not a valid integer value."),
        (
            "benchmark",
            {"model_file": "tiny.gguf", "artifact_id": "not-this-nodes"},
            "Pick one of this node's artifacts.",
        ),
        ("generate", {"model_file": "tiny.gguf", "prompts": " \n "}, "Write at least one prompt."),
        ("generate", {"model_file": "tiny.gguf", "prompts": "\n".join(["p"] * 17)}, "At most 16 prompts."),
        ("generate", {"model_file": "tiny.gguf", "prompts": "ok\nbad\u202eline"}, "Line 2: a prompt is up to 8000"),
        ("generate", {"model_file": "tiny.gguf", "prompts": "x", "max_tokens": "0"}, "Between 1 and 4096."),
    ],
)
def test_a_refused_runtime_form_comes_back_with_its_error_inline_and_queues_nothing(
    app, console, node, artifact, kind, fields, message
):
    before = job_count(app)
    data = {"artifact_id": artifact["id"], "prompts": "Hello", **fields}
    if kind == "benchmark":
        data.pop("prompts")
    response = post_form(console, node, kind, **data)
    assert response.status_code == 422
    html = unescape(response.get_data(as_text=True))
    assert 'id="node-runtime-jobs"' in html and "<html" not in html
    assert re.search(r'class="mf-field-error" role="alert">' + re.escape(message), html), html
    assert job_count(app) == before


def test_a_runtime_form_without_csrf_changes_nothing(app, console, node, artifact):
    before = job_count(app)
    response = console.post(
        f"/hardware/nodes/{node['id']}/benchmark",
        data={"benchmark-artifact_id": artifact["id"], "benchmark-model_file": "tiny.gguf"},
        headers=HTMX,
    )
    assert response.status_code == 400
    assert job_count(app) == before


def test_without_an_artifact_the_forms_say_to_acquire_first(console, node):
    assert "Acquire a model first" in page(console, node)


def test_outside_htmx_a_refused_form_is_flashed_on_the_node_page(console, node, artifact):
    data = {
        "benchmark-artifact_id": artifact["id"],
        "benchmark-model_file": "../x.gguf",
        "benchmark-csrf_token": console.csrf,
    }
    response = console.post(f"/hardware/nodes/{node['id']}/benchmark", data=data)
    assert response.status_code == 303
    assert "Model file: Pick one of the GGUF files of owner/tiny-gguf." in unescape(page(console, node))


# --------------------------------------------------------------------------- results and the job page


def test_results_show_on_the_node_page_and_the_job_page(console, node, artifact):
    bench = post_form(console, node, "benchmark", artifact_id=artifact["id"], model_file="tiny.gguf")
    bench_id = bench.headers["HX-Redirect"].rsplit("/", 1)[1]
    queued = unescape(console.get(f"/jobs/{bench_id}").get_data(as_text=True))
    assert "waiting for the node's runtime worker" in queued

    agent(console, node, "jobs/claim", capabilities=EVERY_TYPE)
    progress = {"bytes_done": 0, "files_done": 0, "phase": "generate", "steps_done": 3, "steps_total": 12}
    agent(console, node, f"jobs/{bench_id}/progress", attempt=1, progress=progress)
    live = unescape(console.get(f"/jobs/{bench_id}", headers=HTMX).get_data(as_text=True))
    assert re.search(r'data-testid="job-phase">generate<', live) and "step 3 of 12" in live
    assert 'aria-valuenow="25.0"' in live

    agent(console, node, f"jobs/{bench_id}/complete", attempt=1, result=benchmark_result(artifact["id"]))
    done = unescape(console.get(f"/jobs/{bench_id}").get_data(as_text=True))
    assert re.search(r'data-testid="result-pp">8123\.4 ± 81\.2 tokens/s', done)
    assert re.search(r'data-testid="result-tg">912\.7 ± 9\.1 tokens/s', done)
    assert "0.071 s" in done and "117.7 MiB · —" in done and "none (CPU)" in done

    smoke = post_form(console, node, "generate", artifact_id=artifact["id"], model_file="tiny.gguf", prompts="Hello")
    smoke_id = smoke.headers["HX-Redirect"].rsplit("/", 1)[1]
    finish(console, node, smoke_id, generate_result(artifact["id"]))
    text = unescape(console.get(f"/jobs/{smoke_id}").get_data(as_text=True))
    assert '<pre class="mf-generated"> world.\nIt answers 👩\u200d💻</pre>' in text

    html = runtime_panel(console, node)
    row = html[html.index(f'data-job-id="{bench_id}"') :]
    assert "owner/tiny-gguf" in row and "8123.4 ± 81.2" in row and "912.7 ± 9.1" in row
    assert "0.012 s" in row and "117.7 MiB" in row
    smoke_part = html[html.index('data-testid="smoke-test"') :]
    assert "Hello" in smoke_part and "It answers" in smoke_part


def test_odd_stored_values_render_without_a_500(app, console, node, artifact):
    post_form(console, node, "benchmark", artifact_id=artifact["id"], model_file="tiny.gguf")
    post_form(console, node, "generate", artifact_id=artifact["id"], model_file="tiny.gguf", prompts="Hi")
    odd_results = {
        "runtime.benchmark.v1": {
            "prompt_tokens_per_second": {"mean": "x", "stddev": None},
            "generate_tokens_per_second": {"mean": 5, "stddev": "wide", "samples": "many"},
            "gpu_uuids": [1, None, "GPU-x"],
            "engine": {"name": 7},
            "peak_rss_bytes": "big",
            "load_seconds": -3,
        },
        "runtime.generate.v1": {"outputs": ["just text", {"prompt": 5, "text": None}], "engine": []},
    }
    with app.app_context():
        for job in db.session.scalars(sa.select(Job).where(Job.type.like("runtime.%"))):
            job.state = "succeeded"
            job.result = odd_results[job.type]
            job.progress = {"phase": 12, "steps_done": -1, "steps_total": "x"}
        db.session.execute(
            sa.update(NodeLease).values(
                runtime_worker={
                    "worker_version": None,
                    "protocol_version": {"x": 1},
                    "engines": "llama",
                    "devices": [3],
                },
                worker_compatibility="BOGUS",
            )
        )
        db.session.commit()
        job_ids = list(db.session.scalars(sa.select(Job.id).where(Job.type.like("runtime.%"))))
    assert "Runtime worker" in page(console, node)
    for job_id in job_ids:
        response = console.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.get_data(as_text=True)[:2000]
    assert console.get("/jobs").status_code == 200
    assert console.get(f"/api/v1/hardware/nodes/{node['id']}", headers=ADMIN).status_code == 200


def test_prompts_parse_one_per_line():
    assert forms.parse_prompts("a\n\n b \n") == ["a", " b "]
    with pytest.raises(ValueError, match="at least one"):
        forms.parse_prompts("\n")


# --------------------------------------------------------------------------- "Run a model": the artifact's own files


def another_artifact(console, node, repo_id: str, models: dict | None, commit: str = "c" * 40) -> dict:
    """A second artifact on the node's root, left by a real acquire job whose agent read `models`
    (None: an agent from before header reads, which lists no files)."""
    (root,) = console.get(f"/api/v1/admin/nodes/{node['id']}/storage-roots", headers=ADMIN).get_json()["storage_roots"]
    job = create(console, ACQUIRE, node["id"], {"repo_id": repo_id, "storage_root_id": root["id"]}).get_json()
    assert agent(console, node, "jobs/claim", capabilities=[ACQUIRE]).get_json()["job"]["id"] == job["id"]
    result = {"commit": commit, "container_path": f"{root['container_path']}/models/{repo_id}/{commit}", "files": 2}
    result |= {"total_bytes": 1000} | ({} if models is None else {"models": models})
    assert agent(console, node, f"jobs/{job['id']}/complete", attempt=1, result=result).status_code == 200
    listed = console.get(f"/api/v1/admin/nodes/{node['id']}/artifacts", headers=ADMIN).get_json()["artifacts"]
    return next(artifact for artifact in listed if artifact["repo_id"] == repo_id)


def options(html: str, select_id: str) -> list[tuple[bool, str, str]]:
    """(selected, value, text) of each option of one select."""
    select = re.search(rf'<select[^>]*id="{select_id}"[^>]*>(.*?)</select>', html, re.S).group(1)
    return [
        ("selected" in attributes, value, text)
        for attributes, value, text in re.findall(r'<option([^>]*?)value="([^"]*)"[^>]*>([^<]*)</option>', select)
    ]


def test_run_a_model_starts_on_a_gguf_artifact_and_picks_from_its_files(console, node, artifact):
    """W2: the newest artifact holds no GGUF file; the form starts on the one that does, with its
    readable file chosen, the unreadable one offered last, marked so."""
    two = {"b.gguf": tiny_facts(), "a-broken.gguf": {"problem": "the file is empty"}}
    several = another_artifact(console, node, "owner/two-gguf", two, commit="d" * 40)
    plain = another_artifact(console, node, "owner/safetensors", {}, commit="e" * 40)  # the newest
    html = page(console, node)
    assert options(html, "benchmark-artifact_id") == [
        (False, plain["id"], "owner/safetensors @ eeeeeee — no GGUF file"),
        (True, several["id"], "owner/two-gguf @ ddddddd"),
        (False, artifact["id"], "owner/tiny-gguf @ bbbbbbb"),
    ]
    assert options(html, "benchmark-model_file") == [
        (True, "b.gguf", "b.gguf"),
        (False, "a-broken.gguf", "a-broken.gguf — header unreadable"),
    ]
    assert options(html, "generate-model_file")[0] == (True, "b.gguf", "b.gguf")
    picker = re.search(r'<select[^>]*id="benchmark-artifact_id"[^>]*>', html).group(0)
    for attribute in (
        f'hx-get="/hardware/nodes/{node["id"]}/model-file?form=benchmark"',
        'hx-target="#benchmark-model_file-field"',
        'hx-trigger="change"',
        'hx-swap="outerHTML"',
    ):
        assert attribute in picker, attribute

    # Picking another artifact fetches its files (htmx sends the select's own value, no CSRF token).
    path = f"/hardware/nodes/{node['id']}/model-file"
    field = unescape(
        console.get(path, query_string={"form": "benchmark", "benchmark-artifact_id": artifact["id"]}).get_data(
            as_text=True
        )
    )
    assert field.lstrip().startswith('<div class="mf-field" id="benchmark-model_file-field">')
    assert options(field, "benchmark-model_file") == [(True, "tiny.gguf", "tiny.gguf")]
    none = console.get(path, query_string={"form": "generate", "generate-artifact_id": plain["id"]})
    assert "owner/safetensors holds no GGUF file." in unescape(none.get_data(as_text=True))
    assert "<select" not in none.get_data(as_text=True)
    assert console.get(path, query_string={"form": "deploy"}).status_code == 404


def test_a_model_file_the_artifact_does_not_hold_is_refused_inline(app, console, node, artifact):
    plain = another_artifact(console, node, "owner/safetensors", {}, commit="e" * 40)
    before = job_count(app)
    wrong = post_form(console, node, "benchmark", artifact_id=plain["id"], model_file="tiny.gguf")
    assert wrong.status_code == 422
    html = unescape(wrong.get_data(as_text=True))
    assert re.search(
        r'class="mf-field-error" role="alert">owner/safetensors holds no GGUF file: acquire a GGUF model', html
    )
    foreign = post_form(console, node, "generate", artifact_id=artifact["id"], model_file="b.gguf", prompts="Hi")
    assert foreign.status_code == 422
    assert "Pick one of the GGUF files of owner/tiny-gguf." in unescape(foreign.get_data(as_text=True))
    assert job_count(app) == before
    assert post_form(console, node, "benchmark", artifact_id=artifact["id"], model_file="tiny.gguf").status_code == 201


def test_an_artifact_whose_files_were_never_listed_takes_a_typed_path_by_the_path_rule(app, console, node, artifact):
    old = another_artifact(console, node, "owner/old-gguf", None, commit="f" * 40)
    fields = unescape(
        console.get(
            f"/hardware/nodes/{node['id']}/model-file",
            query_string={"form": "benchmark", "benchmark-artifact_id": old["id"]},
        ).get_data(as_text=True)
    )
    assert '<input type="text" id="benchmark-model_file" name="benchmark-model_file"' in fields
    assert "its files were not listed when it was acquired" in fields
    refused = post_form(console, node, "benchmark", artifact_id=old["id"], model_file="../x.gguf")
    assert refused.status_code == 422
    assert "Write the path without empty, . or .. parts" in unescape(refused.get_data(as_text=True))
    assert post_form(console, node, "benchmark", artifact_id=old["id"], model_file="dir/x.gguf").status_code == 201


def test_run_a_model_warns_when_a_node_that_lists_a_gpu_would_run_on_the_cpu_only(console, node):
    """The node lists an RTX 4080; the worker sees no GPU (a CPU image, or the GPU not passed through)."""
    html = page(console, node)
    warning = html.split('data-testid="cpu-only-warning"')[1].split("</div>")[0]
    assert "Runs here use the CPU only." in warning and "NVIDIA GeForce RTX 4080" in warning
    assert "sees no GPU" in warning and "docker-compose.runtime-worker.yml" in warning

    gpu = {"uuid": "GPU-00000000-0000-0000-0000-000000000001", "name": "NVIDIA GeForce RTX 4080"}
    cpu_build = {**worker(), "devices": [gpu]}  # sees the GPU, but its llama.cpp has no CUDA backend
    publish_inventory(console, node, capabilities=EVERY_TYPE, runtime_worker=cpu_build)
    assert "CPU build of llama.cpp" in page(console, node)
    cuda = {**cpu_build, "engines": [{"name": "llama.cpp", "version": "0.3.36", "backend": "cuda"}]}
    publish_inventory(console, node, capabilities=EVERY_TYPE, runtime_worker=cuda)
    assert 'data-testid="cpu-only-warning"' not in page(console, node)

    without_gpus = online_node(console, hostname="cpu-box", inventory=False)
    facts = {**factories.inventory_body()["inventory"], "gpus": []}
    publish_inventory(console, without_gpus, inventory=facts, capabilities=EVERY_TYPE, runtime_worker=worker())
    assert 'data-testid="cpu-only-warning"' not in page(console, without_gpus)  # a CPU node is meant to
