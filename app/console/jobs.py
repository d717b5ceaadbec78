"""What nodes do, in the console (J4, W1, W2): the jobs list, one job's live progress with cancel
and retry, and on the node page its storage roots, its artifacts, a form to acquire a model, its
runtime worker with the benchmark runs and last smoke test, and forms to start runtime jobs (a
benchmark on every benchmark-eligible node that holds the model, S3, lands on app/console/benchmarks.py)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from flask import abort, current_app, flash, redirect, render_template, request, url_for

from app.console import bp, is_htmx_fragment_request, job_words, page_or_partial
from app.console.auth import login_required
from app.console.benchmarks import skipped_text
from app.console.forms import AcquireForm, BenchmarkForm, GenerateForm, StorageRootForm
from app.db import begin_read_only
from app.errors import DomainError
from app.extensions import db
from app.jobs import artifacts, benchmarks, queue, runtime, storage
from app.jobs.benchmarks import Considered
from app.models import Artifact, Gpu, Job, JobState, Node, NodeLease, StorageRoot
from app.nodes import get as get_node
from app.nodes import runtime_worker
from app.timeutil import isoformat, parse_rfc3339

LIVE_STATES = (JobState.QUEUED, JobState.RUNNING)
# What a registered or deleted root tells the node page: the roots table and the acquire form
# refetch. A delete's own outcome lands outside both (#storage-notice), so no refetch wipes it.
ROOTS_CHANGED = "storage-roots-changed"


def _known_id(value: str, code: str, what: str) -> str:
    """An id from a query string is a UUID, or not found before a query (PostgreSQL refuses NUL);
    ids in the URL path are checked app-wide (app/__init__.py)."""
    try:
        uuid.UUID(value)
    except ValueError:
        raise DomainError(code, f"No {what} has id “{value[:100]}”.", "Ids are UUIDs; list them first.") from None
    return value


def _job(job_id: str) -> Job:
    return queue.get(_known_id(job_id, "JOB_NOT_FOUND", "job"))


def _node_names() -> dict[str, str]:
    return dict(db.session.execute(sa.select(Node.id, Node.display_name).order_by(Node.display_name)).all())


# --------------------------------------------------------------------------- progress


@dataclass(frozen=True)
class Seen:
    """The report this page showed last, carried by its own poll (see `measure`)."""

    bytes_done: int
    reported_at: datetime
    rate: float | None


@dataclass(frozen=True)
class ProgressView:
    """One job's progress as the bar shows it; percent None means the size is not known yet."""

    percent: float | None
    bytes_done: int | None
    bytes_total: int | None
    files_done: int | None
    files_total: int | None
    reported_at: datetime | None
    rate: float | None
    eta_seconds: float | None
    # W2: a runtime job's phase and steps (none for an acquire).
    phase: str | None = None
    steps_done: int | None = None
    steps_total: int | None = None


def _count(progress: dict, key: str) -> int | None:
    value = progress.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def progress_percent(job: Job) -> float | None:
    """How far a job is, 0–100: by bytes when their total is known, else by files; None when unknown."""
    if job.state == JobState.SUCCEEDED:
        return 100.0
    progress = job.progress if isinstance(job.progress, dict) else {}
    pairs = (("bytes_done", "bytes_total"), ("files_done", "files_total"), ("steps_done", "steps_total"))
    for done_key, total_key in pairs:
        done, total = _count(progress, done_key), _count(progress, total_key)
        if done is not None and total:
            return round(min(max(done / total, 0.0), 1.0) * 100, 1)
    return None


def _seen_from_request() -> Seen | None:
    """The previous report the poll carried back; anything unreadable means none (it only shapes a rate)."""
    reported_at = parse_rfc3339(request.args.get("seen_at", ""))
    try:
        bytes_done = int(request.args.get("seen_bytes", ""))
    except ValueError:
        return None
    try:
        rate = float(request.args.get("seen_rate", ""))
    except ValueError:
        rate = None
    if reported_at is None or bytes_done < 0:
        return None
    return Seen(bytes_done, reported_at, rate if rate is not None and math.isfinite(rate) and rate >= 0 else None)


