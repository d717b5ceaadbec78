"""ModelForge runtime worker: runs GGUF models for the node agent, over a Unix socket (W1, W2).

It holds no credential and needs no network: the node agent is its only client, speaking HTTP/1.1
on a Unix stream socket (protocol version 1, worker/README.md). It runs one job at a time:
runtime.benchmark.v1 measures a model as llama-bench does, runtime.generate.v1 completes prompts
at temperature 0 with a fixed seed. Standard library + llama-cpp-python; llama_cpp is imported
only when a job runs or the engine is asked about, and pynvml only when the accelerator mode
allows a GPU, so an idle worker stays small.

The worker never loads a model itself: each job runs in an engine process it starts, watches
(every wait on it has a deadline) and kills when the job is cancelled, abandoned or overdue, so a
model that crashes llama.cpp fails its job and the worker keeps serving (issue 22).

Sections: constants, configuration, NVML, engine, model files, job requests, measurement, engine
process, jobs, socket server, command line.

    python3 -m modelforge_runtime_worker [--check] [--version]

Exit codes: 0 stopped cleanly (SIGTERM, SIGINT); 2 a setting is invalid, the message names the
variable; 3 the accelerator mode cannot be met, the engine is not installed, or a live worker
already answers on the socket.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import queue
import random
import re
import select
import signal
import socket
import socketserver
import stat
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

# --------------------------------------------------------------------------- constants

WORKER_VERSION = "0.1.0"
PROTOCOL_VERSION = 1

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 3
EXIT_ENGINE_ORPHANED = 4  # the engine process's own: the worker that started it is gone

DEFAULT_SOCKET = "/run/modelforge/worker.sock"
DEFAULT_ARTIFACT_DIR = "/data/artifacts"
ACCELERATOR_MODES = ("nvidia", "cpu", "auto")
UNIX_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one NUL
SOCKET_MODE = 0o660  # W1: agent and worker run as the same user and share the socket's volume
MAX_REQUEST_BYTES = 64 * 1024
DRAIN_LIMIT_BYTES = 1 << 20  # a body over the limit but under this is read before the 413 goes out
CONNECTION_IDLE_SECONDS = 60.0  # a kept-alive connection with no request for this long is closed
STALE_PROBE_SECONDS = 1.0
CANCEL_REPLY_WAIT_SECONDS = 1.0  # the cancel reply waits this long for the job to have stopped
STOP_WAIT_SECONDS = 5.0  # how long SIGTERM waits for a cancelled job to free its model
SAMPLE_INTERVAL_SECONDS = 0.05  # peak GPU memory sampling during a job

# The engine process, one per job (see "engine process" below), and every wait on it.
ENGINE_MODULE = "modelforge_runtime_worker"  # started as `python3 -m` this module, as the worker is
ENGINE_START_SECONDS = 60.0  # from spawn to `ready` (llama.cpp imported; CUDA's libraries are big)
ENGINE_BEAT_SECONDS = 1.0  # it says `alive` this often …
ENGINE_SILENCE_SECONDS = 15.0  # … and is killed as frozen after this long without a word
MODEL_LOAD_SECONDS = 900.0  # loading the model (tens of GB from a slow disk)
JOB_SECONDS = 6 * 3600.0  # the whole job, whatever its params
ENGINE_EXIT_SECONDS = 5.0  # after its last word it exits within this; after SIGKILL it is reaped within this
ENGINE_LAST_WORDS = 4  # lines of its stdout/stderr kept for a crash's error message
ENGINE_LINE_CHARS = 500
DEFAULT_ABANDON_SECONDS = 120.0  # a running job nobody asks about this long is cancelled (the agent polls 4/s)
ABANDON_SECONDS_RANGE = (1.0, 86400.0)
UBATCH_TOKENS = 512  # llama-bench's default n_ubatch: pp512 is one micro-batch, longer prompts several

ENGINE_NAME = "llama.cpp"
BENCHMARK_JOB_TYPE = "runtime.benchmark.v1"
GENERATE_JOB_TYPE = "runtime.generate.v1"
JOB_TYPES = (BENCHMARK_JOB_TYPE, GENERATE_JOB_TYPE)
SEED = 42  # W2: generation and benchmark token choice are fixed, so results repeat
JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_NAME_CHARS = 1024  # artifact_id, model_file
MAX_PATH_CHARS = 4096

# Parameter ranges (W2); a value outside is refused with 400 naming the field.
N_GPU_LAYERS_RANGE = (-1, 1000)
PROMPT_TOKENS_RANGE = (1, 8192)
GENERATE_TOKENS_RANGE = (1, 4096)
REPETITIONS_RANGE = (1, 50)
MAX_TOKENS_RANGE = (1, 4096)
PROMPTS_RANGE = (1, 16)
MAX_PROMPT_CHARS = 8000
BENCHMARK_DEFAULTS = {"prompt_tokens": 512, "generate_tokens": 128, "repetitions": 5}
GENERATE_DEFAULT_MAX_TOKENS = 64
# Serving (S2, S5): deployments keep their model loaded in an engine process of their own.
MAX_DEPLOYMENTS = 4  # models loaded at once by one worker
SERVE_SLOTS = 4  # generations one deployment decodes together (bench/slots.py)
DEPLOYMENT_QUEUE = 8  # requests waiting for a deployment beyond those its slots generate (429 past it)
CONTEXT_TOKENS_RANGE = (16, 8192)  # S2: the default is the model's own, capped at the top of this
IDLE_UNLOAD_RANGE = (0, 7 * 86_400)  # S2: seconds without a request before the model is freed; 0 never
LIVE_DEPLOYMENT_STATES = ("loading", "ready", "unloading", "unloaded")  # kept; stopped or failed are not
MAX_SERVE_PROMPT_CHARS = 48 * 1024  # a prompt or the messages' text together; the body limit binds first
MESSAGES_RANGE = (1, 256)
CHAT_ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
MAX_LOGIT_BIAS = 300
LOGIT_BIAS_RANGE = (-100.0, 100.0)
TEMPERATURE_RANGE = (0.0, 2.0)
SEED_RANGE = (0, 2**32 - 1)
SERVE_KINDS = ("completion", "chat")
STREAM_POLL_SECONDS = 0.1  # a streaming answer checks this often whether its client hung up
# The chat template: the GGUF's tokenizer.chat_template when it has one (as llama-cpp-python does),
# else llama-cpp-python's own fallback, the Llama 2 format.
FALLBACK_CHAT_FORMAT = "llama-2"

# Error codes: the request's (4xx), the worker's (5xx), and the job's (in a job's status).
WORKER_REQUEST_INVALID = "WORKER_REQUEST_INVALID"
WORKER_REQUEST_TOO_LARGE = "WORKER_REQUEST_TOO_LARGE"
WORKER_ROUTE_UNKNOWN = "WORKER_ROUTE_UNKNOWN"
WORKER_METHOD_NOT_ALLOWED = "WORKER_METHOD_NOT_ALLOWED"
WORKER_JOB_UNKNOWN = "WORKER_JOB_UNKNOWN"
WORKER_BUSY = "WORKER_BUSY"
WORKER_INTERNAL_ERROR = "WORKER_INTERNAL_ERROR"
MODEL_FILE_INVALID = "MODEL_FILE_INVALID"
MODEL_LOAD_FAILED = "MODEL_LOAD_FAILED"  # the model did not load: llama.cpp refused it, or died of it
RUNTIME_FAILED = "RUNTIME_FAILED"  # llama.cpp reported an error while running the job
RUNTIME_ENGINE_CRASHED = "RUNTIME_ENGINE_CRASHED"  # the engine process died (or froze) while running it
JOB_CANCELLED = "JOB_CANCELLED"
WORKER_DEPLOYMENT_UNKNOWN = "WORKER_DEPLOYMENT_UNKNOWN"
WORKER_DEPLOYMENT_CONFLICT = "WORKER_DEPLOYMENT_CONFLICT"
WORKER_DEPLOYMENT_NOT_READY = "WORKER_DEPLOYMENT_NOT_READY"
PROMPT_TOO_LONG = "PROMPT_TOO_LONG"

GGUF_MAGIC = b"GGUF"
GGML_BASE_LIBRARY = "libggml-base.so.0"  # ggml's core as llama-cpp-python 0.3.36 ships it (ggml_abort)
# ggml log levels (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line).
GGML_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
GGML_LOG_CONT = 5

log = logging.getLogger("modelforge_runtime_worker")

# --------------------------------------------------------------------------- configuration


class ConfigError(Exception):
    """A setting is invalid; the message names the variable. main() exits 2 with it."""


class Unavailable(Exception):
    """The worker cannot serve here (no GPU in nvidia mode, no engine, socket in use); exit 3."""


@dataclass(frozen=True)
class Config:
    """The worker's settings, from MODELFORGE_WORKER_* variables."""

    socket_path: Path
    artifact_dir: Path
    accelerator_mode: str
    abandon_seconds: float = DEFAULT_ABANDON_SECONDS


def _socket_path(env: dict[str, str]) -> Path:
    """MODELFORGE_WORKER_SOCKET: where to listen; it must fit in a sockaddr_un."""
    value = env.get("MODELFORGE_WORKER_SOCKET", "").strip() or DEFAULT_SOCKET
    if "\0" in value:
        raise ConfigError("MODELFORGE_WORKER_SOCKET must not contain a NUL byte")
    if len(os.fsencode(value)) > UNIX_SOCKET_PATH_MAX:
        raise ConfigError(
            f"MODELFORGE_WORKER_SOCKET is {len(os.fsencode(value))} bytes long; "
            f"a Unix socket path holds at most {UNIX_SOCKET_PATH_MAX}"
        )
    return Path(value)


def _artifact_dir(env: dict[str, str]) -> Path:
    """MODELFORGE_WORKER_ARTIFACT_DIR: the directory model paths are relative to; it must exist."""
    value = env.get("MODELFORGE_WORKER_ARTIFACT_DIR", "").strip() or DEFAULT_ARTIFACT_DIR
    path = Path(value)
    if not path.is_dir():
        raise ConfigError(
            f"MODELFORGE_WORKER_ARTIFACT_DIR={value} is not an existing directory; mount the artifacts there"
        )
    return path


def _abandon_seconds(env: dict[str, str]) -> float:
    """MODELFORGE_WORKER_ABANDON_SECONDS: a running job nobody asks about this long is cancelled."""
    value = env.get("MODELFORGE_WORKER_ABANDON_SECONDS", "").strip()
    if not value:
        return DEFAULT_ABANDON_SECONDS
    low, high = ABANDON_SECONDS_RANGE
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not low <= seconds <= high:
        raise ConfigError(f"MODELFORGE_WORKER_ABANDON_SECONDS must be a number of seconds from {low:g} to {high:g}")
    return seconds


def load_config(env: dict[str, str]) -> Config:
    """Read and check every setting, or raise ConfigError naming the first bad one."""
    mode = env.get("MODELFORGE_WORKER_ACCELERATOR_MODE", "").strip().lower() or "auto"
    if mode not in ACCELERATOR_MODES:
        raise ConfigError(
            f"MODELFORGE_WORKER_ACCELERATOR_MODE must be one of {', '.join(ACCELERATOR_MODES)}, not {mode!r}"
        )
    return Config(
        socket_path=_socket_path(env),
        artifact_dir=_artifact_dir(env),
        accelerator_mode=mode,
        abandon_seconds=_abandon_seconds(env),
    )


# --------------------------------------------------------------------------- NVML


