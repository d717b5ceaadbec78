"""runtime.benchmark.v1 and runtime.generate.v1, the node agent's relay to the runtime worker (W1, W2).

The agent runs no model itself: it checks that the job's model file belongs to an artifact it
verified (its modelforge-manifest.json lists the file, reached without a symlink), submits the job
to the separate runtime worker over its Unix socket, polls its status every quarter second and
relays it as progress, and cancels it there when the job is cancelled or abandoned.

The core (modelforge_node_agent) asks the worker who it is, for the inventory; it imports this
module only when it claims the first runtime job, and the module registers its handlers at the
bottom.
"""

from __future__ import annotations

import os
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from modelforge_node_agent import (
    ERROR_CODE_PATTERN,
    JOB_PARAMS_INVALID,
    MANIFEST_NAME,
    RUNTIME_BENCHMARK_JOB_TYPE,
    RUNTIME_GENERATE_JOB_TYPE,
    RUNTIME_WORKER_UNAVAILABLE,
    Client,
    Config,
    Job,
    JobControl,
    JobFailure,
    Progress,
    PublishError,
    WorkerClient,
    WorkerError,
    as_dict,
    is_safe_relative_path,
    log,
    open_dir_chain,
    read_json_at,
    register_job_type,
    short_text,
    whole_number,
    wire_versions,
)

MODEL_FILE_INVALID = "MODEL_FILE_INVALID"  # J2: this family's own error codes
MODEL_LOAD_FAILED = "MODEL_LOAD_FAILED"  # the worker's: llama.cpp refused the file, or died loading it
RUNTIME_ENGINE_CRASHED = "RUNTIME_ENGINE_CRASHED"  # the worker's: its engine process died running the job
# The same file fails the same way on every attempt (issue 22: a model that crashes the engine
# crashed it again on each retry), so these are never retried, whatever a worker says.
NEVER_RETRIED = frozenset({MODEL_FILE_INVALID, MODEL_LOAD_FAILED, RUNTIME_ENGINE_CRASHED})
WORKER_JOB_STATES = ("running", "succeeded", "failed", "cancelled")
WORKER_POLL_SECONDS = 0.25
WORKER_POLL_TIMEOUTS = 3  # this many timed-out polls in a row: the worker is gone
WORKER_CANCEL_WAIT_SECONDS = 5.0  # W1: a cancelled job stops within a second; wait a little longer


@dataclass(frozen=True)
class RuntimeRequest:
    """The params of a runtime job the agent itself reads (W1): which file of which artifact."""

    artifact_id: str
    model_file: str
    container_path: str

    @classmethod
    def from_params(cls, params: dict[str, object]) -> RuntimeRequest:
        """Check the params the agent needs; a bad one fails the job (not retryable) naming the field.
        The rest (prompts, token counts) the worker checks."""

        def bad(name: str, rule: str) -> JobFailure:
            return JobFailure(JOB_PARAMS_INVALID, f"params.{name} {rule}", retryable=False)

        artifact_id = params.get("artifact_id")
        if not isinstance(artifact_id, str) or not 0 < len(artifact_id) <= 128 or not artifact_id.isprintable():
            raise bad("artifact_id", "must be the artifact's id")
        model_file = params.get("model_file")
        if not isinstance(model_file, str) or not model_file:
            raise bad("model_file", "must be the model file's path in the artifact")
        if not is_safe_relative_path(model_file):
            raise JobFailure(
                MODEL_FILE_INVALID,
                f"params.model_file {ascii(model_file)[:300]} is not a plain path inside the artifact "
                "(no leading '/', no '.' or '..' segment)",
                retryable=False,
            )
        container_path = params.get("container_path")
        if not isinstance(container_path, str) or not os.path.isabs(container_path):
            raise bad("container_path", "must be the artifact's absolute path in the agent's container")
        return cls(artifact_id, model_file, container_path)