def measure(job: Job, seen: Seen | None) -> tuple[ProgressView, Seen | None]:
    """The progress view and what the next poll should carry.

    J4: the rate is measured between two successive progress reports, each stamped by the control
    plane when it arrived (`progress.updated_at`): the partial keeps the previous report's bytes
    and time (and the rate they gave) in its own poll URL, so no server state is needed and a
    report that has not changed since the last poll keeps the rate it had. A fresh page has no
    previous report, so it shows no rate until the next report comes in; an average since
    `started_at` would be wrong after a resume, whose bytes_done includes what earlier attempts
    fetched. A report with fewer bytes than the one before (a new attempt) starts measuring again.
    """
    progress = job.progress if isinstance(job.progress, dict) else {}
    bytes_done, bytes_total = _count(progress, "bytes_done"), _count(progress, "bytes_total")
    reported_at = parse_rfc3339(progress["updated_at"]) if isinstance(progress.get("updated_at"), str) else None
    rate = None
    if seen is not None and reported_at is not None and bytes_done is not None:
        elapsed = (reported_at - seen.reported_at).total_seconds()
        if elapsed == 0 and bytes_done == seen.bytes_done:
            rate = seen.rate
        elif elapsed > 0 and bytes_done >= seen.bytes_done:
            rate = (bytes_done - seen.bytes_done) / elapsed
    eta_seconds = None
    if rate and bytes_total is not None and bytes_done is not None and job.state == JobState.RUNNING:
        eta_seconds = max(bytes_total - bytes_done, 0) / rate
    view = ProgressView(
        percent=progress_percent(job),
        bytes_done=bytes_done,
        bytes_total=bytes_total,
        files_done=_count(progress, "files_done"),
        files_total=_count(progress, "files_total"),
        reported_at=reported_at,
        rate=rate,
        eta_seconds=eta_seconds,
        phase=progress["phase"] if isinstance(progress.get("phase"), str) else None,
        steps_done=_count(progress, "steps_done"),
        steps_total=_count(progress, "steps_total"),
    )
    carried = Seen(bytes_done, reported_at, rate) if reported_at is not None and bytes_done is not None else None
    return view, carried


def _poll_url(job: Job, carried: Seen | None) -> str:
    """The live panel's own URL, carrying the report it shows (for the next rate)."""
    if carried is None:
        return url_for("console.job_page", job_id=job.id)
    return url_for(
        "console.job_page",
        job_id=job.id,
        seen_bytes=carried.bytes_done,
        seen_at=isoformat(carried.reported_at),
        seen_rate=None if carried.rate is None else f"{carried.rate:.1f}",
    )


# --------------------------------------------------------------------------- jobs list


def _page_marker(errors: dict[str, str]) -> Job | None:
    """`before` is the last job of the previous page (keyset paging, as the API's)."""
    raw = (request.args.get("before") or "").strip()
    if not raw:
        return None
    try:
        return _job(raw)
    except DomainError:
        errors["before"] = "Not a page marker."
        return None


@bp.get("/jobs")
@login_required
def jobs_page():
    """J4: jobs newest first, filtered by node, type and state; refreshes itself while any is live."""
    begin_read_only()
    errors: dict[str, str] = {}
    node_names = _node_names()
    allowed = {"node": node_names, "type": queue.TYPES, "state": [str(state) for state in JobState]}
    filters = {name: (request.args.get(name) or "").strip()[:64] for name in allowed}
    for name, values in allowed.items():
        if filters[name] and filters[name] not in values:
            errors[name] = "Pick a value from the list."
            filters[name] = ""
    before = _page_marker(errors)
    found = queue.list_jobs(
        filters["node"] or None,
        filters["type"] or None,
        filters["state"] or None,
        before,
        limit=queue.PAGE_SIZE + 1,
    )
    jobs = found[: queue.PAGE_SIZE]
    link_filters = {name: value for name, value in filters.items() if value}
    return page_or_partial(
        "jobs.html",
        "partials/_jobs_table.html",
        jobs=jobs,
        percent=progress_percent,
        reason=job_words.reason,
        attempts=job_words.attempts,
        kind=job_words.kind,
        node_names=node_names,
        filters=filters,
        link_filters=link_filters,
        errors=errors,
        before=before.id if before else None,
        next_before=jobs[-1].id if len(found) > queue.PAGE_SIZE else None,
        # C2's rule: a table polls only while something in it can still change.
        polling=any(job.state in LIVE_STATES for job in jobs),
        job_types=queue.TYPES,
        states=list(JobState),
        active="jobs",
    ), (400 if errors else 200)