def _text(value) -> str:
    """NVML strings arrive as bytes from older nvidia-ml-py releases, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML for the worker: the GPUs it may use and their memory in use; None of it in cpu mode.

    In `cpu` mode pynvml is never imported. In `auto` mode a missing library, a failed init or no
    GPU means CPU only. In `nvidia` mode each of those is Unavailable (exit 3).
    """

    def __init__(self, module=None, handles: list | None = None, devices: list[dict] | None = None) -> None:
        self._module = module
        self._handles = handles or []
        self.devices: list[dict] = devices or []

    @classmethod
    def open(cls, mode: str) -> Nvml:
        """Initialise NVML as the accelerator mode says and read the devices once."""
        if mode == "cpu":
            return cls()
        try:
            pynvml = importlib.import_module("pynvml")
        except ImportError as error:
            return cls._without(mode, f"pynvml cannot be imported ({error})")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            return cls._without(mode, f"NVML did not initialise ({type(error).__name__}: {error})")
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(pynvml.nvmlDeviceGetCount())]
            devices = [cls._device(pynvml, handle) for handle in handles]
        except pynvml.NVMLError as error:
            cls._shutdown(pynvml)
            return cls._without(mode, f"NVML could not list the GPUs ({type(error).__name__}: {error})")
        if not handles:
            cls._shutdown(pynvml)
            return cls._without(mode, "NVML reports no GPU")
        return cls(pynvml, handles, devices)

    @classmethod
    def _without(cls, mode: str, reason: str) -> Nvml:
        """No GPU: fine in auto mode (logged), Unavailable in nvidia mode."""
        if mode == "nvidia":
            raise Unavailable(f"MODELFORGE_WORKER_ACCELERATOR_MODE=nvidia but {reason}")
        log.info("no GPU in use (auto mode): %s", reason)
        return cls()

    @staticmethod
    def _device(pynvml, handle) -> dict:
        """One GPU as /v1/info reports it."""
        return {
            "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
            "name": _text(pynvml.nvmlDeviceGetName(handle)),
            "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        }

    @staticmethod
    def _shutdown(pynvml) -> None:
        """Release NVML; an error here changes nothing for anyone."""
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.debug("nvmlShutdown: %s", error)

    def close(self) -> None:
        """Release NVML if it was initialised."""
        if self._module is not None:
            self._shutdown(self._module)
            self._module = None

    def memory_used_bytes(self) -> int | None:
        """Device memory in use now, summed over the GPUs; None when a GPU cannot be read."""
        if self._module is None:
            return None
        try:
            return sum(int(self._module.nvmlDeviceGetMemoryInfo(handle).used) for handle in self._handles)
        except self._module.NVMLError as error:
            log.debug("GPU memory sample failed: %s", error)
            return None


# --------------------------------------------------------------------------- engine


class Engine:
    """llama-cpp-python, imported on first use and kept; its C log lines go to this log.

    llama.cpp's INFO and DEBUG chatter is dropped; its warnings and errors (a model that will not
    load says why here) are logged. Llama(verbose=False) points fds 1 and 2 at /dev/null while a
    model loads, so this process logs through its own copy of fd 2 (configure_logging).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._module = None
        self._log_callback = None  # kept referenced: llama.cpp calls it for the life of the process
        self._abort_callback = None  # the same
        self._last_level = logging.INFO
        self._info: dict | None = None
        self.first_error: str | None = None  # llama.cpp's first error line since clear_errors()

    @staticmethod
    def installed() -> bool:
        """Whether llama_cpp can be imported, without importing it."""
        return importlib.util.find_spec("llama_cpp") is not None

    def module(self):
        """Import llama_cpp once and route its logs."""
        with self._lock:
            if self._module is None:
                llama_cpp = importlib.import_module("llama_cpp")
                self._log_callback = llama_cpp.llama_log_callback(self._route_log)
                llama_cpp.llama_log_set(self._log_callback, ctypes.c_void_p(0))
                self._module = llama_cpp
            return self._module

    def _route_log(self, level: int, text: bytes, _user_data) -> None:
        """One llama.cpp log fragment: warnings and errors to this log, the rest dropped."""
        level = self._last_level if level == GGML_LOG_CONT else GGML_LOG_LEVELS.get(level, logging.DEBUG)
        self._last_level = level
        message = text.decode("utf-8", "replace").strip()
        if message and level >= logging.WARNING:
            log.log(level, "llama.cpp: %s", message)
        if message and level >= logging.ERROR and self.first_error is None:
            self.first_error = message

    def clear_errors(self) -> None:
        """Forget llama.cpp's earlier error lines (one job at a time: the next ones are its own)."""
        self.first_error = None

    def report_aborts(self, report: Callable[[str], None]) -> None:
        """Hand ggml's abort message (a failed GGML_ASSERT) to `report` before it aborts the
        process; without this it goes to stderr, which llama-cpp-python points at /dev/null while a
        model loads. For the engine process: the worker hears why it died."""
        self.module()  # loads ggml; RTLD_NOLOAD takes that copy, never another one on the system
        try:
            setter = ctypes.CDLL(GGML_BASE_LIBRARY, mode=os.RTLD_NOLOAD | os.RTLD_NOW).ggml_set_abort_callback
        except (OSError, AttributeError) as error:  # another build or an older ggml: stderr as before
            log.warning("ggml's abort messages stay on stderr: %s", error)
            return
        prototype = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
        setter.argtypes, setter.restype = [prototype], ctypes.c_void_p
        self._abort_callback = prototype(lambda message: report((message or b"").decode("utf-8", "replace")))
        setter(self._abort_callback)

    def info(self) -> dict:
        """The engine as /v1/info and results name it."""
        if self._info is None:
            llama_cpp = self.module()
            backend = "cuda" if llama_cpp.llama_supports_gpu_offload() else "cpu"
            self._info = {"name": ENGINE_NAME, "version": llama_cpp.__version__, "backend": backend}
        return dict(self._info)


# --------------------------------------------------------------------------- model files


class RequestError(Exception):
    """A request the worker refuses: its HTTP status and the one JSON error shape."""

    def __init__(self, status: int, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable

    def to_wire(self) -> dict:
        """The error body every refusal carries."""
        return {"error": {"code": self.code, "message": self.message, "retryable": self.retryable}}


def invalid(field: str, message: str) -> RequestError:
    """400 WORKER_REQUEST_INVALID naming the field."""
    return RequestError(400, WORKER_REQUEST_INVALID, f"{field}: {message}")


def resolve_model_path(artifact_dir: Path, model_path: str) -> Path:
    """The model file under artifact_dir, symlinks resolved, or 422 MODEL_FILE_INVALID.

    Refused: an absolute path, a `..` part, a path that resolves outside the artifact directory,
    anything but a regular file.
    """

    def refuse(why: str) -> RequestError:
        return RequestError(422, MODEL_FILE_INVALID, f"params.model_path {model_path!r} {why}")

    relative = PurePosixPath(model_path)
    if relative.is_absolute():
        raise refuse("is absolute; it must be relative to the artifact directory")
    if ".." in relative.parts:
        raise refuse("has a '..' part")
    root = Path(os.path.realpath(artifact_dir))
    resolved = Path(os.path.realpath(root / relative))
    if resolved != root and root not in resolved.parents:
        raise refuse("resolves outside the artifact directory")
    try:
        mode = resolved.stat().st_mode
    except OSError as error:
        raise refuse(f"cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(mode):
        raise refuse("is not a regular file")
    return resolved


# --------------------------------------------------------------------------- job requests


@dataclass(frozen=True)
class BenchmarkParams:
    """runtime.benchmark.v1 params, checked."""

    model_path: str
    model_file: str
    n_gpu_layers: int | None
    prompt_tokens: int
    generate_tokens: int
    repetitions: int

    @property
    def steps_total(self) -> int:
        """Load, warm-up, the prompt and generation runs, time to first token."""
        return 2 + 2 * self.repetitions + 1


@dataclass(frozen=True)
class GenerateParams:
    """runtime.generate.v1 params, checked."""

    model_path: str
    model_file: str
    prompts: tuple[str, ...]
    max_tokens: int

    @property
    def steps_total(self) -> int:
        """Load, then one step per prompt."""
        return 1 + len(self.prompts)


@dataclass(frozen=True)
class JobRequest:
    """A POST /v1/jobs body, checked."""

    id: str
    type: str
    params: BenchmarkParams | GenerateParams


def _int(params: dict, name: str, default: int | None, bounds: tuple[int, int], prefix: str = "params.") -> int | None:
    """An optional whole number within bounds (a bool is not one); errors name `prefix` + `name`."""
    value = params.get(name, default)
    if value is None:
        return None
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"{prefix}{name}", f"must be a whole number from {low} to {high}")
    return value


def _string(
    params: dict, name: str, *, required: bool, limit: int = MAX_NAME_CHARS, prefix: str = "params."
) -> str | None:
    """A non-empty string of at most `limit` characters with no NUL."""
    value = params.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > limit or "\0" in value:
        raise invalid(f"{prefix}{name}", f"must be a non-empty string of at most {limit} characters")
    return value


def _model(params: dict) -> tuple[str, str]:
    """model_path (relative to the artifact directory) and the model_file name results carry."""
    model_path = _string(params, "model_path", required=True, limit=MAX_PATH_CHARS)
    _string(params, "artifact_id", required=False)
    model_file = _string(params, "model_file", required=False) or PurePosixPath(model_path).name
    return model_path, model_file


def parse_job_request(body: object) -> JobRequest:
    """Check a job submission; unknown params are ignored, so a newer control plane can add some."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    job_id = body.get("id")
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
        raise invalid("id", "must be 1-128 letters, digits, '.', '_' or '-'")
    job_type = body.get("type")
    if job_type not in JOB_TYPES:
        raise invalid("type", f"must be one of {', '.join(JOB_TYPES)}")
    params = body.get("params")
    if not isinstance(params, dict):
        raise invalid("params", "must be a JSON object")
    model_path, model_file = _model(params)
    if job_type == BENCHMARK_JOB_TYPE:
        checked: BenchmarkParams | GenerateParams = BenchmarkParams(
            model_path=model_path,
            model_file=model_file,
            n_gpu_layers=_int(params, "n_gpu_layers", None, N_GPU_LAYERS_RANGE),
            prompt_tokens=_int(params, "prompt_tokens", BENCHMARK_DEFAULTS["prompt_tokens"], PROMPT_TOKENS_RANGE),
            generate_tokens=_int(
                params, "generate_tokens", BENCHMARK_DEFAULTS["generate_tokens"], GENERATE_TOKENS_RANGE
            ),
            repetitions=_int(params, "repetitions", BENCHMARK_DEFAULTS["repetitions"], REPETITIONS_RANGE),
        )
    else:
        prompts = params.get("prompts")
        low, high = PROMPTS_RANGE
        if (
            not isinstance(prompts, list)
            or not low <= len(prompts) <= high
            or not all(isinstance(prompt, str) and len(prompt) <= MAX_PROMPT_CHARS for prompt in prompts)
        ):
            raise invalid(
                "params.prompts", f"must be a list of {low} to {high} strings of at most {MAX_PROMPT_CHARS} characters"
            )
        checked = GenerateParams(
            model_path=model_path,
            model_file=model_file,
            prompts=tuple(prompts),
            max_tokens=_int(params, "max_tokens", GENERATE_DEFAULT_MAX_TOKENS, MAX_TOKENS_RANGE),
        )
    return JobRequest(id=job_id, type=job_type, params=checked)


# --------------------------------------------------------------------------- serving requests


@dataclass(frozen=True)
class DeploymentSpec:
    """A PUT /v1/deployments/{id} body, checked: what the deployment's engine process loads."""

    model_path: str
    context_length: int | None  # None: the model's own, capped at CONTEXT_TOKENS_RANGE's top
    n_gpu_layers: int | None
    idle_unload_seconds: int = 0  # S2: free the model after this long without a request; 0 never


@dataclass(frozen=True)
class GenerationRequest:
    """A POST /v1/deployments/{id}/generate body, checked (S4's parameters)."""

    kind: str
    prompt: str | None
    messages: tuple[dict, ...] | None
    max_tokens: int | None  # None: as many as the context leaves
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    logit_bias: dict[str, float]

    def to_engine(self) -> dict:
        return {**dataclasses.asdict(self), "messages": list(self.messages) if self.messages else None}


def parse_deployment_spec(body: object) -> DeploymentSpec:
    """Check a deployment's body; unknown fields are ignored, as for jobs."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    return DeploymentSpec(
        model_path=_string(body, "model_path", required=True, limit=MAX_PATH_CHARS, prefix=""),
        context_length=_int(body, "context_length", None, CONTEXT_TOKENS_RANGE, prefix=""),
        n_gpu_layers=_int(body, "n_gpu_layers", None, N_GPU_LAYERS_RANGE, prefix=""),
        idle_unload_seconds=_int(body, "idle_unload_seconds", 0, IDLE_UNLOAD_RANGE, prefix=""),
    )


def _number(body: dict, name: str, default: float, bounds: tuple[float, float]) -> float:
    value = body.get(name, default)
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise invalid(name, f"must be a number from {low:g} to {high:g}")
    return float(value)


def _text_field(value: object, name: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit or "\0" in value:
        raise invalid(name, f"must be a string of at most {limit} characters without NUL")
    return value


def parse_generation_request(body: object) -> GenerationRequest:
    """Check a generation request: a completion's prompt or a chat's messages, and S4's sampling
    parameters, each bounded; anything wrong is a 400 naming the field."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    kind = body.get("kind")
    if kind not in SERVE_KINDS:
        raise invalid("kind", f"must be one of {', '.join(SERVE_KINDS)}")
    prompt = messages = None
    if kind == "completion":
        prompt = _text_field(body.get("prompt"), "prompt", MAX_SERVE_PROMPT_CHARS)
    else:
        raw = body.get("messages")
        low, high = MESSAGES_RANGE
        if not isinstance(raw, list) or not low <= len(raw) <= high:
            raise invalid("messages", f"must be a list of {low} to {high} messages")
        checked = []
        for index, message in enumerate(raw):
            if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
                raise invalid(f"messages[{index}].role", f"must be one of {', '.join(CHAT_ROLES)}")
            content = _text_field(message.get("content"), f"messages[{index}].content", MAX_SERVE_PROMPT_CHARS)
            checked.append({"role": message["role"], "content": content})
        if sum(len(message["content"]) for message in checked) > MAX_SERVE_PROMPT_CHARS:
            raise invalid("messages", f"hold at most {MAX_SERVE_PROMPT_CHARS} characters together")
        messages = tuple(checked)
    stop = body.get("stop")
    stops = (
        (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else () if stop is None else None
    )
    if (
        stops is None
        or len(stops) > MAX_STOP_STRINGS
        or not all(isinstance(each, str) and 0 < len(each) <= MAX_STOP_CHARS for each in stops)
    ):
        raise invalid(
            "stop",
            f"must be a string or a list of at most {MAX_STOP_STRINGS} strings of 1 to {MAX_STOP_CHARS} characters",
        )
    bias = body.get("logit_bias") or {}
    low, high = LOGIT_BIAS_RANGE
    if (
        not isinstance(bias, dict)
        or len(bias) > MAX_LOGIT_BIAS
        or not all(
            isinstance(token, str) and token.isascii() and token.isdigit() and len(token) <= 9
            and not isinstance(value, bool) and isinstance(value, int | float) and low <= value <= high
            for token, value in bias.items()
        )
    ):  # fmt: skip
        raise invalid(
            "logit_bias",
            f"must map at most {MAX_LOGIT_BIAS} token ids (as strings) to numbers from {low:g} to {high:g}",
        )
    top_p = _number(body, "top_p", 1.0, (0.0, 1.0))
    if top_p == 0.0:
        raise invalid("top_p", "must be more than 0 and at most 1")
    return GenerationRequest(
        kind=kind,
        prompt=prompt,
        messages=messages,
        max_tokens=_int(body, "max_tokens", None, (1, CONTEXT_TOKENS_RANGE[1]), prefix=""),
        temperature=_number(body, "temperature", 1.0, TEMPERATURE_RANGE),
        top_p=top_p,
        seed=_int(body, "seed", None, SEED_RANGE, prefix=""),
        stop=stops,
        logit_bias={token: float(value) for token, value in bias.items()},
    )


# --------------------------------------------------------------------------- measurement


class Cancelled(Exception):
    """The job was cancelled (or abandoned): its engine process is killed, which frees the model."""

    def __init__(self, message: str = "the job was cancelled") -> None:
        super().__init__(message)
        self.message = message


def _read_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A `VmRSS`/`VmHWM`-style line of /proc/<pid>/status, in bytes."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class GpuPeak:
    """The job's peak GPU memory in use: NVML sampled every 50 ms by the worker while the engine
    process runs, summed over the job's GPUs (None when the job uses none, never invented)."""

    def __init__(self, nvml: Nvml | None, uses_gpu: bool) -> None:
        self._nvml = nvml if uses_gpu else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_bytes: int | None = None

    def __enter__(self) -> GpuPeak:
        if self._nvml is not None:
            self._sample()
            self._thread = threading.Thread(target=self._run, name="gpu-peak", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_SECONDS):
            self._sample()

    def _sample(self) -> None:
        used = self._nvml.memory_used_bytes()
        if used is not None:
            self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)


def spread(samples: list[float]) -> dict:
    """Mean, sample standard deviation (0 for one sample) and the samples, as results carry them."""
    return {
        "mean": round(statistics.mean(samples), 3),
        "stddev": round(statistics.stdev(samples), 3) if len(samples) > 1 else 0.0,
        "samples": [round(sample, 3) for sample in samples],
    }


def benchmark_tokens(llm, count: int, rng: random.Random) -> list[int]:
    """`count` random token ids from the model's vocabulary, never BOS or EOS (as llama-bench)."""
    special = {llm.token_bos(), llm.token_eos()}
    n_vocab = llm.n_vocab()
    tokens: list[int] = []
    while len(tokens) < count:
        token = rng.randrange(n_vocab)
        if token not in special:
            tokens.append(token)
    return tokens


def measure_benchmark(
    llm,
    llama_cpp,
    prompt_tokens: int,
    generate_tokens: int,
    repetitions: int,
    *,
    step: Callable[[str], None] = lambda phase: None,
) -> dict:
    """Measure a loaded model as llama-bench does (W2); the procedure, figure by figure:

    - warm-up: one prompt batch and one generated token, not counted;
    - prompt processing, `repetitions` times: clear the KV cache, evaluate `prompt_tokens` random
      tokens in one batch (n_batch ≥ prompt_tokens), tokens / seconds;
    - generation, `repetitions` times: clear the KV cache, `generate_tokens` single-token
      evaluations of random tokens, tokens / seconds;
    - time to first token: clear, evaluate a fresh prompt of `prompt_tokens`, pick the first
      token (greedy), seconds.

    `step(phase)` is called as each piece ends, naming the phase that starts (`done` last). A
    cancel kills the engine process this runs in, so nothing here needs to look for one.
    """
    rng = random.Random(SEED)
    synchronize = llama_cpp.llama_synchronize

    def prompt_run(tokens: list[int]) -> float:
        llm.reset()  # the next eval removes every cached position: a clear KV cache
        start = time.perf_counter()
        llm.eval(tokens)
        synchronize(llm.ctx)
        return time.perf_counter() - start

    def generate_run(tokens: list[int]) -> float:
        llm.reset()
        start = time.perf_counter()
        for token in tokens:
            llm.eval([token])
        synchronize(llm.ctx)
        return time.perf_counter() - start

    prompt = benchmark_tokens(llm, prompt_tokens, rng)
    generated = benchmark_tokens(llm, generate_tokens, rng)
    prompt_run(prompt)
    generate_run(generated[:1])
    step("prompt")

    prompt_rates = []
    for run in range(1, repetitions + 1):
        prompt_rates.append(prompt_tokens / prompt_run(prompt))
        step("prompt" if run < repetitions else "generate")
    generate_rates = []
    for run in range(1, repetitions + 1):
        generate_rates.append(generate_tokens / generate_run(generated))
        step("generate" if run < repetitions else "first-token")

    fresh = benchmark_tokens(llm, prompt_tokens, rng)
    llm.reset()
    start = time.perf_counter()
    llm.eval(fresh)
    llm.sample(temp=0.0)
    first_token_seconds = time.perf_counter() - start
    llm.reset()
    step("done")
    return {
        "prompt_tokens_per_second": spread(prompt_rates),
        "generate_tokens_per_second": spread(generate_rates),
        "time_to_first_token_seconds": round(first_token_seconds, 6),
    }


class JobFailed(Exception):
    """A job ends failed with this error code."""

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


# --------------------------------------------------------------------------- engine process
#
# llama.cpp runs in a child process of the worker, one per job (issue 22): a model that makes it
# abort (a hostile vocabulary is enough: `std::out_of_range`, SIGABRT) takes that process down,
# never the worker and its socket. The child is `python3 -m modelforge_runtime_worker
# --engine-process FD`: the same file, so the two always speak the same version of this pipe
# protocol. It needs nothing the worker's container does not allow (fork and exec, pipes; no
# network, no capability, no writable file).
#
# - stdin, worker → engine: one JSON line, {"op": "job", "type", "params", "model_path",
#   "n_gpu_layers"}. It stays open for the job's life: at its end of file (the worker is gone, even
#   killed) the engine process exits at once, so it never holds a GPU for nobody.
# - fd FD, engine → worker: JSON lines, one event each: {"event": "ready"} once llama.cpp is
#   imported, {"event": "alive"} every second, {"event": "log", "level", "message"} (its log and
#   llama.cpp's warnings), {"event": "step", "phase"} as the job moves on, {"event": "abort",
#   "message"} when ggml is about to abort the process (a failed GGML_ASSERT), then the last word:
#   {"event": "done", "result", "peak_rss_bytes"} or {"event": "failed", "code", "message",
#   "retryable"}; then it exits.
# - stdout and stderr: whatever else is written there (an abort's "terminate called after…"); the
#   worker logs it and keeps the last lines for the error message.
#
# The worker ends it with SIGKILL (a cancel, an abandoned job, a deadline passed, the worker
# stopping): that frees the model, its context and the GPU memory at once, wherever it was.


class EngineChannel:
    """The engine process's side of its events pipe; a write to a worker that is gone ends it."""

    def __init__(self, fd: int) -> None:
        self._stream = os.fdopen(fd, "wb", buffering=0)
        self._lock = threading.Lock()

    def send(self, event: str, **fields) -> None:
        """One event, one line; written whole under the lock (threads share the pipe)."""
        data = json.dumps({"event": event, **fields}).encode() + b"\n"
        with self._lock:
            try:
                self._stream.write(data)
            except OSError:  # EPIPE: nobody reads any more
                os._exit(EXIT_ENGINE_ORPHANED)


class ChannelLogHandler(logging.Handler):
    """The engine process's log records, sent to the worker, which logs them as its own."""

    def __init__(self, channel: EngineChannel) -> None:
        super().__init__(logging.INFO)
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        self._channel.send("log", level=record.levelno, message=self.format(record))


def _exit_when_orphaned() -> None:
    """Read stdin to its end of file (the worker closed it, or died), then exit at once."""
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(EXIT_ENGINE_ORPHANED)


def _beat(channel: EngineChannel) -> None:
    """Say `alive` every second: a frozen engine process goes quiet, and the worker kills it."""
    while True:
        time.sleep(ENGINE_BEAT_SECONDS)
        channel.send("alive")


def engine_process_main(fd: int) -> int:
    """The engine process: read the job, run it in this process, send its last word, exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the worker, which decides
    channel = EngineChannel(fd)
    root = logging.getLogger()
    root.addHandler(ChannelLogHandler(channel))
    root.setLevel(logging.INFO)
    try:
        request = json.loads(sys.stdin.buffer.readline() or b"null")
        if not isinstance(request, dict) or request.get("op") not in ("job", "serve"):
            raise ValueError(f"not a job or serve request: {request!r:.200}")
        engine = Engine()
        llama_cpp = engine.module()
        engine.report_aborts(lambda message: channel.send("abort", message=message))
    except Exception as error:  # noqa: BLE001 - the worker hears why, whatever it is
        channel.send("failed", code=WORKER_INTERNAL_ERROR, message=f"{type(error).__name__}: {error}", retryable=True)
        return EXIT_UNAVAILABLE
    threading.Thread(target=_beat, args=(channel,), name="beat", daemon=True).start()
    channel.send("ready")
    if request["op"] == "serve":  # a deployment: it reads its commands from stdin itself
        try:
            serve_engine(request, engine, llama_cpp, channel)
        except JobFailed as failure:
            channel.send("failed", code=failure.code, message=failure.message, retryable=failure.retryable)
        except Exception as unexpected:  # noqa: BLE001 - the deployment's story always ends with a word
            log.exception("unexpected error in the deployment's engine process")
            channel.send(
                "failed",
                code=WORKER_INTERNAL_ERROR,
                message=f"{type(unexpected).__name__}: {unexpected}",
                retryable=True,
            )
        return EXIT_OK
    threading.Thread(target=_exit_when_orphaned, name="orphan-watch", daemon=True).start()
    try:
        result = run_engine_job(request, engine, llama_cpp, lambda phase: channel.send("step", phase=phase))
    except JobFailed as failure:
        channel.send("failed", code=failure.code, message=failure.message, retryable=failure.retryable)
    except Exception as unexpected:  # noqa: BLE001 - the job's story always ends with a word
        log.exception("unexpected error in the engine process")
        message = f"{type(unexpected).__name__}: {unexpected}"
        channel.send("failed", code=WORKER_INTERNAL_ERROR, message=message, retryable=True)
    else:
        # A fresh process: its high-water mark is the job's peak, model and context included.
        peak = _read_status_bytes("VmHWM") or _read_status_bytes("VmRSS") or 0
        channel.send("done", result=result, peak_rss_bytes=peak)
    return EXIT_OK


def run_engine_job(request: dict, engine: Engine, llama_cpp, step: Callable[[str], None]) -> dict:
    """Load the model and run the job's procedure (in the engine process); its figures."""
    fields = dict(request["params"])
    if request["type"] == BENCHMARK_JOB_TYPE:
        params: BenchmarkParams | GenerateParams = BenchmarkParams(**fields)
        n_ctx = params.prompt_tokens + params.generate_tokens
        n_batch = params.prompt_tokens  # the whole prompt in one llama_decode, as llama-bench
    else:
        params = GenerateParams(**{**fields, "prompts": tuple(fields["prompts"])})
        # Every token holds at least one byte of its prompt; BOS and a margin on top.
        n_ctx = max(len(prompt.encode()) for prompt in params.prompts) + 8 + params.max_tokens
        n_batch = 512
    model_path, gpu_layers = Path(request["model_path"]), request["n_gpu_layers"]
    llm, load_seconds = load_model(engine, llama_cpp, model_path, gpu_layers, n_ctx, n_batch)
    try:
        if isinstance(params, BenchmarkParams):
            step("warmup")
            figures = benchmark(llm, llama_cpp, params, step)
        else:
            step("prompts")
            figures = {"outputs": generate(llm, params, step)}
    finally:
        llm.close()  # frees the model and context now, whatever still refers to the object
        del llm
    return {"load_seconds": round(load_seconds, 6), **figures}


def _shown_bytes(data: bytes) -> str:
    """A file's first bytes for a person: printable ASCII as quoted text, anything else in hex."""
    if not data:
        return "nothing (the file is empty)"
    if all(0x20 <= byte < 0x7F for byte in data):
        return f"“{data.decode('ascii')}”"
    return "the bytes " + data.hex(" ")


def load_model(engine: Engine, llama_cpp, model_path: Path, gpu_layers: int, n_ctx: int, n_batch: int):
    """Check the GGUF magic and load the model; anything wrong that llama.cpp reports (rather
    than dies of) is MODEL_LOAD_FAILED with its reason."""
    try:
        with open(model_path, "rb") as model:
            magic = model.read(len(GGUF_MAGIC))
    except OSError as error:
        raise JobFailed(MODEL_LOAD_FAILED, f"the model file cannot be read ({error.strerror})") from None
    if magic != GGUF_MAGIC:
        raise JobFailed(MODEL_LOAD_FAILED, f"not a GGUF file: it starts with {_shown_bytes(magic)}, not “GGUF”")
    engine.clear_errors()
    start = time.perf_counter()
    try:
        llm = llama_cpp.Llama(
            model_path=str(model_path),
            n_gpu_layers=gpu_layers,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=min(n_batch, UBATCH_TOKENS),
            seed=SEED,
            verbose=False,
        )
    except (ValueError, RuntimeError, OSError) as error:
        # llama.cpp's own reason (a tensor past the end of the file…) says more than the
        # wrapper's "Failed to load model from file", which also names the worker's path.
        reason = engine.first_error or type(error).__name__
        raise JobFailed(MODEL_LOAD_FAILED, f"llama.cpp could not load the model: {reason}") from None
    load_seconds = time.perf_counter() - start
    log.info("model loaded in %.3f s (n_gpu_layers %d, n_ctx %d)", load_seconds, gpu_layers, n_ctx)
    return llm, load_seconds


def benchmark(llm, llama_cpp, params: BenchmarkParams, step: Callable[[str], None]) -> dict:
    """runtime.benchmark.v1 on the loaded model."""
    try:
        return measure_benchmark(
            llm, llama_cpp, params.prompt_tokens, params.generate_tokens, params.repetitions, step=step
        )
    except RuntimeError as error:  # llama_decode's non-zero return
        raise JobFailed(RUNTIME_FAILED, f"llama.cpp failed during the benchmark: {error}") from None


def generate(llm, params: GenerateParams, step: Callable[[str], None]) -> list[dict]:
    """runtime.generate.v1: each prompt from a fresh state, greedy, fixed seed."""
    outputs = []
    for prompt in params.prompts:
        llm.reset()  # fresh state: no prefix reuse, so results do not depend on prompt order
        try:
            completion = llm.create_completion(prompt, max_tokens=params.max_tokens, temperature=0.0, seed=SEED)
        except (RuntimeError, ValueError) as error:
            raise JobFailed(RUNTIME_FAILED, f"llama.cpp failed on a prompt: {error}") from None
        choice, usage = completion["choices"][0], completion["usage"]
        outputs.append(
            {
                "prompt": prompt,
                "text": choice["text"],
                "prompt_tokens": usage["prompt_tokens"],
                "completion_tokens": usage["completion_tokens"],
                "finish_reason": choice["finish_reason"],
            }
        )
        step("prompts")
    return outputs


# --------------------------------------------------------------------------- serving, in the engine process
#
# A deployment's engine process ({"op": "serve"} on its stdin) loads the model once and keeps it:
# it sends {"event": "loaded", "load_seconds", "memory_bytes", "context_length", "chat_template"},
# then reads more lines from stdin, {"op": "generate", "rid", …GenerationRequest} and
# {"op": "cancel", "rid"}, and answers each generation with {"event": "token", "rid", "text"}
# events, then {"event": "finished", "rid", "finish_reason", "usage", "timings"} or
# {"event": "request_failed", "rid", "code", "message"}. At stdin's end of file it exits.
#
# Up to SERVE_SLOTS generations run at once, each a llama.cpp sequence of its own in one context,
# and each llama_decode call carries the next token of every one of them (bench/slots.py: eight
# clients got 3.3x the tokens/s of a queue and their first token 7x sooner). The context's KV
# cache is shared (kv_unified): a generation is let in while its prompt and its token limit fit
# beside those running, so the cache never runs out mid-answer; the rest wait in order.


def _context_length(engine: Engine, llama_cpp, model_path: Path, asked: int | None) -> int:
    """The context to load with: as asked, else the model's own, capped (S2)."""
    if asked is not None:
        return asked
    try:
        probe = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    except (ValueError, RuntimeError, OSError):
        reason = engine.first_error or "its header cannot be read"
        raise JobFailed(MODEL_LOAD_FAILED, f"llama.cpp could not read the model: {reason}") from None
    try:
        # A vocabulary-only load reads the header's metadata but no hyperparameters.
        architecture = probe.metadata.get("general.architecture", "")
        raw = probe.metadata.get(f"{architecture}.context_length", "")
        trained = int(raw) if raw.isdigit() else 0
    finally:
        probe.close()
    low, high = CONTEXT_TOKENS_RANGE
    return max(low, min(trained or high, high))


class ChatTemplate:
    """S4: messages to a prompt with the GGUF's own chat template, else the documented fallback."""

    def __init__(self, llm, llama_chat_format) -> None:
        template = llm.metadata.get("tokenizer.chat_template")
        self.name = "gguf" if template else FALLBACK_CHAT_FORMAT
        if template:
            eos, bos = llm.token_eos(), llm.token_bos()
            self._format = llama_chat_format.Jinja2ChatFormatter(
                template=template,
                eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
                bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
                stop_token_ids=[eos],
            )
        else:
            self._format = llama_chat_format.format_llama2

    def prompt(self, messages: list[dict]) -> tuple[str, list[str], bool]:
        """The prompt text, the template's stop strings, and whether it holds its own BOS."""
        formatted = self._format(messages=messages)
        stop = formatted.stop or []
        return formatted.prompt, [stop] if isinstance(stop, str) else list(stop), bool(formatted.added_special)


def _held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class TextOut:
    """A generation's text on its way out: whole UTF-8 characters only, held back while it could
    still become a stop string; a stop string and what follows it are never sent."""

    def __init__(self, stops: list[str], emit: Callable[[str], None]) -> None:
        self.stops = stops
        self.emit = emit
        self.pending = b""  # the start of a character split across tokens
        self.held = ""

    def add(self, piece: bytes) -> bool:
        """One token's bytes; True once a stop string is complete."""
        self.pending += piece
        try:
            self.held += self.pending.decode()
            self.pending = b""
        except UnicodeDecodeError as partial:  # wait for the character's end
            self.held += self.pending[: partial.start].decode()
            self.pending = self.pending[partial.start :]
        hit = min((self.held.find(stop) for stop in self.stops if stop in self.held), default=-1)
        if hit >= 0:
            if hit:
                self.emit(self.held[:hit])
            self.held = ""
            return True
        keep = _held_back(self.held, self.stops)
        if len(self.held) > keep:
            self.emit(self.held[: len(self.held) - keep])
            self.held = self.held[len(self.held) - keep :]
        return False

    def flush(self) -> None:
        """The generation ended without a stop string: what was held back goes out."""
        tail = self.held + self.pending.decode("utf-8", "replace")
        if tail:
            self.emit(tail)


def _sampler(llama_cpp, request: dict, n_vocab: int):
    """OpenAI's sampling as a llama.cpp sampler chain: logit_bias, then greedy at temperature 0,
    else top_p, temperature and a draw seeded by `seed` (the same seed, the same text)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    bias = request["logit_bias"]
    if bias:
        entries = (llama_cpp.llama_logit_bias * len(bias))(
            *(llama_cpp.llama_logit_bias(int(token), value) for token, value in bias.items())
        )
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), entries))
    if request["temperature"] == 0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    else:
        seed = request["seed"] if request["seed"] is not None else random.SystemRandom().randrange(SEED_RANGE[1])
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(request["top_p"], 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(request["temperature"]))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
    return chain


class Generation:
    """One request in a slot: its prompt, its sampler, its text on the way out, its timings."""

    def __init__(self, llm, llama_cpp, template: ChatTemplate, request: dict, n_ctx: int, emit) -> None:
        """Tokenize and check the request; JobFailed for one this deployment cannot answer."""
        self.rid = str(request["rid"])
        self.llm, self.lib = llm, llama_cpp
        stops = list(request["stop"])
        if request["kind"] == "chat":
            text, template_stops, has_bos = template.prompt(request["messages"])
            stops += template_stops
            self.prompt = llm.tokenize(text.encode(), add_bos=not has_bos, special=True)
        else:
            self.prompt = llm.tokenize(request["prompt"].encode(), add_bos=True, special=False)
        room = n_ctx - len(self.prompt)
        if room < 1:
            raise JobFailed(
                PROMPT_TOO_LONG, f"the prompt is {len(self.prompt)} tokens; this deployment's context holds {n_ctx}"
            )
        self.limit = min(request["max_tokens"] or room, room)
        vocabulary = llm.n_vocab()
        if any(int(token) >= vocabulary for token in request["logit_bias"]):
            raise JobFailed(WORKER_REQUEST_INVALID, f"logit_bias names a token id past this model's {vocabulary}")
        self.out = TextOut(stops, emit)
        self.sampler = _sampler(llama_cpp, request, vocabulary)
        self.completion: list[int] = []
        self.fed = 0  # prompt tokens decoded so far
        self.slot = -1
        self.started = time.perf_counter()
        self.first_token_at: float | None = None

    @property
    def cells(self) -> int:
        """The KV cells this generation may come to hold."""
        return len(self.prompt) + self.limit

    def take(self, token: int, vocab) -> str | None:
        """The token sampled for this generation; its finish reason once it is done."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if self.lib.llama_vocab_is_eog(vocab, token):
            return "stop"
        self.completion.append(token)
        piece = self.llm.detokenize([token], prev_tokens=self.prompt + self.completion[:-1])
        if self.out.add(piece):
            return "stop"
        return "length" if len(self.completion) >= self.limit else None

    def finished(self, finish: str) -> dict:
        """The `finished` event's fields; what was held back goes out first."""
        if finish != "stop":
            self.out.flush()
        ended = time.perf_counter()
        generating = ended - (self.first_token_at or ended)
        produced = len(self.completion)
        return {
            "finish_reason": finish,
            "usage": {
                "prompt_tokens": len(self.prompt),
                "completion_tokens": produced,
                "total_tokens": len(self.prompt) + produced,
            },
            "timings": {
                "time_to_first_token_seconds": round((self.first_token_at or ended) - self.started, 6),
                "tokens_per_second": round((produced - 1) / generating, 3) if produced > 1 and generating else None,
            },
        }

    def close(self) -> None:
        self.lib.llama_sampler_free(self.sampler)


class Slots:
    """SERVE_SLOTS generations decoded together in one llama.cpp context: each llama_decode call
    carries the next token of every running generation and, in the room left, prompt tokens of
    those starting."""

    def __init__(self, llm, llama_cpp, n_ctx: int) -> None:
        self.lib = llama_cpp
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = UBATCH_TOKENS
        params.n_seq_max = SERVE_SLOTS
        params.kv_unified = True
        # llama.cpp decides (on where the backend has it): a full context's attention scores are
        # never held at once, which keeps the compute buffer small (147 MiB to 29 MiB at 4,096 cells
        # on a 215 MB model) and so what S3's estimate must leave room for.
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        self.ctx = llama_cpp.llama_init_from_model(llm.model, params)
        if not self.ctx:
            raise JobFailed(MODEL_LOAD_FAILED, f"llama.cpp could not make a context of {n_ctx} tokens")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(UBATCH_TOKENS, 0, 1)
        self.vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self.n_ctx = n_ctx
        self.running: dict[int, Generation] = {}  # slot -> its generation

    def room_for(self, generation: Generation) -> bool:
        """Whether a free slot and the KV cells `generation` may need are there beside the running."""
        return (
            len(self.running) < SERVE_SLOTS
            and sum(each.cells for each in self.running.values()) + generation.cells <= self.n_ctx
        )

    def start(self, generation: Generation) -> None:
        generation.slot = next(slot for slot in range(SERVE_SLOTS) if slot not in self.running)
        self.running[generation.slot] = generation

    def end(self, generation: Generation) -> None:
        """Free the generation's slot, its KV cells and its sampler."""
        self.running.pop(generation.slot, None)
        self.lib.llama_memory_seq_rm(self.memory, generation.slot, -1, -1)
        generation.close()

    def step(self) -> list[tuple[Generation, int]]:
        """One llama_decode call; the tokens sampled, each with its generation."""
        entries: list[tuple[int, int, Generation, bool]] = []  # token, position, generation, wants logits
        for generation in self.running.values():
            if generation.fed == len(generation.prompt):
                position = len(generation.prompt) + len(generation.completion) - 1
                entries.append((generation.completion[-1], position, generation, True))
        for generation in self.running.values():
            space = UBATCH_TOKENS - len(entries)
            if generation.fed < len(generation.prompt) and space > 0:
                chunk = generation.prompt[generation.fed : generation.fed + space]
                for offset, token in enumerate(chunk):
                    position = generation.fed + offset
                    entries.append((token, position, generation, position == len(generation.prompt) - 1))
                generation.fed += len(chunk)
        batch = self.batch
        for index, (token, position, generation, logits) in enumerate(entries):
            batch.token[index] = token
            batch.pos[index] = position
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = generation.slot
            batch.logits[index] = logits
        batch.n_tokens = len(entries)
        returned = self.lib.llama_decode(self.ctx, batch)
        if returned != 0:
            raise RuntimeError(f"llama_decode returned {returned}")
        return [
            (generation, self.lib.llama_sampler_sample(generation.sampler, self.ctx, index))
            for index, (_, _, generation, logits) in enumerate(entries)
            if logits
        ]


def serve_engine(request: dict, engine: Engine, llama_cpp, channel: EngineChannel) -> None:
    """The deployment's engine process after `ready`: load the model, then generate on request
    until stdin's end of file (the worker stopped the deployment, or is gone)."""
    from llama_cpp import llama_chat_format

    model_path = Path(request["model_path"])
    n_ctx = _context_length(engine, llama_cpp, model_path, request["context_length"])
    # The wrapper's own context stays small: generations run in the Slots context.
    llm, load_seconds = load_model(engine, llama_cpp, model_path, request["n_gpu_layers"], 256, 256)
    started = time.perf_counter()
    slots = Slots(llm, llama_cpp, n_ctx)
    load_seconds += time.perf_counter() - started
    template = ChatTemplate(llm, llama_chat_format)
    waiting: queue.Queue[dict] = queue.Queue()
    cancels: set[str] = set()
    lock = threading.Lock()

    def read_commands() -> None:
        for line in sys.stdin.buffer:
            try:
                command = json.loads(line)
            except ValueError:
                log.warning("not a command: %r", line[:200])
                continue
            if command.get("op") == "cancel":
                with lock:
                    cancels.add(str(command.get("rid")))
            elif command.get("op") == "generate":
                waiting.put(command)
        os._exit(EXIT_ENGINE_ORPHANED)

    def cancelled(rid: str) -> bool:
        with lock:
            if rid in cancels:
                cancels.discard(rid)
                return True
            return False

    def fail(rid: str, code: str, message: str) -> None:
        channel.send("request_failed", rid=rid, code=code, message=message)

    threading.Thread(target=read_commands, name="commands", daemon=True).start()
    memory = _read_status_bytes("VmRSS")
    channel.send(
        "loaded",
        load_seconds=round(load_seconds, 6),
        memory_bytes=memory,
        context_length=n_ctx,
        chat_template=template.name,
    )
    next_up: Generation | None = None  # the first in line, waiting for room
    while True:
        while True:  # let in whoever fits, in order
            if next_up is None:
                try:
                    command = waiting.get(block=not slots.running)
                except queue.Empty:
                    break
                rid = str(command["rid"])
                if cancelled(rid):
                    fail(rid, JOB_CANCELLED, "the client went away before its turn")
                    continue
                try:
                    next_up = Generation(
                        llm,
                        llama_cpp,
                        template,
                        command,
                        n_ctx,
                        lambda text, rid=rid: channel.send("token", rid=rid, text=text),
                    )
                except JobFailed as failure:
                    fail(rid, failure.code, failure.message)
                    continue
            if not slots.room_for(next_up):
                break
            slots.start(next_up)
            next_up = None
        if next_up is not None and cancelled(next_up.rid):
            next_up.close()
            fail(next_up.rid, JOB_CANCELLED, "the client went away before its turn")
            next_up = None
        for generation in list(slots.running.values()):
            if cancelled(generation.rid):  # within one token of the client's hang-up
                slots.end(generation)
                channel.send("finished", rid=generation.rid, **generation.finished("cancelled"))
        if not slots.running:
            continue
        try:
            sampled = slots.step()
        except RuntimeError as error:
            for generation in list(slots.running.values()):
                slots.end(generation)
                fail(generation.rid, RUNTIME_FAILED, f"llama.cpp failed while generating: {error}")
            continue
        for generation, token in sampled:
            finish = generation.take(token, slots.vocab)
            if finish is not None:
                slots.end(generation)
                channel.send("finished", rid=generation.rid, **generation.finished(finish))


def _ended(returncode: int) -> str:
    """How a process ended, in words: `was killed by SIGABRT`, `exited with status 3`."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the kernel's out-of-memory killer sends it too)" if -returncode == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {returncode}"


class EngineProcess:
    """The worker's side of one engine process: start it, hear its events, end it (SIGKILL)."""

    def __init__(self, label: str, scrub: Path) -> None:
        self.label = label
        self._scrub = str(scrub)  # the artifact directory: kept out of error messages
        self.process: subprocess.Popen | None = None
        self._events: queue.Queue[dict | None] = queue.Queue()
        self._last_words: deque[str] = deque(maxlen=ENGINE_LAST_WORDS)
        self._abort: str | None = None
        self._readers: list[threading.Thread] = []
        self._stdin_lock = threading.Lock()

    def start(self, request: dict) -> None:
        """Spawn it and hand it the request; its events arrive on next_event()."""
        events_read, events_write = os.pipe()
        output_read, output_write = os.pipe()
        try:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module, no shell
                [sys.executable, "-m", ENGINE_MODULE, "--engine-process", str(events_write)],
                stdin=subprocess.PIPE,
                stdout=output_write,
                stderr=output_write,
                pass_fds=(events_write,),
                close_fds=True,
                # ggml would run gdb on itself for a backtrace before it aborts: slow, and no use here.
                env={**os.environ, "GGML_NO_BACKTRACE": "1"},
            )
        except OSError:
            os.close(events_read)
            os.close(output_read)
            raise
        finally:
            os.close(events_write)
            os.close(output_write)
        for target, fd in ((self._read_events, events_read), (self._read_output, output_read)):
            reader = threading.Thread(target=target, args=(fd,), name=f"{self.label}-{target.__name__}", daemon=True)
            reader.start()
            self._readers.append(reader)
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:  # it died at once: its end of file says so
            pass

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def send(self, command: dict) -> bool:
        """One more command line on its stdin (a deployment's); False if it is gone."""
        with self._stdin_lock:
            try:
                self.process.stdin.write(json.dumps(command).encode() + b"\n")
                self.process.stdin.flush()
            except (OSError, ValueError):  # gone, or its stdin closed by end()
                return False
        return True

    def _read_events(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            for line in stream:
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning("%s: not an event: %r", self.label, line[:200])
                    continue
                if isinstance(event, dict):
                    self._events.put(event)
        self._events.put(None)  # its end: the process is gone (or closed the pipe on its way out)

    def _read_output(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip()[:ENGINE_LINE_CHARS]
                if line.strip():
                    log.warning("%s (pid %s) said: %s", self.label, self.pid, line)
                    self._last_words.append(self.scrub(line.strip()))

    def next_event(self, timeout: float) -> dict | None:
        """The next event (None: the channel closed); queue.Empty after `timeout` seconds."""
        return self._events.get(timeout=max(0.0, timeout))

    def scrub(self, text: str) -> str:
        """The worker's own paths out of what goes into an error message."""
        return text.replace(self._scrub, "<artifacts>")

    def aborting(self, message: str) -> None:
        """ggml said it aborts the process, and why (a failed GGML_ASSERT, with its source file)."""
        self._abort = self.scrub(re.sub(r"\S*/(?=[^/\s]+:\d+: )", "", message.strip())[:ENGINE_LINE_CHARS])
        log.error("%s (pid %s) aborts: %s", self.label, self.pid, self._abort)

    def last_words(self) -> str:
        """Why it died as it said it: ggml's abort message, else what it wrote to stdout or
        stderr last (an uncaught C++ exception's `what()`), for the error message."""
        self.join_output(1.0)
        return self._abort or " | ".join(self._last_words)

    def join_output(self, timeout: float) -> None:
        """Let the output reader catch up with a process that ended (its pipe closes with it)."""
        deadline = time.monotonic() + timeout
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))

    def kill(self) -> None:
        """SIGKILL, unless it has already ended."""
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> int | None:
        """Its exit status once it ended, or None after `timeout` seconds."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def end(self, grace: float = 0.0) -> int | None:
        """Give it `grace` seconds to exit on its own, then kill it; reap it (within
        ENGINE_EXIT_SECONDS) and close its stdin. Its exit status, None if it would not end."""
        if self.process is None:
            return None
        code = self.wait(grace) if grace else None
        if code is None:
            self.kill()
            code = self.wait(ENGINE_EXIT_SECONDS)
        if code is None:
            log.error("%s (pid %s) did not end within %g s of SIGKILL", self.label, self.pid, ENGINE_EXIT_SECONDS)
        try:
            self.process.stdin.close()
        except OSError:
            pass
        return code


# --------------------------------------------------------------------------- jobs


class Job:
    """One job: its status, updated by its thread and read by request handlers under a lock."""

    def __init__(self, request: JobRequest, model_path: Path) -> None:
        self.request = request
        self.model_path = model_path
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._state = "running"
        self._phase = "loading"
        self._steps_done = 0
        self._result: dict | None = None
        self._error: dict | None = None
        self._cancel_reason: str | None = None
        self._engine: EngineProcess | None = None
        self.last_asked = time.monotonic()  # when a request last named it (the agent polls)

    @property
    def id(self) -> str:
        """The control plane's job id."""
        return self.request.id

    @property
    def running(self) -> bool:
        """Whether the job still holds the worker."""
        return not self.finished.is_set()

    @property
    def phase(self) -> str:
        with self._lock:
            return self._phase

    def asked(self) -> None:
        """A request named this job: someone still waits for it."""
        self.last_asked = time.monotonic()

    def advance(self, phase: str) -> None:
        """One more step done, now in `phase`."""
        with self._lock:
            self._phase = phase
            self._steps_done += 1

    def attach(self, engine: EngineProcess) -> None:
        """The job's engine process, started, which a cancel kills; killed at once if one came
        already (cancel() and attach() hold the lock, so one of them sees the other)."""
        with self._lock:
            self._engine = engine
            if self._cancel_reason is not None:
                engine.kill()

    def cancel(self, reason: str = "the job was cancelled") -> None:
        """Stop the job: its engine process is killed, the job thread ends it `cancelled`."""
        with self._lock:
            if self._cancel_reason is None:
                self._cancel_reason = reason
            if self._engine is not None:
                self._engine.kill()

    def check(self) -> None:
        """Raise Cancelled if the job was asked to stop."""
        with self._lock:
            reason = self._cancel_reason
        if reason is not None:
            raise Cancelled(reason)

    def finish(self, state: str, result: dict | None = None, error: dict | None = None) -> None:
        """The job's last word; after it the worker takes the next job."""
        with self._lock:
            self._state = state
            self._result = result
            self._error = error
            if state == "succeeded":
                self._phase = "done"
        self.finished.set()

    def status(self) -> dict:
        """The job's status as the socket protocol carries it."""
        with self._lock:
            return {
                "id": self.request.id,
                "type": self.request.type,
                "state": self._state,
                "phase": self._phase,
                "steps_done": self._steps_done,
                "steps_total": self.request.params.steps_total,
                "result": self._result,
                "error": self._error,
            }


class Deployment:
    """A model kept loaded in an engine process of its own, and the generations it serves (S2).

    Its supervisor thread starts the process, watches its deadlines and routes its events to
    each generation's queue; handlers read status and submit generations under the lock. After
    `idle_unload_seconds` without a request the process is ended (the model's memory is freed)
    and the deployment is `unloaded`; the next request loads it again and waits for it.
    """

    def __init__(self, deployment_id: str, spec: DeploymentSpec, model_path: Path, gpu_layers: int) -> None:
        self.id = deployment_id
        self.spec = spec
        self.model_path = model_path
        self.gpu_layers = gpu_layers
        self.lock = threading.Lock()
        self.state = "loading"
        self.error: dict | None = None
        self.measured: dict = {"load_seconds": None, "memory_bytes": None}
        self.context_length: int | None = None
        self.chat_template: str | None = None
        self.requests = 0
        self.generated_tokens = 0
        self.streams: dict[str, queue.Queue] = {}  # rid -> its events, for the handler that streams them
        self.child: EngineProcess | None = None
        self.stopping = threading.Event()
        self.ended = threading.Event()
        self.wanted = threading.Event()  # a request came for an unloaded model: load it again
        self.waiting: list[dict] = []  # generate commands held while it loads again
        self.idle_since = time.monotonic()

    def unload_if_idle(self) -> bool:
        """S2: ready, nothing in hand and nothing asked for idle_unload_seconds (never when 0): it
        becomes `unloading` at once, under the lock, so a request from now on loads it again; it is
        `unloaded` once its engine process is gone (unloaded())."""
        with self.lock:
            seconds = self.spec.idle_unload_seconds
            quiet = time.monotonic() - self.idle_since
            if not seconds or self.state != "ready" or self.streams or quiet < seconds:
                return False
            self.state = "unloading"
            return True

    def unloaded(self) -> None:
        """The engine process is gone and its memory with it (unless a request came meanwhile and it
        is `loading` again)."""
        with self.lock:
            if self.state == "unloading":
                self.state = "unloaded"

    def loaded(self) -> list[dict]:
        """The model is loaded (again): ready, and the commands held meanwhile, to send now."""
        with self.lock:
            self.state = "ready"
            held, self.waiting = self.waiting, []
            return held

    def status(self) -> dict:
        with self.lock:
            return {
                "id": self.id,
                "state": self.state,
                "model_path": self.spec.model_path,
                "context_length": self.context_length or self.spec.context_length,
                "n_gpu_layers": self.gpu_layers,
                "chat_template": self.chat_template,
                "error": self.error,
                "measured": {**self.measured, "requests": self.requests, "generated_tokens": self.generated_tokens},
                "in_flight": len(self.streams),
            }

    def open_stream(self, request: GenerationRequest) -> tuple[str, queue.Queue]:
        """Hand a generation to the engine process: its id and the queue its events come on."""
        with self.lock:
            reload = self.state in ("unloading", "unloaded") or (
                self.state == "loading" and self.measured["load_seconds"] is not None
            )
            if self.state != "ready" and not reload:
                why = f": {self.error['message']}" if self.error else ""
                raise RequestError(
                    409,
                    WORKER_DEPLOYMENT_NOT_READY,
                    f"deployment {self.id} is {self.state}{why}",
                    self.state == "loading",
                )
            if len(self.streams) >= SERVE_SLOTS + DEPLOYMENT_QUEUE:
                raise RequestError(
                    429,
                    WORKER_BUSY,
                    f"deployment {self.id} has {len(self.streams)} requests in hand; try again shortly",
                    True,
                )
            rid = uuid.uuid4().hex
            events: queue.Queue = queue.Queue()
            self.streams[rid] = events
            self.requests += 1
            self.idle_since = time.monotonic()
            command = {"op": "generate", "rid": rid, **request.to_engine()}
            if reload:  # S2: held until the model is loaded again; the client waits meanwhile
                self.waiting.append(command)
                if self.state in ("unloading", "unloaded"):
                    self.state = "loading"
                    self.wanted.set()
                return rid, events
        if not self.child.send(command):
            self.close_stream(rid)
            raise RequestError(503, WORKER_DEPLOYMENT_NOT_READY, f"deployment {self.id}'s engine process is gone", True)
        return rid, events

    def cancel_stream(self, rid: str) -> None:
        """The client hung up: stop its generation (within one token) or its turn in the queue."""
        with self.lock:
            held = [command for command in self.waiting if command["rid"] == rid]
            self.waiting = [command for command in self.waiting if command["rid"] != rid]
        if held:  # it never reached the engine process
            self._route({"event": "request_failed", "rid": rid, "code": JOB_CANCELLED, "message": "the client left"})
        elif self.child is not None:
            self.child.send({"op": "cancel", "rid": rid})

    def close_stream(self, rid: str) -> None:
        with self.lock:
            self.streams.pop(rid, None)
            self.idle_since = time.monotonic()

    def _route(self, event: dict) -> None:
        with self.lock:
            events = self.streams.get(str(event.get("rid")))
            if event.get("event") == "finished" and isinstance(event.get("usage"), dict):
                self.generated_tokens += int(event["usage"].get("completion_tokens") or 0)
        if events is not None:
            events.put(event)

    def end(self, state: str, error: dict | None = None) -> None:
        """The deployment is over (stopped, or failed): every open generation hears it."""
        with self.lock:
            self.state, self.error = state, error
            streams = list(self.streams.values())
        failure = error or {"code": WORKER_DEPLOYMENT_NOT_READY, "message": f"deployment {self.id} was stopped"}
        for events in streams:
            events.put({"event": "request_failed", "code": failure["code"], "message": failure["message"]})


class Worker:
    """The one job slot, with the engine and NVML: what the socket's requests ask of them.

    The worker itself never loads a model: each job runs in an engine process it supervises
    (EngineProcess), so whatever llama.cpp does with a model, the socket keeps answering.
    """

    def __init__(self, config: Config, nvml: Nvml, engine: Engine) -> None:
        self.config = config
        self.nvml = nvml
        self.engine = engine
        self._lock = threading.Lock()
        self._job: Job | None = None
        self._deployments: dict[str, Deployment] = {}

    def info(self) -> dict:
        """GET /v1/info."""
        with self._lock:
            job = self._job
        job_summary = None
        if job is not None:
            status = job.status()
            job_summary = {"id": status["id"], "state": status["state"]}
        return {
            "worker_version": WORKER_VERSION,
            "protocol_version": PROTOCOL_VERSION,
            "engines": [self.engine.info()],
            "devices": self.nvml.devices,
            "job": job_summary,
            # S2, S5: the agent advertises runtime.serve.v1 while a worker answers with this.
            "serving": {
                "max_deployments": MAX_DEPLOYMENTS,
                "slots_per_deployment": SERVE_SLOTS,
                "queue_per_deployment": DEPLOYMENT_QUEUE,
            },
            "deployments": [{"id": each.id, "state": each.status()["state"]} for each in self.deployments()],
        }

    def submit(self, body: object) -> dict:
        """POST /v1/jobs: start the job, or answer the status of the same id, or refuse."""
        request = parse_job_request(body)
        with self._lock:
            if self._job is not None and self._job.id == request.id:
                self._job.asked()
                return self._job.status()  # a resent submission: a lost reply is harmless
            if self._job is not None and self._job.running:
                raise RequestError(409, WORKER_BUSY, f"job {self._job.id} is running; one job at a time", True)
            model_path = resolve_model_path(self.config.artifact_dir, request.params.model_path)
            self.engine.info()  # import llama_cpp here, so a broken install is a 500 before any job starts
            job = Job(request, model_path)
            self._job = job
        log.info("job %s (%s) accepted: %s", job.id, request.type, request.params.model_path)
        threading.Thread(target=self._run, args=(job,), name=f"job-{job.id}", daemon=True).start()
        return job.status()

    def job(self, job_id: str) -> Job:
        """The job with this id, or 404 WORKER_JOB_UNKNOWN."""
        with self._lock:
            job = self._job
        if job is None or job.id != job_id:
            raise RequestError(404, WORKER_JOB_UNKNOWN, f"no job {job_id} here (the worker restarted, or never had it)")
        job.asked()
        return job

    def cancel(self, job_id: str) -> dict:
        """POST /v1/jobs/{id}/cancel: stop the job; answer once it has (or after a second)."""
        job = self.job(job_id)
        if job.running:
            log.info("job %s: cancel requested", job.id)
            job.cancel()
            job.finished.wait(CANCEL_REPLY_WAIT_SECONDS)
        return job.status()

    # -- deployments (S2): a model kept loaded between requests

    def deployments(self) -> list[Deployment]:
        with self._lock:
            return list(self._deployments.values())

    def deployment(self, deployment_id: str) -> Deployment:
        """The deployment with this id, or 404 WORKER_DEPLOYMENT_UNKNOWN."""
        with self._lock:
            found = self._deployments.get(deployment_id)
        if found is None:
            raise RequestError(
                404,
                WORKER_DEPLOYMENT_UNKNOWN,
                f"no deployment {deployment_id} here (the worker restarted, or never had it)",
            )
        return found

    def put_deployment(self, deployment_id: str, body: object) -> dict:
        """PUT /v1/deployments/{id}: load the model in an engine process of its own and keep it.

        The same id and body again answers its status (a lost reply is harmless); the same id
        with another body is a conflict, to be stopped first; a failed or stopped one is
        replaced."""
        if not JOB_ID_PATTERN.fullmatch(deployment_id):
            raise invalid("id", "must be 1-128 letters, digits, '.', '_' or '-'")
        spec = parse_deployment_spec(body)
        with self._lock:
            existing = self._deployments.get(deployment_id)
            if existing is not None and existing.status()["state"] in LIVE_DEPLOYMENT_STATES:
                if existing.spec != spec:
                    raise RequestError(
                        409,
                        WORKER_DEPLOYMENT_CONFLICT,
                        f"deployment {deployment_id} runs with other settings; stop it first",
                    )
                return existing.status()
            live = [each for each in self._deployments.values() if each.status()["state"] in LIVE_DEPLOYMENT_STATES]
            if len(live) >= MAX_DEPLOYMENTS:
                raise RequestError(409, WORKER_BUSY, f"this worker keeps at most {MAX_DEPLOYMENTS} models loaded", True)
            model_path = resolve_model_path(self.config.artifact_dir, spec.model_path)
            engine = self.engine.info()  # a broken install is a 500 before anything starts
            gpu_layers = self._gpu_layers(engine, spec)
            deployment = Deployment(deployment_id, spec, model_path, gpu_layers)
            self._deployments[deployment_id] = deployment
        log.info("deployment %s accepted: %s", deployment_id, spec.model_path)
        threading.Thread(
            target=self._serve, args=(deployment,), name=f"deployment-{deployment_id}", daemon=True
        ).start()
        return deployment.status()

    def stop_deployment(self, deployment_id: str) -> dict:
        """DELETE /v1/deployments/{id}: kill its engine process (the model is freed) and answer once it is gone."""
        deployment = self.deployment(deployment_id)
        deployment.stopping.set()
        if deployment.child is not None:
            deployment.child.kill()
        deployment.ended.wait(ENGINE_EXIT_SECONDS)
        return deployment.status()

    def _serve(self, deployment: Deployment) -> None:
        """The deployment's supervisor: one engine process after another, each from spawn to end
        with every wait bounded. A model left idle is unloaded (its process ended), and loaded again
        in a new one when a request comes (S2)."""
        state, error = "failed", None
        try:
            while True:
                state, error = self._run_engine(deployment)
                if state != "unloaded":
                    break
                while not deployment.stopping.is_set() and not deployment.wanted.wait(0.5):
                    pass
                if deployment.stopping.is_set():
                    break
                deployment.wanted.clear()
                log.info("deployment %s: a request came; loading the model again", deployment.id)
        finally:
            if deployment.stopping.is_set():
                state, error = "stopped", None
            deployment.end(state, error)
            deployment.ended.set()
            log.info(
                "deployment %s %s%s", deployment.id, state, f" ({error['code']}: {error['message']})" if error else ""
            )

    def _run_engine(self, deployment: Deployment) -> tuple[str, dict | None]:
        """One engine process for the deployment: `stopped`, `unloaded` (idle: it was ended) or
        `failed` with the error."""
        child = EngineProcess(f"deployment {deployment.id}: engine process", self.config.artifact_dir)
        deployment.child = child
        request = {
            "op": "serve",
            "model_path": str(deployment.model_path),
            "context_length": deployment.spec.context_length,
            "n_gpu_layers": deployment.gpu_layers,
        }
        started = heard = heard_ready = time.monotonic()
        ready = loaded = False
        try:
            child.start(request)
            log.info("deployment %s: engine process %d started", deployment.id, child.pid)
            while not deployment.stopping.is_set():
                now = time.monotonic()
                if not ready:
                    deadline, doing = started + ENGINE_START_SECONDS, f"start within {ENGINE_START_SECONDS:g} s"
                elif not loaded:
                    deadline, doing = (
                        heard_ready + MODEL_LOAD_SECONDS,
                        f"load the model within {MODEL_LOAD_SECONDS:g} s",
                    )
                else:
                    deadline, doing = (
                        heard + ENGINE_SILENCE_SECONDS,
                        f"stay responsive (silent {ENGINE_SILENCE_SECONDS:g} s)",
                    )
                if ready:
                    deadline = min(deadline, heard + ENGINE_SILENCE_SECONDS)
                try:
                    event = child.next_event(min(deadline - now, 0.5))
                except queue.Empty:
                    if loaded and deployment.unload_if_idle():
                        memory = deployment.measured.get("memory_bytes")
                        child.end()  # killed and reaped: its memory is free before it says unloaded
                        deployment.unloaded()
                        log.info(
                            "deployment %s unloaded after %d s without a request (%s bytes freed)",
                            deployment.id, deployment.spec.idle_unload_seconds, memory,
                        )  # fmt: skip
                        return "unloaded", None
                    if time.monotonic() >= deadline:
                        child.kill()
                        return "failed", self._deployment_error(child, loaded, f"did not {doing}; killed")
                    continue
                if event is None:
                    if deployment.stopping.is_set():
                        break
                    code = child.wait(ENGINE_EXIT_SECONDS)
                    words = child.last_words()
                    how = _ended(code) if code is not None else "closed its channel"
                    return "failed", self._deployment_error(
                        child, loaded, how + (f"; it said: {words}" if words else "")
                    )
                heard = time.monotonic()
                kind = event.get("event")
                if kind == "ready":
                    ready, heard_ready = True, heard
                elif kind == "loaded":
                    loaded = True
                    with deployment.lock:
                        deployment.context_length = event.get("context_length")
                        deployment.chat_template = event.get("chat_template")
                        deployment.measured.update(
                            load_seconds=event.get("load_seconds"), memory_bytes=event.get("memory_bytes")
                        )
                    for command in deployment.loaded():  # requests that waited for a load again
                        child.send(command)
                    log.info("deployment %s ready: loaded in %s s", deployment.id, event.get("load_seconds"))
                elif kind in ("token", "finished", "request_failed"):
                    deployment._route(event)
                elif kind == "log":
                    level = event.get("level") if isinstance(event.get("level"), int) else logging.WARNING
                    log.log(level, "deployment %s: %s", deployment.id, event.get("message"))
                elif kind == "abort":
                    child.aborting(str(event.get("message")))
                elif kind == "failed":
                    code = str(event.get("code") or WORKER_INTERNAL_ERROR)
                    return "failed", {
                        "code": code,
                        "message": child.scrub(str(event.get("message"))),
                        "retryable": event.get("retryable") is True,
                    }
            return "stopped", None
        except OSError as failure:
            return "failed", {
                "code": WORKER_INTERNAL_ERROR,
                "message": f"the engine process cannot start ({failure})",
                "retryable": True,
            }
        finally:
            child.end()

    @staticmethod
    def _deployment_error(child: EngineProcess, loaded: bool, what: str) -> dict:
        """An engine process that died or was killed: MODEL_LOAD_FAILED before the model was
        loaded, RUNTIME_ENGINE_CRASHED after (W1's codes; neither retryable)."""
        log.error("%s (pid %s) %s", child.label, child.pid, what)
        if not loaded:
            return {
                "code": MODEL_LOAD_FAILED,
                "message": f"llama.cpp's process {what} while loading the model",
                "retryable": False,
            }
        return {
            "code": RUNTIME_ENGINE_CRASHED,
            "message": f"llama.cpp's process {what} while serving",
            "retryable": False,
        }

    def stop(self) -> None:
        """Cancel a running job, stop every deployment, and wait for their engine processes to be gone (SIGTERM)."""
        for deployment in self.deployments():
            deployment.stopping.set()
            if deployment.child is not None:
                deployment.child.kill()
        for deployment in self.deployments():
            deployment.ended.wait(STOP_WAIT_SECONDS)
        with self._lock:
            job = self._job
        if job is not None and job.running:
            log.info("job %s: cancelled because the worker is stopping", job.id)
            job.cancel("the job was cancelled: the runtime worker is stopping")
            job.finished.wait(STOP_WAIT_SECONDS)

    # -- the job thread

    def _run(self, job: Job) -> None:
        """Run one job to its end; whatever happens, its engine process is gone before the status says so."""
        started = time.monotonic()
        state, result, error = "failed", None, None
        try:
            result = self._execute(job)
            state = "succeeded"
        except Cancelled as cancelled:
            state = "cancelled"
            error = {"code": JOB_CANCELLED, "message": cancelled.message, "retryable": False}
        except JobFailed as failure:
            error = {"code": failure.code, "message": failure.message, "retryable": failure.retryable}
        except Exception as unexpected:  # the job thread must always end the job's story with a status
            log.exception("job %s: unexpected error", job.id)
            error = {
                "code": WORKER_INTERNAL_ERROR,
                "message": f"{type(unexpected).__name__}: {unexpected}",
                "retryable": True,
            }
        job.finish(state, result, error)
        detail = f" ({error['code']}: {error['message']})" if error else ""
        log.info("job %s %s after %.2f s%s", job.id, state, time.monotonic() - started, detail)

    def _execute(self, job: Job) -> dict:
        """Run the job in an engine process and build its result."""
        params = job.request.params
        engine = self.engine.info()
        gpu_layers = self._gpu_layers(engine, params)
        gpu_uuids = [device["uuid"] for device in self.nvml.devices] if gpu_layers != 0 else []
        request = {
            "op": "job",
            "type": job.request.type,
            "params": dataclasses.asdict(params),
            "model_path": str(job.model_path),
            "n_gpu_layers": gpu_layers,
        }
        with GpuPeak(self.nvml, uses_gpu=bool(gpu_uuids)) as gpu:
            done = self._supervise(job, request)
        figures = dict(done["result"])
        load_seconds = figures.pop("load_seconds")
        common = {"engine": engine, "model_file": params.model_file}
        if isinstance(params, BenchmarkParams):
            return {
                **common,
                "model_bytes": job.model_path.stat().st_size,
                "n_gpu_layers": gpu_layers,
                "gpu_uuids": gpu_uuids,
                "load_seconds": load_seconds,
                "prompt_tokens": params.prompt_tokens,
                "generate_tokens": params.generate_tokens,
                "repetitions": params.repetitions,
                **figures,
                "peak_rss_bytes": done["peak_rss_bytes"],
                "peak_gpu_memory_bytes": gpu.peak_bytes,
            }
        return {
            **common,
            "seed": SEED,
            "temperature": 0.0,
            "max_tokens": params.max_tokens,
            "gpu_uuids": gpu_uuids,
            "load_seconds": load_seconds,
            **figures,
        }

    def _supervise(self, job: Job, request: dict) -> dict:
        """Run the job's engine process to its last word, every wait on it with a deadline; its
        `done` event, or JobFailed / Cancelled. The process is gone when this returns."""
        child = EngineProcess(f"job {job.id}: engine process", self.config.artifact_dir)
        job.check()
        started = time.monotonic()
        ready = False
        loading_until = started + ENGINE_START_SECONDS + MODEL_LOAD_SECONDS
        heard = started
        last_word = False
        try:
            try:
                child.start(request)
            except OSError as error:
                raise JobFailed(WORKER_INTERNAL_ERROR, f"the engine process cannot start ({error})", True) from None
            job.attach(child)  # from now on a cancel kills it (one that came already just did)
            log.info("job %s: engine process %d started", job.id, child.pid)
            while True:
                if not ready:
                    deadline, doing, allowed = started + ENGINE_START_SECONDS, "starting", ENGINE_START_SECONDS
                elif job.phase == "loading":
                    deadline, doing, allowed = loading_until, "loading the model", MODEL_LOAD_SECONDS
                else:
                    deadline, doing, allowed = started + JOB_SECONDS, "the job", JOB_SECONDS
                # It beats once ready; its import (CUDA's libraries: a long dlopen) has the start deadline.
                silent_at = heard + ENGINE_SILENCE_SECONDS if ready else deadline
                wake = min(deadline, silent_at, job.last_asked + self.config.abandon_seconds)
                try:
                    event = child.next_event(wake - time.monotonic())
                except queue.Empty:
                    event = {"event": "quiet"}
                now = time.monotonic()
                if now >= job.last_asked + self.config.abandon_seconds:
                    waited = self.config.abandon_seconds
                    log.warning("job %s: nobody asked about it for %g s; cancelling it", job.id, waited)
                    job.cancel(f"the job was cancelled: nobody asked about it for {waited:g} s (the agent went away)")
                job.check()
                if event is None:
                    raise self._crashed(job, child, ready)
                kind = event.get("event")
                if kind == "quiet":
                    if now >= deadline:
                        raise self._killed(job, child, ready, f"did not finish {doing} within {allowed:g} s")
                    if now >= silent_at:
                        raise self._killed(job, child, ready, f"went silent for {ENGINE_SILENCE_SECONDS:g} s")
                    continue
                heard = now
                if kind == "ready":
                    ready, loading_until = True, min(now + MODEL_LOAD_SECONDS, started + JOB_SECONDS)
                elif kind == "step" and isinstance(event.get("phase"), str):
                    job.advance(event["phase"])
                elif kind == "log":
                    level = event.get("level") if isinstance(event.get("level"), int) else logging.WARNING
                    log.log(level, "job %s: %s", job.id, event.get("message"))
                elif kind == "abort":
                    child.aborting(str(event.get("message")))
                elif kind in ("done", "failed"):
                    last_word = True
                    if kind == "done":
                        return event
                    code, message = str(event.get("code") or WORKER_INTERNAL_ERROR), str(event.get("message"))
                    raise JobFailed(code, child.scrub(message), event.get("retryable") is True)
        finally:
            code = child.end(grace=ENGINE_EXIT_SECONDS if last_word else 0.0)
            ended = "and is still there" if code is None else _ended(code)
            log.info("job %s: engine process %s ended: it %s", job.id, child.pid, ended)

    def _crashed(self, job: Job, child: EngineProcess, ready: bool) -> JobFailed:
        """The engine process went without a last word: it died. What that means for the job
        (Cancelled is raised instead when the end was a cancel's SIGKILL)."""
        code = child.wait(ENGINE_EXIT_SECONDS)
        if code is None:  # it closed its channel and lives on: of no use any more
            child.kill()
            code = child.wait(ENGINE_EXIT_SECONDS)
        job.check()  # a cancel's SIGKILL is no crash
        words = child.last_words()
        how = _ended(code) if code is not None else "closed its channel and would not end"
        return self._engine_failure(job, child, ready, how, f"; it said: {words}" if words else "")

    def _killed(self, job: Job, child: EngineProcess, ready: bool, what: str) -> JobFailed:
        """A deadline passed: the engine process is killed and the job fails, saying which."""
        child.kill()
        return self._engine_failure(job, child, ready, what, "; killed")

    @staticmethod
    def _engine_failure(job: Job, child: EngineProcess, ready: bool, what: str, detail: str) -> JobFailed:
        """An engine process that died or was killed, logged and mapped: before it was ready the
        worker's own fault (retryable); while loading MODEL_LOAD_FAILED; later
        RUNTIME_ENGINE_CRASHED (neither retryable: a retry runs the same file the same way)."""
        phase = job.phase
        log.error("job %s: the engine process (pid %s) %s in phase %s%s", job.id, child.pid, what, phase, detail)
        if not ready:
            return JobFailed(WORKER_INTERNAL_ERROR, f"the engine process {what} before it was ready{detail}", True)
        if phase == "loading":
            return JobFailed(MODEL_LOAD_FAILED, f"llama.cpp's process {what} while loading the model{detail}")
        when = f"while running the job (phase {phase})"
        return JobFailed(RUNTIME_ENGINE_CRASHED, f"llama.cpp's process {what} {when}{detail}")

    def _gpu_layers(self, engine: dict, params: BenchmarkParams | GenerateParams | DeploymentSpec) -> int:
        """Layers to offload: as asked (default all) with a CUDA engine and a GPU, else 0."""
        if engine["backend"] != "cuda" or not self.nvml.devices:
            return 0
        requested = getattr(params, "n_gpu_layers", None)
        return -1 if requested is None else requested


# --------------------------------------------------------------------------- socket server


class WorkerServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """HTTP/1.1 on the Unix socket, a thread per connection; the Worker behind it."""

    daemon_threads = True

    def __init__(self, path: Path, worker: Worker) -> None:
        self.worker = worker
        super().__init__(str(path), WorkerHandler)

    def handle_error(self, request, client_address) -> None:
        """A connection that broke (the client went away mid-answer): one log line, not a traceback."""
        log.warning("a connection ended badly: %r", sys.exc_info()[1])


class WorkerHandler(BaseHTTPRequestHandler):
    """Protocol version 1: four routes, JSON in and out, one error shape."""

    protocol_version = "HTTP/1.1"
    server_version = f"modelforge-runtime-worker/{WORKER_VERSION}"
    sys_version = ""
    timeout = CONNECTION_IDLE_SECONDS
    server: WorkerServer

    ROUTES = (
        (re.compile(r"/v1/info"), ("GET",), "info"),
        (re.compile(r"/v1/jobs"), ("POST",), "submit"),
        (re.compile(r"/v1/jobs/(?P<job_id>[^/]+)"), ("GET",), "status"),
        (re.compile(r"/v1/jobs/(?P<job_id>[^/]+)/cancel"), ("POST",), "cancel"),
        (re.compile(r"/v1/deployments"), ("GET",), "deployments"),
        (re.compile(r"/v1/deployments/(?P<deployment_id>[^/]+)"), ("GET", "PUT", "DELETE"), "deployment"),
        (re.compile(r"/v1/deployments/(?P<deployment_id>[^/]+)/generate"), ("POST",), "generate"),
    )

    def address_string(self) -> str:
        """A Unix socket peer has no address; say so in log lines."""
        return "unix-peer"

    def log_message(self, format: str, *args) -> None:
        """Request lines at debug level: the agent polls often."""
        log.debug("%s", format % args)

    def do_GET(self) -> None:
        """GET routes."""
        self._dispatch()

    def do_POST(self) -> None:
        """POST routes."""
        self._dispatch()

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_POST

    def _dispatch(self) -> None:
        """Route the request and answer it, always with JSON."""
        try:
            body = self._read_body()
            path = urlsplit(self.path).path
            for pattern, methods, action in self.ROUTES:
                match = pattern.fullmatch(path)
                if match is None:
                    continue
                if self.command not in methods:
                    raise RequestError(
                        405, WORKER_METHOD_NOT_ALLOWED, f"{self.command} {path}: use {', '.join(methods)}"
                    )
                answer = getattr(self, "_" + action)(body, **match.groupdict())
                if answer is not None:  # a streamed answer has gone out already
                    self._answer(*answer)
                return
            raise RequestError(404, WORKER_ROUTE_UNKNOWN, f"no route {path}")
        except RequestError as refusal:
            self._answer(refusal.status, refusal.to_wire(), refusal)
        except Exception as error:  # a request must always get an answer and never stop the worker
            log.exception("%s %s failed", self.command, self.path)
            failure = RequestError(500, WORKER_INTERNAL_ERROR, f"{type(error).__name__}: {error}", True)
            self._answer(500, failure.to_wire(), failure)

    def _read_body(self) -> bytes:
        """The request body, at most MAX_REQUEST_BYTES (413 beyond, and the connection closes)."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise RequestError(411, WORKER_REQUEST_INVALID, "send a Content-Length, not a chunked body")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise RequestError(400, WORKER_REQUEST_INVALID, "Content-Length is not a whole number")
        if length > MAX_REQUEST_BYTES:
            # Read (and drop) a body of modest size first: a client still sending it when the
            # socket closes would see a broken pipe instead of this answer.
            self._discard(min(length, DRAIN_LIMIT_BYTES))
            self.close_connection = True
            raise RequestError(413, WORKER_REQUEST_TOO_LARGE, f"a request body holds at most {MAX_REQUEST_BYTES} bytes")
        return self.rfile.read(length) if length else b""

    def _discard(self, length: int) -> None:
        """Read and drop `length` bytes of the request body, or fewer if the client stops."""
        while length > 0:
            chunk = self.rfile.read(min(length, 16384))
            if not chunk:
                return
            length -= len(chunk)

    def _answer(self, status: int, payload: dict, refusal: RequestError | None = None) -> None:
        """Send one JSON answer; every status here has a body but HEAD's."""
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        if refusal is not None and status >= 400:
            log.debug("%s %s refused: %s %s", self.command, self.path, refusal.code, refusal.message)

    # -- routes: each returns (status, payload)

    def _info(self, _body: bytes) -> tuple[int, dict]:
        return 200, self.server.worker.info()

    @staticmethod
    def _json(body: bytes) -> object:
        try:
            return json.loads(body)
        except RecursionError:
            raise invalid("body", "is nested too deeply") from None
        except ValueError as error:  # not JSON, not UTF-8, or a number of more than 4300 digits
            raise invalid("body", f"is not JSON ({error})") from None

    def _submit(self, body: bytes) -> tuple[int, dict]:
        return 202, self.server.worker.submit(self._json(body))

    def _deployments(self, _body: bytes) -> tuple[int, dict]:
        return 200, {"deployments": [each.status() for each in self.server.worker.deployments()]}

    def _deployment(self, body: bytes, deployment_id: str) -> tuple[int, dict]:
        worker = self.server.worker
        if self.command == "PUT":
            return 202, worker.put_deployment(deployment_id, self._json(body))
        if self.command == "DELETE":
            return 200, worker.stop_deployment(deployment_id)
        return 200, worker.deployment(deployment_id).status()

    def _generate(self, body: bytes, deployment_id: str) -> None:
        """Stream one generation as JSON lines (chunked): `token` events, then `finished` or
        `request_failed`. A client that hangs up cancels it within one token (S5)."""
        deployment = self.server.worker.deployment(deployment_id)
        request = parse_generation_request(self._json(body))
        rid, events = deployment.open_stream(request)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.flush()
            gone = False

            def hang_up() -> None:
                nonlocal gone
                gone = True
                log.info("deployment %s: the client of %s hung up; cancelling it", deployment.id, rid)
                deployment.cancel_stream(rid)

            while True:
                try:
                    event = events.get(timeout=STREAM_POLL_SECONDS)
                except queue.Empty:
                    if not gone and self._client_gone():
                        hang_up()
                    continue
                if not gone:
                    try:
                        self._chunk(
                            json.dumps({key: value for key, value in event.items() if key != "rid"}).encode() + b"\n"
                        )
                    except OSError:
                        hang_up()
                if event.get("event") in ("finished", "request_failed"):
                    break
            if not gone:
                try:
                    self._chunk(b"")
                except OSError:
                    pass
            self.close_connection = self.close_connection or gone
        finally:
            deployment.close_stream(rid)

    def _chunk(self, data: bytes) -> None:
        """One chunk of a chunked answer (an empty one ends it)."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """Whether the client closed its end: readable with nothing to read."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _status(self, _body: bytes, job_id: str) -> tuple[int, dict]:
        return 200, self.server.worker.job(job_id).status()

    def _cancel(self, _body: bytes, job_id: str) -> tuple[int, dict]:
        return 200, self.server.worker.cancel(job_id)


def clear_stale_socket(path: Path) -> None:
    """Remove a socket file nobody answers on (a worker that was killed); refuse anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise ConfigError(f"MODELFORGE_WORKER_SOCKET={path} cannot be inspected ({error.strerror})") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"MODELFORGE_WORKER_SOCKET={path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(STALE_PROBE_SECONDS)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing the stale socket %s (nothing answers on it)", path)
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            raise ConfigError(
                f"MODELFORGE_WORKER_SOCKET={path} is stale but cannot be removed ({error.strerror})"
            ) from None
        return
    except OSError as error:
        raise Unavailable(
            f"MODELFORGE_WORKER_SOCKET={path} is a socket that neither answers nor refuses ({error})"
        ) from None
    finally:
        probe.close()
    raise Unavailable(f"another process answers on MODELFORGE_WORKER_SOCKET={path}; not starting a second worker")


def bind(config: Config, worker: Worker) -> WorkerServer:
    """Listen on the socket, created mode 0660 from the start (never wider, not even briefly)."""
    path = config.socket_path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"MODELFORGE_WORKER_SOCKET={path}: its directory cannot be created ({error.strerror})"
        ) from None
    clear_stale_socket(path)
    previous_umask = os.umask(0o777 & ~SOCKET_MODE)
    try:
        server = WorkerServer(path, worker)
    except OSError as error:
        raise ConfigError(f"MODELFORGE_WORKER_SOCKET={path} cannot be bound ({error.strerror})") from None
    finally:
        os.umask(previous_umask)
    os.chmod(path, SOCKET_MODE)
    return server


def remove_socket(path: Path, inode: int) -> None:
    """Remove our socket file, but not one a newer worker has bound at the same path since."""
    try:
        if os.lstat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- command line


def configure_logging() -> None:
    """Log lines to stderr through a private copy of fd 2.

    llama-cpp-python silences a model load by pointing fds 1 and 2 at /dev/null for its duration;
    a copy taken now keeps this log (and llama.cpp's warnings routed into it) visible meanwhile.
    """
    stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """--check and --version; everything else comes from MODELFORGE_WORKER_* variables."""
    parser = argparse.ArgumentParser(
        prog="modelforge_runtime_worker",
        description="ModelForge runtime worker: runs GGUF models for the node agent over a Unix socket.",
        epilog="Settings: MODELFORGE_WORKER_SOCKET, MODELFORGE_WORKER_ARTIFACT_DIR, "
        "MODELFORGE_WORKER_ACCELERATOR_MODE (nvidia|cpu|auto). Exit codes: 0 stopped, 2 bad setting, "
        "3 accelerator, engine or socket unavailable.",
    )
    parser.add_argument("--check", action="store_true", help="print what /v1/info would answer, then exit")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {WORKER_VERSION} (protocol {PROTOCOL_VERSION})"
    )
    # How the worker starts a job's engine process; nobody else should.
    parser.add_argument("--engine-process", type=int, metavar="FD", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def serve(config: Config, nvml: Nvml, engine: Engine) -> int:
    """Serve the socket until SIGTERM or SIGINT; then cancel the job and remove the socket."""
    worker = Worker(config, nvml, engine)
    server = bind(config, worker)
    inode = os.lstat(config.socket_path).st_ino
    stopping = threading.Event()

    def on_signal(signum: int, _frame) -> None:
        log.info("%s received; stopping", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="socket", daemon=True)
    thread.start()
    log.info(
        "runtime worker %s listening on %s (protocol %d, artifacts %s, accelerator %s, %d GPU)",
        WORKER_VERSION,
        config.socket_path,
        PROTOCOL_VERSION,
        config.artifact_dir,
        config.accelerator_mode,
        len(nvml.devices),
    )
    while not stopping.wait(1.0):
        pass
    worker.stop()
    server.shutdown()
    server.server_close()
    remove_socket(config.socket_path, inode)
    log.info("stopped; socket %s removed", config.socket_path)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Parse settings, open NVML as the mode says, then --check or serve."""
    args = parse_args(argv)
    if args.engine_process is not None:
        code = engine_process_main(args.engine_process)
        sys.stdout.flush()
        os._exit(code)  # at once: the model is freed already, and llama.cpp's teardown adds nothing
    configure_logging()
    nvml = None
    try:
        config = load_config(dict(os.environ))
        if not Engine.installed():
            raise Unavailable("llama-cpp-python is not installed; install the project's `worker` extra")
        nvml = Nvml.open(config.accelerator_mode)
        engine = Engine()
        if args.check:
            info = Worker(config, nvml, engine).info()
            info.pop("job")
            print(json.dumps({**info, "accelerator_mode": config.accelerator_mode}, indent=2))
            return EXIT_OK
        return serve(config, nvml, engine)
    except ConfigError as error:
        log.error("%s", error)
        return EXIT_CONFIG
    except Unavailable as error:
        log.error("%s", error)
        return EXIT_UNAVAILABLE
    finally:
        if nvml is not None:
            nvml.close()


if __name__ == "__main__":
    sys.exit(main())