def verified_model_path(request: RuntimeRequest, artifact_dir: Path) -> str:
    """The model file's path relative to the artifact directory, which the worker resolves in its
    own (W1), once the agent has seen that it belongs to an artifact it verified: the artifact's
    container_path below the artifact directory, its modelforge-manifest.json listing the file
    with the size it has on disk, a regular file reached without any symlink. Otherwise
    MODEL_FILE_INVALID, and the worker is never asked."""
    where = f"{request.model_file} in {request.container_path}"

    def invalid(why: str) -> JobFailure:
        return JobFailure(MODEL_FILE_INVALID, why, retryable=False)

    base = os.path.abspath(artifact_dir)
    base_parts = [part for part in base.split("/") if part]
    parts = [part for part in request.container_path.split("/") if part not in ("", ".")]
    if ".." in parts or parts[: len(base_parts)] != base_parts:
        raise invalid(f"{request.container_path} is not below the artifact directory {artifact_dir}")
    below = parts[len(base_parts) :]
    *folders, name = request.model_file.split("/")
    try:
        base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise invalid(f"the artifact directory {artifact_dir} cannot be opened ({error.strerror})") from None
    try:
        artifact_fd = open_dir_chain(base_fd, below, create=False)
    except (JobFailure, OSError) as error:
        reason = error.strerror if isinstance(error, OSError) else "a symlink or a file is on its path"
        raise invalid(f"the artifact {request.container_path} cannot be opened ({reason})") from None
    finally:
        os.close(base_fd)
    try:
        manifest = read_json_at(artifact_fd, MANIFEST_NAME)
        if manifest is None:
            raise invalid(
                f"{request.container_path} has no readable {MANIFEST_NAME}: not an artifact this agent verified"
            )
        listed = [
            item
            for item in manifest.get("files") or []
            if isinstance(item, dict) and item.get("path") == request.model_file
        ]
        size = whole_number(listed[0].get("size")) if len(listed) == 1 else None
        if size is None:
            raise invalid(
                f"{request.model_file} is not listed (with its size) in the manifest of {request.container_path}"
            )
        try:
            folder_fd = open_dir_chain(artifact_fd, folders, create=False)
        except (JobFailure, OSError):
            raise invalid(f"{where} cannot be reached without a symlink") from None
        try:
            info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        except OSError as error:
            raise invalid(f"{where}: {error.strerror}") from None
        finally:
            os.close(folder_fd)
    finally:
        os.close(artifact_fd)
    if not stat.S_ISREG(info.st_mode):
        raise invalid(f"{where} is a symlink or not a regular file")
    if info.st_size != size:
        raise invalid(f"{where} has {info.st_size} bytes on disk; its manifest says {size}")
    return "/".join([*below, request.model_file])