# --------------------------------------------------------------------------- one job


def _job_context(job: Job, seen: Seen | None) -> dict[str, object]:
    progress, carried = measure(job, seen)
    live = job.state in LIVE_STATES
    result = job.result if isinstance(job.result, dict) else {}
    artifact_id = result.get("artifact_id") or job.artifact_id
    has_result = isinstance(job.result, dict) and bool(job.result)
    artifact = db.session.get(Artifact, artifact_id) if isinstance(artifact_id, str) else None
    node = db.session.get(Node, job.node_id)
    root = db.session.get(StorageRoot, job.storage_root_id) if job.storage_root_id else None
    return {
        "job": job,
        "node": node,
        "root": root,
        "artifact": artifact,
        "title": job_words.title(job, node, artifact),
        "params": job_words.params(job, root, artifact),
        "attempts": job_words.attempts(job),
        "next_step": job_words.next_step(job),
        "cancelled": job_words.cancelled(job),
        "reason": job_words.reason(job),
        "cpu_only": _ran_on_cpu_only(job),
        "compare_url": _comparison_url(job, artifact),
        "runtime_job": runtime.is_runtime(job.type),
        # W2: a runtime result read field by field, so an odd stored value shows as "—", never a 500.
        "benchmark": runtime.benchmark_row(job) if has_result and job.type == queue.BENCHMARK else None,
        "smoke": runtime.smoke_test(job) if has_result and job.type == queue.GENERATE else None,
        "progress": progress,
        "live": live,
        "poll_url": _poll_url(job, carried) if live else None,
        "States": JobState,
    }


def _listed_gpus(node_id: str) -> list[str]:
    """The models of the GPUs the node's inventory lists now, each once."""
    names = db.session.scalars(
        sa.select(Gpu.name).where(Gpu.node_id == node_id, Gpu.present.is_(True)).order_by(Gpu.id)
    )
    return list(dict.fromkeys(name or "a GPU of unknown model" for name in names))


def _ran_on_cpu_only(job: Job) -> dict[str, object] | None:
    """W2: a runtime job that runs (or ran) on the CPU only on a node that lists GPUs: asked for
    with GPU layers 0, or run by a worker that used no GPU (its result names none)."""
    if not runtime.is_runtime(job.type):
        return None
    params = job.params if isinstance(job.params, dict) else {}
    result = job.result if isinstance(job.result, dict) else {}
    if params.get("n_gpu_layers") == 0:
        why = "GPU layers was set to 0"
    elif job.state == JobState.SUCCEEDED and result.get("gpu_uuids") == []:
        why = "the runtime worker used no GPU"
    else:
        return None
    gpus = _listed_gpus(job.node_id)
    return {"gpus": gpus, "why": why, "done": job.state == JobState.SUCCEEDED} if gpus else None


