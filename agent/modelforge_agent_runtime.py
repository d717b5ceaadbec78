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

from modelforge_node_agent import (
    ERROR_CODE_PATTERN,
    JOB_PARAMS_INVALID,
    MANIFEST_NAME,
    RUNTIME_BENCHMARK_JOB_TYPE,
    RUNTIME_GENERATE_JOB_TYPE,
    RUNTIME_WORKER_UNAVAILABLE,
    Config,
    Job,
    JobControl,
    JobFailure,
    Progress,
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


register_job_type(RUNTIME_BENCHMARK_JOB_TYPE, run_runtime_job, benchmark_summary)
register_job_type(RUNTIME_GENERATE_JOB_TYPE, run_runtime_job, generate_summary)