class RuntimeRun:
    """One attempt of a runtime job in the worker (W1): submit it, poll its status every quarter
    second and relay it as progress, and cancel it there when the job is cancelled or abandoned."""

    def __init__(
        self, job: Job, worker: WorkerClient, control: JobControl, on_progress: Callable[[Progress], None]
    ) -> None:
        self.job, self.worker, self.control, self.on_progress = job, worker, control, on_progress
        # A fresh worker job id per run: a later attempt, or this one after an agent restart, must
        # never be answered with the status of an earlier run (the worker keeps the last one).
        self.worker_job_id = f"{job.id[:100]}-{job.attempt}-{uuid.uuid4().hex[:8]}"
        self.timeouts = 0

    def run(self, params: dict[str, object]) -> dict[str, object]:
        """The worker's result once it succeeds; JobFailure or JobAbandoned otherwise."""
        self.control.check()
        status: dict[str, object] | None = self.submit(params)
        log.info("job %s: running in the runtime worker as %s", self.job.id, self.worker_job_id)
        while True:
            if status is not None:
                self.report(status)
                if status["state"] != "running":
                    return self.outcome(status)
            if self.control.stopped.is_set():
                self.stop_in_worker()
            self.control.wait(WORKER_POLL_SECONDS)
            status = self.poll()

    def submit(self, params: dict[str, object]) -> dict[str, object]:
        """POST /v1/jobs; a worker still busy with a job of an earlier run (the agent restarted
        while it ran) has that job cancelled first. A timed-out submit is sent again: the same id
        answers its status, so a lost reply is harmless."""
        cancelled_stale = False
        while True:
            try:
                return self.status_of(self.worker.submit(self.worker_job_id, self.job.type, params))
            except WorkerError as error:
                if error.status == 409 and error.code == "WORKER_BUSY" and not cancelled_stale:
                    cancelled_stale = True
                    self.cancel_stale_job()
                    continue
                if error.timed_out and self.timeouts + 1 < WORKER_POLL_TIMEOUTS:
                    self.timeouts += 1
                    continue
                raise self.failure(error) from None

    def cancel_stale_job(self) -> None:
        """Cancel the job the worker says it runs (the agent is its only client and runs one job
        at a time, so it is a leftover), and wait a little for it to stop."""
        try:
            held = as_dict(self.worker.info().get("job"))
            stale = held.get("id")
            if not isinstance(stale, str) or held.get("state") != "running" or stale == self.worker_job_id:
                return
            log.warning(
                "job %s: the runtime worker still runs %s from an earlier run; cancelling it", self.job.id, stale
            )
            self.worker.cancel(stale)
            self.wait_until_stopped(stale)
        except WorkerError as error:
            raise self.failure(error) from None

    def wait_until_stopped(self, worker_job_id: str) -> bool:
        """Poll until the worker says the job no longer runs (or forgot it), at most a few seconds."""
        deadline = time.monotonic() + WORKER_CANCEL_WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                if self.worker.status(worker_job_id).get("state") != "running":
                    return True
            except WorkerError as error:
                if error.status == 404:
                    return True
                if error.status is None and not error.timed_out:
                    raise
            time.sleep(0.1)
        return False

    def poll(self) -> dict[str, object] | None:
        """GET the job's status; None after a timed-out poll that is not yet one too many."""
        try:
            status = self.status_of(self.worker.status(self.worker_job_id))
        except WorkerError as error:
            if error.timed_out and self.timeouts + 1 < WORKER_POLL_TIMEOUTS:
                self.timeouts += 1
                log.warning("job %s: the runtime worker %s; polling again", self.job.id, error.reason)
                return None
            raise self.failure(error) from None
        self.timeouts = 0
        return status

    def status_of(self, reply: dict[str, object]) -> dict[str, object]:
        """A job status as the protocol says it (our id, a known state), or WorkerError."""
        if reply.get("id") != self.worker_job_id or reply.get("state") not in WORKER_JOB_STATES:
            raise WorkerError(f"the worker answered for job {self.worker_job_id} without its id and a known state")
        return reply

    def report(self, status: dict[str, object]) -> None:
        """Pass the worker's phase and steps on as the job's progress (the reporter sends it)."""
        phase = short_text(status.get("phase"), 32)
        self.on_progress(
            Progress(
                phase=phase if phase else None,
                steps_done=whole_number(status.get("steps_done")),
                steps_total=whole_number(status.get("steps_total")),
            )
        )

    def outcome(self, status: dict[str, object]) -> dict[str, object]:
        """The result of a job that ended in the worker, or the failure it ended with."""
        state = status["state"]
        if state == "succeeded":
            result = status.get("result")
            if not isinstance(result, dict):
                raise JobFailure(
                    RUNTIME_WORKER_UNAVAILABLE, "the runtime worker reported success without a result", retryable=True
                )
            return result
        if state == "failed":
            error = as_dict(status.get("error"))
            code = error.get("code")
            if not isinstance(code, str) or not ERROR_CODE_PATTERN.fullmatch(code):
                raise JobFailure(
                    RUNTIME_WORKER_UNAVAILABLE,
                    "the runtime worker failed the job without an error code",
                    retryable=True,
                )
            message = short_text(error.get("message"), 1000) or "the runtime worker gave no message"
            raise JobFailure(code, message, retryable=error.get("retryable") is True and code not in NEVER_RETRIED)
        self.control.check()  # cancelled here: JOB_CANCELLED
        raise JobFailure(
            RUNTIME_WORKER_UNAVAILABLE,
            "the runtime worker cancelled the job on its own (was it stopping?)",
            retryable=True,
        )

    def stop_in_worker(self) -> None:
        """Cancelled or abandoned: cancel the job in the worker too, so it frees the model, then
        raise. A cancel waits (a few seconds at most) until the worker says it stopped; an abandon
        does not wait, the agent may be stopping."""
        try:
            self.worker.cancel(self.worker_job_id)
            if not self.control.abandoned.is_set() and not self.wait_until_stopped(self.worker_job_id):
                log.warning(
                    "job %s: the runtime worker did not confirm the cancel within %gs",
                    self.job.id,
                    WORKER_CANCEL_WAIT_SECONDS,
                )
        except WorkerError as error:
            log.warning("job %s: could not cancel it in the runtime worker: %s", self.job.id, error.reason)
        self.control.check()

    @staticmethod
    def failure(error: WorkerError) -> JobFailure:
        """How a worker's answer (or silence) fails the job: a gone worker is retryable
        RUNTIME_WORKER_UNAVAILABLE; a refusal carries the worker's own code."""
        if error.status is None or (error.status == 404 and error.code == "WORKER_JOB_UNKNOWN"):
            what = "no longer knows the job (it restarted)" if error.status else f"stopped answering: {error.reason}"
            return JobFailure(RUNTIME_WORKER_UNAVAILABLE, f"the runtime worker {what}", retryable=True)
        if error.status == 409:
            return JobFailure(
                RUNTIME_WORKER_UNAVAILABLE,
                f"the runtime worker stays busy with another job ({error.reason})",
                retryable=True,
            )
        if error.status == 400:
            message = f"the runtime worker refused the params: {error.message or error.reason}"
            return JobFailure(JOB_PARAMS_INVALID, message, retryable=False)
        if error.code is None:
            return JobFailure(RUNTIME_WORKER_UNAVAILABLE, f"the runtime worker answered {error.reason}", retryable=True)
        retryable = (error.retryable or error.status >= 500) and error.code not in NEVER_RETRIED
        return JobFailure(error.code, error.message or error.reason, retryable=retryable)