def _worker_cpu_only(node_id: str, worker: dict[str, object] | None) -> dict[str, object] | None:
    """W2: the node lists GPUs but its runtime worker would run everything on the CPU: it sees no
    GPU, or its llama.cpp is a CPU build."""
    reported = worker.get("reported") if isinstance(worker, dict) else None
    if not isinstance(reported, dict):
        return None
    devices, engines = reported.get("devices"), reported.get("engines")
    sees_gpu = isinstance(devices, list) and any(isinstance(device, dict) for device in devices)
    cuda = isinstance(engines, list) and any(isinstance(e, dict) and e.get("backend") == "cuda" for e in engines)
    if sees_gpu and cuda:
        return None
    gpus = _listed_gpus(node_id)
    if not gpus:
        return None
    why = "sees no GPU" if not sees_gpu else "has a CPU build of llama.cpp (no CUDA backend)"
    return {"gpus": gpus, "why": why}


def _comparison_url(job: Job, artifact: Artifact | None) -> str | None:
    """S3: a benchmark's model side by side on every node: named by its result once it ran (the
    name outlives the artifact), by its artifact before."""
    if job.type != queue.BENCHMARK:
        return None
    result = job.result if isinstance(job.result, dict) else {}
    repo_id, commit = result.get("repo_id"), result.get("commit")
    if not (isinstance(repo_id, str) and isinstance(commit, str)) and artifact is not None:
        repo_id, commit = artifact.repo_id, artifact.commit
    if not (isinstance(repo_id, str) and isinstance(commit, str)):
        return None
    return url_for("console.benchmark_comparison", repo_id=repo_id, commit=commit)


@bp.get("/jobs/<job_id>")
@login_required
def job_page(job_id: str):
    """J4: every fact of one job and a progress bar that polls every 2 s until the job ends."""
    begin_read_only()
    context = _job_context(queue.get(job_id), _seen_from_request())
    return page_or_partial("job.html", "partials/_job_live.html", active="jobs", **context)


def _after_job_action(job: Job):
    """The live panel in place of the old one; the notice slot (where a refusal would land) is cleared."""
    if not is_htmx_fragment_request():
        return redirect(url_for("console.job_page", job_id=job.id), 303)
    body = render_template("partials/_job_live.html", clear_notice=True, **_job_context(job, None))
    response = current_app.make_response(body)
    # The buttons target #job-notice, so a 409 from the error handlers lands there and the panel
    # stays; a success swaps the panel itself.
    response.headers["HX-Retarget"] = "#job-live"
    response.headers["HX-Reswap"] = "outerHTML"
    return response


@bp.post("/jobs/<job_id>/cancel")
@login_required
def cancel_job(job_id: str):
    """J2: a queued job is cancelled at once; a running one is told to stop at its next report."""
    return _after_job_action(queue.cancel(job_id))


@bp.post("/jobs/<job_id>/retry")
@login_required
def retry_job(job_id: str):
    """J2: a failed or cancelled job goes back to the queue as a new attempt."""
    return _after_job_action(queue.retry(job_id))


# --------------------------------------------------------------------------- node page panels


# Each panel's tab on the node page (app/console/node_page.py): where a form outside htmx lands.
STORAGE_TAB, WORK_TAB = "console.node_storage", "console.node_work"


def node_storage_context(node_id: str) -> dict[str, object]:
    """The node page's Storage & artifacts tab: roots with their use, the root form, artifacts, acquire (J1–J5)."""
    return {
        **_acquire_context(node_id),
        **_artifacts_context(node_id),
        "root_usage": storage.usage_for_node(node_id),
        "root_form": StorageRootForm(formdata=None),
        "artifact_dir": storage.reported_artifact_dir(node_id),
    }


def node_work_context(node_id: str) -> dict[str, object]:
    """The node page's Jobs & runtime tab: the forms to run a model, the runtime worker and its results (W1, W2)."""
    return {**_runtime_jobs_context(node_id), **_runtime_context(node_id)}


def _panel(template: str, status: int = 200, trigger: str | None = None, **context):
    response = current_app.make_response((render_template(template, **context), status))
    if trigger:
        response.headers["HX-Trigger"] = trigger
    return response


def _back_to_node(node_id: str, *messages: str, tab: str = STORAGE_TAB):
    """Outside htmx: say what happened on the node page's tab the form is on (post/redirect/get)."""
    for message in messages:
        flash(message)
    return redirect(url_for(tab, node_id=node_id), 303)


def _refetched_panel(node_id: str, template: str, context: Callable[[str], dict[str, object]], tab: str = STORAGE_TAB):
    """A node page panel fetching itself again (htmx); outside htmx, the node page's tab it is on."""
    if not is_htmx_fragment_request():
        return redirect(url_for(tab, node_id=node_id))
    begin_read_only()
    return render_template(template, node=get_node(node_id), **context(node_id))


@bp.get("/hardware/nodes/<node_id>/storage-roots")
@login_required
def node_roots(node_id: str):
    """J1: the roots table with what the agent last observed (J5: and each root's use); refreshes
    itself on the node page."""
    return _refetched_panel(
        node_id,
        "partials/_node_roots.html",
        lambda node: {"roots": storage.for_node(node), "root_usage": storage.usage_for_node(node)},
    )


@bp.post("/hardware/nodes/<node_id>/storage-roots")
@login_required
def create_storage_root(node_id: str):
    """J1: register a root; the form comes back empty and the roots and acquire panels refetch."""
    node = get_node(node_id)
    form = StorageRootForm()
    status = 422
    if form.validate_on_submit():
        try:
            registered = storage.create(node_id, form.root_request())
        except DomainError as error:
            if error.code == "STORAGE_ROOT_EXISTS":
                form.name.errors.append(error.message)
                status = 409
            elif error.code == "STORAGE_ROOT_OUTSIDE_ARTIFACT_DIR":
                form.container_path.errors.append(f"{error.message} {error.next_step}")
            else:
                raise
        else:
            notice = _registered_notice(registered)
            if not is_htmx_fragment_request():
                return _back_to_node(node_id, notice)
            fresh = StorageRootForm(formdata=None)
            return _panel(
                "partials/_storage_root_form.html",
                201,
                ROOTS_CHANGED,
                node=node,
                root_form=fresh,
                notice=notice,
                artifact_dir=registered.checked_against,
            )
    if not is_htmx_fragment_request():
        return _back_to_node(node_id, *_error_lines(form))
    artifact_dir = storage.reported_artifact_dir(node_id)
    return _panel("partials/_storage_root_form.html", status, node=node, root_form=form, artifact_dir=artifact_dir)


def _registered_notice(registered: storage.Registered) -> str:
    """What registering a root did, and what was and was not checked (J1)."""
    root = registered.root
    if registered.checked_against is None:
        return (
            f"Storage root {root.name} registered, not yet checked: the node has not reported its artifact "
            "directory yet. The agent checks the path at its next heartbeat, creates the directory if its "
            "parent lets it, and the roots table shows anything it refuses."
        )
    return (
        f"Storage root {root.name} registered below {registered.checked_against}; the agent checks it at its "
        "next heartbeat (and creates the directory if it is missing and its parent lets it)."
    )


def _error_lines(form) -> list[str]:
    """A refused form's errors as lines to flash, each naming its field (outside htmx)."""
    return [f"{form[name].label.text}: {error}" for name, errors in form.errors.items() for error in errors]


@bp.post("/hardware/nodes/<node_id>/storage-roots/<root_id>/delete")
@login_required
def delete_storage_root(node_id: str, root_id: str):
    """J1: forget a root (its files stay); while a job uses it the 409 names why (the error handlers)."""
    root = storage.get(root_id)
    if root.node_id != node_id:
        raise DomainError(
            "STORAGE_ROOT_NOT_FOUND", f"Node {node_id} has no storage root {root_id}.", "Reload the node page."
        )
    name = root.name
    storage.delete(root.id)
    notice = f"Storage root {name} deleted; its files stay on the node."
    if not is_htmx_fragment_request():
        return _back_to_node(node_id, notice)
    return _panel("partials/_notice.html", 200, ROOTS_CHANGED, notice=notice)