def run_runtime_job(
    job: Job, config: Config, control: JobControl, on_progress: Callable[[Progress], None]
) -> dict[str, object]:
    """The runtime.benchmark.v1 and runtime.generate.v1 handler (W1, W2): check that the model
    file belongs to an artifact verified here, run the job in the worker, and return its result
    with the artifact id and model file added."""
    request = RuntimeRequest.from_params(job.params)
    model_path = verified_model_path(request, config.data_dirs["artifacts"])
    result = RuntimeRun(job, WorkerClient(config.worker_socket), control, on_progress).run(
        {**job.params, "model_path": model_path}
    )
    return {**result, "artifact_id": request.artifact_id, "model_file": request.model_file}


def _mean(result: dict[str, object], key: str) -> str:
    mean = as_dict(result.get(key)).get("mean")
    return f"{mean:.1f}" if isinstance(mean, int | float) and not isinstance(mean, bool) else "?"


def benchmark_summary(result: dict[str, object]) -> str:
    """`model.gguf: prompt 812.3 tokens/s, generation 91.2 tokens/s (cpu)` for the success log line."""
    backend = as_dict(result.get("engine")).get("backend")
    return (
        f"{result.get('model_file')}: prompt {_mean(result, 'prompt_tokens_per_second')} tokens/s, "
        f"generation {_mean(result, 'generate_tokens_per_second')} tokens/s ({backend})"
    )


def generate_summary(result: dict[str, object]) -> str:
    """`model.gguf: 2 prompt(s) answered` for the success log line."""
    outputs = result.get("outputs")
    return f"{result.get('model_file')}: {len(outputs) if isinstance(outputs, list) else 0} prompt(s) answered"


# --------------------------------------------------------------------------- deployments (S2)
#
# The control plane holds the desired state: the heartbeat reply carries this node's deployments
# whenever the agent's copy (deployments_etag) is out of date. After each heartbeat the agent
# makes the worker match it (PUT a deployment the worker lacks, DELETE one that should stop or
# that nobody wants), and reports each deployment's state as the worker has it, once per change.
# A worker that restarts has lost its models; the next reconcile loads them again.

WORKER_DEPLOYMENT_STATES = ("loading", "ready", "unloaded", "failed", "stopped")
WORKER_HELD_STATES = ("loading", "ready", "unloading", "unloaded")  # the worker keeps it; unloaded: no memory