def _artifacts_context(node_id: str) -> dict[str, object]:
    found = artifacts.for_node(node_id)
    return {"artifacts": found, "deleting": artifacts.deleting([artifact.id for artifact in found])}


@bp.get("/hardware/nodes/<node_id>/artifacts")
@login_required
def node_artifacts(node_id: str):
    """J3: what the node holds, verified; refreshes itself on the node page."""
    return _refetched_panel(node_id, "partials/_node_artifacts.html", _artifacts_context)


@bp.post("/hardware/nodes/<node_id>/artifacts/<artifact_id>/delete")
@login_required
def delete_artifact(node_id: str, artifact_id: str):
    """J5: queue the artifact's delete job; while it is in use the 409 names what uses it (the
    error handlers), and nothing changes."""
    artifact = artifacts.get(artifact_id)
    if artifact.node_id != node_id:
        raise DomainError(
            "ARTIFACT_NOT_FOUND", f"Node {node_id} has no artifact {artifact_id}.", "Reload the node page."
        )
    job = queue.request_delete(artifact.id)
    if not is_htmx_fragment_request():
        return _back_to_node(node_id, f"Deleting {artifact.repo_id} from the node (job {job.id[:8]}).")
    return render_template("partials/_node_artifacts.html", node=get_node(node_id), **_artifacts_context(node_id))


def _acquire_context(node_id: str) -> dict[str, object]:
    roots = storage.for_node(node_id)
    return {"roots": roots, "acquire_form": AcquireForm(roots, formdata=None)}


@bp.get("/hardware/nodes/<node_id>/acquire")
@login_required
def acquire_form(node_id: str):
    """The acquire form afresh, after the node's roots changed (its root list with them)."""
    return _refetched_panel(node_id, "partials/_node_acquire.html", _acquire_context)


def _show_created(job: Job):
    """A job a form just queued: its page (a 303, or HX-Redirect for htmx)."""
    return _show(url_for("console.job_page", job_id=job.id))


def _show(target: str):
    """What a form just queued, at `target`: a 303, or HX-Redirect for htmx."""
    if not is_htmx_fragment_request():
        return redirect(target, 303)
    response = current_app.make_response(("", 201))
    response.headers["HX-Redirect"] = target
    return response


@bp.post("/hardware/nodes/<node_id>/acquire")
@login_required
def acquire(node_id: str):
    """J3, J4: queue an artifact.acquire.v1 job on this node, then show it (HX-Redirect for htmx)."""
    node = get_node(node_id)
    roots = storage.for_node(node_id)
    form = AcquireForm(roots)
    if not form.validate_on_submit():
        if not is_htmx_fragment_request():
            return _back_to_node(node_id, *_error_lines(form))
        return _panel("partials/_node_acquire.html", 422, node=node, roots=roots, acquire_form=form)
    return _show_created(queue.create(queue.ACQUIRE, node_id, form.params()))


# --------------------------------------------------------------------------- runtime worker and jobs (W1, W2)


def _runtime_context(node_id: str) -> dict[str, object]:
    return {
        "worker": runtime_worker(db.session.get(NodeLease, node_id)),
        "results": runtime.results(node_id),
    }


@bp.get("/hardware/nodes/<node_id>/runtime")
@login_required
def node_runtime(node_id: str):
    """W1, W2: the runtime worker, the benchmark runs and the last smoke test; refreshes itself."""
    return _refetched_panel(node_id, "partials/_node_runtime.html", _runtime_context, WORK_TAB)


def _runtime_jobs_context(
    node_id: str, benchmark_form: BenchmarkForm | None = None, generate_form: GenerateForm | None = None
) -> dict[str, object]:
    found = artifacts.for_node(node_id)
    return {
        "artifacts": found,
        "benchmark_form": benchmark_form or BenchmarkForm(found, formdata=None, prefix="benchmark"),
        "generate_form": generate_form or GenerateForm(found, formdata=None, prefix="generate"),
        "cpu_only": _worker_cpu_only(node_id, runtime_worker(db.session.get(NodeLease, node_id))),
    }


RUN_FORMS = {"benchmark": BenchmarkForm, "generate": GenerateForm}


@bp.get("/hardware/nodes/<node_id>/model-file")
@login_required
def model_file_field(node_id: str):
    """W2: the model file field of a "Run a model" form for the artifact just picked (htmx, on
    change): a select of its GGUF files, the first readable one chosen."""
    begin_read_only()
    name = request.args.get("form", "")
    if name not in RUN_FORMS:
        abort(404)
    get_node(node_id)
    form = RUN_FORMS[name](
        artifacts.for_node(node_id), pick_file=True, formdata=request.args, prefix=name, meta={"csrf": False}
    )
    if form.chosen is None:
        form.model_file.errors = ["Pick one of this node's artifacts."]
    return render_template("partials/_model_file_field.html", form=form)


@bp.get("/hardware/nodes/<node_id>/runtime-jobs")
@login_required
def runtime_jobs_form(node_id: str):
    """The runtime job forms afresh, after the node's roots (and so its artifacts) changed."""
    return _refetched_panel(node_id, "partials/_node_runtime_jobs.html", _runtime_jobs_context, WORK_TAB)


def _queue_runtime_job(node_id: str, job_type: str):
    """W2: queue a runtime job from its form, then show it (HX-Redirect for htmx); errors inline (422)."""
    node = get_node(node_id)
    found = artifacts.for_node(node_id)
    name, form_class = ("benchmark", BenchmarkForm) if job_type == queue.BENCHMARK else ("generate", GenerateForm)
    form = form_class(found, prefix=name)
    if not form.validate_on_submit():
        if not is_htmx_fragment_request():
            return _back_to_node(node_id, *_error_lines(form), tab=WORK_TAB)
        context = _runtime_jobs_context(node_id, **{f"{name}_form": form})  # the other form stays fresh
        return _panel("partials/_node_runtime_jobs.html", 422, node=node, **context)
    if job_type == queue.BENCHMARK and form.everywhere.data:
        return _benchmark_everywhere(node, form)
    return _show_created(queue.create(job_type, node_id, form.params()))


def _benchmark_everywhere(node: Node, form: BenchmarkForm):
    """S3: the benchmark on every benchmark-eligible node that holds the model, then the model's
    comparison with a notice of the nodes skipped and why. When no node qualifies, the form comes
    back with every node's reason (409) and nothing is queued."""
    try:
        fanned = benchmarks.fan_out(form.params())
    except DomainError as error:
        if error.code != "NO_NODE_FITS":
            raise
        judged = [Considered(**each) for each in error.extra.get("nodes", [])]
        refusal = f"No node can run it — {skipped_text(judged)}." if judged else error.message
        form.everywhere.errors.append(refusal)
        form.everywhere.errors.append(error.next_step)
        if not is_htmx_fragment_request():
            return _back_to_node(node.id, refusal, tab=WORK_TAB)
        context = _runtime_jobs_context(node.id, benchmark_form=form)
        return _panel("partials/_node_runtime_jobs.html", 409, node=node, **context)
    queued = f"Benchmark queued on {len(fanned.jobs)} node{'' if len(fanned.jobs) == 1 else 's'}"
    flash(f"{queued}; skipped — {skipped_text(fanned.skipped)}." if fanned.skipped else f"{queued}.")
    return _show(url_for("console.benchmark_comparison", repo_id=fanned.model.repo_id, commit=fanned.model.commit))


@bp.post("/hardware/nodes/<node_id>/benchmark")
@login_required
def benchmark(node_id: str):
    """W2: queue a runtime.benchmark.v1 job on one of this node's artifacts."""
    return _queue_runtime_job(node_id, queue.BENCHMARK)


@bp.post("/hardware/nodes/<node_id>/generate")
@login_required
def generate(node_id: str):
    """W2: queue a runtime.generate.v1 job (the smoke test) on one of this node's artifacts."""
    return _queue_runtime_job(node_id, queue.GENERATE)