@dataclass(frozen=True)
class DesiredDeployment:
    """One of this node's deployments as the heartbeat reply names it."""

    id: str
    name: str
    desired: str  # ready | stopped
    request: RuntimeRequest
    context_length: int | None
    n_gpu_layers: int | None
    idle_unload_seconds: int | None = None  # S2: None leaves it to the worker (never unloads)

    @classmethod
    def from_wire(cls, item: object) -> DesiredDeployment | None:
        entry = as_dict(item)
        deployment_id = entry.get("id")
        if not isinstance(deployment_id, str) or not 0 < len(deployment_id) <= 128 or not deployment_id.isprintable():
            return None
        if entry.get("desired") not in ("ready", "stopped"):
            return None
        try:
            # The same checks as a runtime job's file: a plain path inside an absolute artifact path.
            request = RuntimeRequest.from_params(
                {
                    "artifact_id": deployment_id,
                    "model_file": entry.get("model_file"),
                    "container_path": entry.get("container_path"),
                }
            )
        except JobFailure:
            return None
        return cls(
            id=deployment_id,
            name=short_text(entry.get("name"), 64) or deployment_id,
            desired=str(entry["desired"]),
            request=request,
            context_length=whole_number(entry.get("context_length")),
            n_gpu_layers=entry.get("n_gpu_layers") if isinstance(entry.get("n_gpu_layers"), int) else None,
            idle_unload_seconds=whole_number(entry.get("idle_unload_seconds")),
        )


class Deployments:
    """This node's deployments: the desired list, the worker's, and what was reported (S2)."""

    def __init__(self, client: Client, worker: WorkerClient, artifact_dir: Path) -> None:
        self.client = client
        self.worker = worker
        self.artifact_dir = artifact_dir
        self.etag: str | None = None
        self.desired: dict[str, DesiredDeployment] = {}
        self.reported: dict[str, tuple[str, str | None]] = {}  # id -> (state, error code) the control plane has
        self.refused: dict[str, JobFailure] = {}  # id -> why the agent itself would not load it

    def heartbeat_fields(self) -> dict[str, object]:
        """The etag of the list we hold; none at first, so the first reply carries the list."""
        return {} if self.etag is None else {"deployments_etag": self.etag}

    def take_reply(self, reply: dict[str, object]) -> None:
        """Keep the list a heartbeat reply carries (only when our etag was out of date)."""
        etag, items = reply.get("deployments_etag"), reply.get("deployments")
        if not isinstance(etag, str) or not isinstance(items, list):
            return
        parsed = [DesiredDeployment.from_wire(item) for item in items]
        kept = {each.id: each for each in parsed if each is not None}
        if len(kept) != len(parsed):
            log.warning("%d deployment(s) in the heartbeat reply were not usable; ignored", len(parsed) - len(kept))
        if kept != self.desired:
            log.info(
                "deployments: %s",
                ", ".join(f"{each.name} ({each.desired})" for each in kept.values()) or "none",
            )
        self.etag, self.desired = etag, kept
        self.refused = {key: value for key, value in self.refused.items() if key in kept}
        self.reported = {key: value for key, value in self.reported.items() if key in kept}

    def reconcile(self, worker_serves: bool) -> None:
        """Make the worker match the desired list and report what changed; never raises."""
        if not self.desired and not self.reported:
            return
        if not worker_serves:  # nothing is loaded here: what should stop has, what should run cannot
            for each in self.desired.values():
                if each.desired == "stopped":
                    self.report(each.id, "stopped", None)
                else:
                    unavailable = {
                        "code": RUNTIME_WORKER_UNAVAILABLE,
                        "message": "no runtime worker that serves answers on this node",
                    }
                    self.report(each.id, "failed", unavailable)
            return
        try:
            present = {
                str(item.get("id")): item
                for item in self.worker.request("GET", "/v1/deployments").get("deployments") or []
                if isinstance(item, dict)
            }
        except WorkerError as error:
            log.warning("the runtime worker did not list its deployments: %s", error.reason)
            return
        for deployment_id, status in present.items():  # loaded for nobody: the control plane is the desired state
            wanted = self.desired.get(deployment_id)
            if (wanted is None or wanted.desired == "stopped") and status.get("state") in WORKER_HELD_STATES:
                if self.stop_in_worker(deployment_id):
                    present[deployment_id] = {**status, "state": "stopped"}
        for each in self.desired.values():
            if each.desired == "stopped":
                still_loaded = as_dict(present.get(each.id)).get("state") in ("loading", "ready")
                if not still_loaded:  # never while the worker still holds its memory
                    self.report(each.id, "stopped", None)
                continue
            status = present.get(each.id)
            if status is None:
                status = self.start_in_worker(each)
                if status is None:
                    continue
            state = status.get("state")
            if state not in WORKER_DEPLOYMENT_STATES:
                continue
            error = as_dict(status.get("error")) or None
            self.report(each.id, str(state), error, as_dict(status.get("measured")), status.get("context_length"))

    def start_in_worker(self, each: DesiredDeployment) -> dict[str, object] | None:
        """PUT the deployment to the worker: its status, or None after reporting why not."""
        refused = self.refused.get(each.id)
        if refused is None:
            try:
                model_path = verified_model_path(each.request, self.artifact_dir)
            except JobFailure as failure:
                refused = self.refused[each.id] = failure
        if refused is not None:
            self.report(each.id, "failed", {"code": refused.code, "message": refused.message})
            return None
        body: dict[str, object] = {"model_path": model_path}
        if each.context_length is not None:
            body["context_length"] = each.context_length
        if each.n_gpu_layers is not None:
            body["n_gpu_layers"] = each.n_gpu_layers
        if each.idle_unload_seconds is not None:
            body["idle_unload_seconds"] = each.idle_unload_seconds
        try:
            status = self.worker.request("PUT", f"/v1/deployments/{quote_id(each.id)}", body)
        except WorkerError as error:
            code = error.code if error.code in (MODEL_FILE_INVALID, MODEL_LOAD_FAILED) else RUNTIME_WORKER_UNAVAILABLE
            self.report(each.id, "failed", {"code": code, "message": error.message or error.reason})
            return None
        log.info("deployment %s: the runtime worker is loading %s", each.name, each.request.model_file)
        return status

    def stop_in_worker(self, deployment_id: str) -> bool:
        """DELETE it in the worker (its model is freed); whether the worker says it stopped."""
        try:
            status = self.worker.request("DELETE", f"/v1/deployments/{quote_id(deployment_id)}")
        except WorkerError as error:
            log.warning(
                "deployment %s: the runtime worker did not stop it: %s; trying again", deployment_id, error.reason
            )
            return False
        log.info("deployment %s: stopped in the runtime worker", deployment_id)
        return status.get("state") == "stopped"

    def report(
        self,
        deployment_id: str,
        state: str,
        error: dict[str, object] | None,
        measured: dict[str, object] | None = None,
        context_length: object = None,
    ) -> None:
        """POST the deployment's state once per change (state and error code); a failed post is tried
        again after the next heartbeat."""
        code = str(error.get("code")) if error else None
        if self.reported.get(deployment_id) == (state, code):
            return
        body: dict[str, object] = {**wire_versions(), "state": state, "error": None, "measured": None}
        if error:
            body["error"] = {"code": code, "message": short_text(error.get("message"), 1000) or code}
        if state == "ready" and measured:
            body["measured"] = {
                "load_seconds": measured.get("load_seconds"),
                "memory_bytes": whole_number(measured.get("memory_bytes")),
                "context_length": whole_number(context_length),
            }
        try:
            self.client.post(f"/api/v1/agent/deployments/{quote_id(deployment_id)}/status", body)
        except PublishError as failure:
            log.warning(
                "deployment %s: %s; its state goes again after the next heartbeat", deployment_id, failure.describe()
            )
            return
        self.reported[deployment_id] = (state, code)
        log.info("deployment %s: reported %s%s", deployment_id, state, f" ({code})" if code else "")


def quote_id(value: str) -> str:
    """An id as one path segment."""
    return quote(value, safe="")


register_job_type(RUNTIME_BENCHMARK_JOB_TYPE, run_runtime_job, benchmark_summary)
register_job_type(RUNTIME_GENERATE_JOB_TYPE, run_runtime_job, generate_summary)
