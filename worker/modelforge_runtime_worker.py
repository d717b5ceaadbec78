"""ModelForge runtime worker: runs GGUF models for the node agent, over a Unix socket (W1, W2).

It holds no credential and needs no network: the node agent is its only client, speaking HTTP/1.1
on a Unix stream socket (protocol version 1, worker/README.md). It runs one job at a time:
runtime.benchmark.v1 measures a model as llama-bench does, runtime.generate.v1 completes prompts
at temperature 0 with a fixed seed. Standard library + llama-cpp-python; llama_cpp is imported
only when a job runs or the engine is asked about, and pynvml only when the accelerator mode
allows a GPU, so an idle worker stays small.

Sections: constants, configuration, NVML, engine, model files, job requests, measurement, jobs,
socket server, command line.

    python3 -m modelforge_runtime_worker [--check] [--version]

Exit codes: 0 stopped cleanly (SIGTERM, SIGINT); 2 a setting is invalid, the message names the
variable; 3 the accelerator mode cannot be met, the engine is not installed, or a live worker
already answers on the socket.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import importlib.util
import json
import logging
import os
import random
import re
import signal
import socket
import socketserver
import stat
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
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
SAMPLE_INTERVAL_SECONDS = 0.05  # peak RSS / GPU memory sampling during a job
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

# Error codes: the request's (4xx), the worker's (5xx), and the job's (in a job's status).
WORKER_REQUEST_INVALID = "WORKER_REQUEST_INVALID"
WORKER_REQUEST_TOO_LARGE = "WORKER_REQUEST_TOO_LARGE"
WORKER_ROUTE_UNKNOWN = "WORKER_ROUTE_UNKNOWN"
WORKER_METHOD_NOT_ALLOWED = "WORKER_METHOD_NOT_ALLOWED"
WORKER_JOB_UNKNOWN = "WORKER_JOB_UNKNOWN"
WORKER_BUSY = "WORKER_BUSY"
WORKER_INTERNAL_ERROR = "WORKER_INTERNAL_ERROR"
MODEL_FILE_INVALID = "MODEL_FILE_INVALID"
MODEL_LOAD_FAILED = "MODEL_LOAD_FAILED"
RUNTIME_FAILED = "RUNTIME_FAILED"
JOB_CANCELLED = "JOB_CANCELLED"

GGUF_MAGIC = b"GGUF"
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


def load_config(env: dict[str, str]) -> Config:
    """Read and check every setting, or raise ConfigError naming the first bad one."""
    mode = env.get("MODELFORGE_WORKER_ACCELERATOR_MODE", "").strip().lower() or "auto"
    if mode not in ACCELERATOR_MODES:
        raise ConfigError(
            f"MODELFORGE_WORKER_ACCELERATOR_MODE must be one of {', '.join(ACCELERATOR_MODES)}, not {mode!r}"
        )
    return Config(socket_path=_socket_path(env), artifact_dir=_artifact_dir(env), accelerator_mode=mode)


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


def _int(params: dict, name: str, default: int | None, bounds: tuple[int, int]) -> int | None:
    """An optional whole number within bounds (a bool is not one)."""
    value = params.get(name, default)
    if value is None:
        return None
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"params.{name}", f"must be a whole number from {low} to {high}")
    return value


def _string(params: dict, name: str, *, required: bool, limit: int = MAX_NAME_CHARS) -> str | None:
    """A non-empty string of at most `limit` characters with no NUL."""
    value = params.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > limit or "\0" in value:
        raise invalid(f"params.{name}", f"must be a non-empty string of at most {limit} characters")
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


# --------------------------------------------------------------------------- measurement


class Cancelled(Exception):
    """The job was cancelled; it stops where it is and frees the model."""


class CancelFlag:
    """A job's cancel flag, checked between token evaluations and, through llama.cpp's abort
    callback, between the graph nodes of one batch, so a long prompt batch stops within
    milliseconds on the CPU (a GPU batch is short anyway).

    The callback is a call from C into Python per graph node; for single-token decodes, where the
    flag is checked between tokens anyway, the benchmark leaves it off (`abortable`) so that it
    does not weigh on the generation figures.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._abort_callback = None  # kept referenced while llama.cpp may call it

    def set(self) -> None:
        """Ask the job to stop."""
        self._event.set()

    def is_set(self) -> bool:
        """Whether the job was asked to stop."""
        return self._event.is_set()

    def check(self) -> None:
        """Raise Cancelled if the job was asked to stop."""
        if self._event.is_set():
            raise Cancelled

    def attach(self, llama_cpp, llm) -> None:
        """Let llama.cpp abort a batch in progress when the flag is set, until detach()."""
        self._abort_callback = llama_cpp.ggml_abort_callback(lambda _data: self._event.is_set())
        llama_cpp.llama_set_abort_callback(llm.ctx, self._abort_callback, None)

    def detach(self, llama_cpp, llm) -> None:
        """No abort callback: llama.cpp runs each batch to its end."""
        llama_cpp.llama_set_abort_callback(llm.ctx, llama_cpp.ggml_abort_callback(), None)

    @contextmanager
    def abortable(self, llama_cpp, llm) -> Iterator[None]:
        """The abort callback on for the block's batches only."""
        self.attach(llama_cpp, llm)
        try:
            yield
        finally:
            self.detach(llama_cpp, llm)


def _read_status_bytes(field: str) -> int | None:
    """A `VmRSS`/`VmHWM`-style line of /proc/self/status, in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class PeakMemory:
    """The job's peak resident set and GPU memory in use.

    RSS: the kernel's high-water mark VmHWM, reset at the start (writing 5 to clear_refs), with
    sampling as the fallback where the reset is not allowed. GPU: NVML sampled every 50 ms,
    device memory in use summed over the job's GPUs (None when the job uses none).
    """

    def __init__(self, nvml: Nvml | None, uses_gpu: bool) -> None:
        self._nvml = nvml if uses_gpu else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm_reset = False
        self._rss_peak = 0
        self._gpu_peak: int | None = None

    def __enter__(self) -> PeakMemory:
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
                clear_refs.write("5")
            self._hwm_reset = True
        except OSError as error:
            log.debug("VmHWM reset not allowed (%s); sampling RSS instead", error.strerror)
        self._sample()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
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
        rss = _read_status_bytes("VmRSS")
        if rss is not None:
            self._rss_peak = max(self._rss_peak, rss)
        if self._nvml is not None:
            used = self._nvml.memory_used_bytes()
            if used is not None:
                self._gpu_peak = used if self._gpu_peak is None else max(self._gpu_peak, used)

    @property
    def peak_rss_bytes(self) -> int:
        """The highest resident set seen during the job."""
        hwm = _read_status_bytes("VmHWM") if self._hwm_reset else None
        return max(self._rss_peak, hwm or 0)

    @property
    def peak_gpu_memory_bytes(self) -> int | None:
        """The highest GPU memory in use during the job; None without a GPU or a reading."""
        return self._gpu_peak


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
    cancel: CancelFlag | None = None,
) -> dict:
    """Measure a loaded model as llama-bench does (W2); the procedure, figure by figure:

    - warm-up: one prompt batch and one generated token, not counted;
    - prompt processing, `repetitions` times: clear the KV cache, evaluate `prompt_tokens` random
      tokens in one batch (n_batch ≥ prompt_tokens), tokens / seconds;
    - generation, `repetitions` times: clear the KV cache, `generate_tokens` single-token
      evaluations of random tokens, tokens / seconds;
    - time to first token: clear, evaluate a fresh prompt of `prompt_tokens`, pick the first
      token (greedy), seconds.

    `step(phase)` is called as each piece ends, naming the phase that starts (`done` last). With
    a `cancel` flag, a set flag raises Cancelled between evals and aborts a prompt batch midway.
    """
    rng = random.Random(SEED)
    synchronize = llama_cpp.llama_synchronize
    check = cancel.check if cancel is not None else lambda: None

    def batch() -> AbstractContextManager:
        return cancel.abortable(llama_cpp, llm) if cancel is not None else nullcontext()

    def prompt_run(tokens: list[int]) -> float:
        check()
        llm.reset()  # the next eval removes every cached position: a clear KV cache
        start = time.perf_counter()
        with batch():
            llm.eval(tokens)
        synchronize(llm.ctx)
        return time.perf_counter() - start

    def generate_run(tokens: list[int]) -> float:
        llm.reset()
        start = time.perf_counter()
        for token in tokens:
            check()
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
    check()
    llm.reset()
    start = time.perf_counter()
    with batch():
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


# --------------------------------------------------------------------------- jobs


def release_freed_memory() -> None:
    """Hand the memory a finished job freed back to the OS; glibc would keep it, and idle RSS with it."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim with
        return
    malloc_trim(0)


class JobFailed(Exception):
    """A job ends failed with this error code."""

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


class Job:
    """One job: its status, updated by its thread and read by request handlers under a lock."""

    def __init__(self, request: JobRequest, model_path: Path) -> None:
        self.request = request
        self.model_path = model_path
        self.cancel = CancelFlag()
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._state = "running"
        self._phase = "loading"
        self._steps_done = 0
        self._result: dict | None = None
        self._error: dict | None = None

    @property
    def id(self) -> str:
        """The control plane's job id."""
        return self.request.id

    @property
    def running(self) -> bool:
        """Whether the job still holds the worker."""
        return not self.finished.is_set()

    def advance(self, phase: str) -> None:
        """One more step done, now in `phase`."""
        with self._lock:
            self._phase = phase
            self._steps_done += 1

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


class Worker:
    """The one job slot, with the engine and NVML: what the socket's requests ask of them."""

    def __init__(self, config: Config, nvml: Nvml, engine: Engine) -> None:
        self.config = config
        self.nvml = nvml
        self.engine = engine
        self._lock = threading.Lock()
        self._job: Job | None = None

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
        }

    def submit(self, body: object) -> dict:
        """POST /v1/jobs: start the job, or answer the status of the same id, or refuse."""
        request = parse_job_request(body)
        with self._lock:
            if self._job is not None and self._job.id == request.id:
                return self._job.status()  # a resent submission: a lost reply is harmless
            if self._job is not None and self._job.running:
                raise RequestError(409, WORKER_BUSY, f"job {self._job.id} is running; one job at a time", True)
            model_path = resolve_model_path(self.config.artifact_dir, request.params.model_path)
            self.engine.module()  # import before the job thread starts, so a broken install is a 500 here
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
        return job

    def cancel(self, job_id: str) -> dict:
        """POST /v1/jobs/{id}/cancel: ask the job to stop; answer once it has (or after a second)."""
        job = self.job(job_id)
        if job.running:
            log.info("job %s: cancel requested", job.id)
            job.cancel.set()
            job.finished.wait(CANCEL_REPLY_WAIT_SECONDS)
        return job.status()

    def stop(self) -> None:
        """Cancel a running job and wait for it to free its model (SIGTERM)."""
        with self._lock:
            job = self._job
        if job is not None and job.running:
            log.info("job %s: cancelled because the worker is stopping", job.id)
            job.cancel.set()
            job.finished.wait(STOP_WAIT_SECONDS)

    # -- the job thread

    def _run(self, job: Job) -> None:
        """Run one job to its end; whatever happens, the model is freed before the status says so."""
        started = time.monotonic()
        state, result, error = "failed", None, None
        try:
            result = self._execute(job)
            state = "succeeded"
        except Cancelled:
            state = "cancelled"
            error = {"code": JOB_CANCELLED, "message": "the job was cancelled", "retryable": False}
        except JobFailed as failure:
            error = {"code": failure.code, "message": failure.message, "retryable": failure.retryable}
        except Exception as unexpected:  # the job thread must always end the job's story with a status
            log.exception("job %s: unexpected error", job.id)
            error = {
                "code": WORKER_INTERNAL_ERROR,
                "message": f"{type(unexpected).__name__}: {unexpected}",
                "retryable": True,
            }
        finally:
            gc.collect()  # whatever cycles the job left (tracebacks, closures) go before the status says done
            release_freed_memory()
        job.finish(state, result, error)
        detail = f" ({error['code']}: {error['message']})" if error else ""
        log.info("job %s %s after %.2f s%s", job.id, state, time.monotonic() - started, detail)

    def _execute(self, job: Job) -> dict:
        """Load the model, run the job's procedure, build its result."""
        params = job.request.params
        llama_cpp = self.engine.module()
        engine = self.engine.info()
        gpu_layers = self._gpu_layers(engine, params)
        gpu_uuids = [device["uuid"] for device in self.nvml.devices] if gpu_layers != 0 else []
        with PeakMemory(self.nvml, uses_gpu=bool(gpu_uuids)) as memory:
            if isinstance(params, BenchmarkParams):
                n_ctx = params.prompt_tokens + params.generate_tokens
                n_batch = params.prompt_tokens  # the whole prompt in one llama_decode, as llama-bench
            else:
                # Every token holds at least one byte of its prompt; BOS and a margin on top.
                n_ctx = max(len(prompt.encode()) for prompt in params.prompts) + 8 + params.max_tokens
                n_batch = 512
            llm, load_seconds = self._load(job, llama_cpp, gpu_layers, n_ctx, n_batch)
            try:
                job.advance("warmup" if isinstance(params, BenchmarkParams) else "prompts")
                if isinstance(params, BenchmarkParams):
                    figures = self._benchmark(job, llm, llama_cpp, params)
                else:
                    figures = {"outputs": self._generate(job, llm, llama_cpp, params)}
            finally:
                llm.close()  # frees the model and context now, whatever still refers to the object
                del llm
        common = {"engine": engine, "model_file": params.model_file}
        if isinstance(params, BenchmarkParams):
            return {
                **common,
                "model_bytes": job.model_path.stat().st_size,
                "n_gpu_layers": gpu_layers,
                "gpu_uuids": gpu_uuids,
                "load_seconds": round(load_seconds, 6),
                "prompt_tokens": params.prompt_tokens,
                "generate_tokens": params.generate_tokens,
                "repetitions": params.repetitions,
                **figures,
                "peak_rss_bytes": memory.peak_rss_bytes,
                "peak_gpu_memory_bytes": memory.peak_gpu_memory_bytes,
            }
        return {
            **common,
            "seed": SEED,
            "temperature": 0.0,
            "max_tokens": params.max_tokens,
            "gpu_uuids": gpu_uuids,
            "load_seconds": round(load_seconds, 6),
            **figures,
        }

    def _gpu_layers(self, engine: dict, params: BenchmarkParams | GenerateParams) -> int:
        """Layers to offload: as asked (default all) with a CUDA engine and a GPU, else 0."""
        if engine["backend"] != "cuda" or not self.nvml.devices:
            return 0
        requested = getattr(params, "n_gpu_layers", None)
        return -1 if requested is None else requested

    def _load(self, job: Job, llama_cpp, gpu_layers: int, n_ctx: int, n_batch: int):
        """Check the GGUF magic and load the model; anything wrong is MODEL_LOAD_FAILED."""
        try:
            with open(job.model_path, "rb") as model:
                magic = model.read(len(GGUF_MAGIC))
        except OSError as error:
            raise JobFailed(MODEL_LOAD_FAILED, f"the model file cannot be read ({error.strerror})") from None
        if magic != GGUF_MAGIC:
            raise JobFailed(MODEL_LOAD_FAILED, f"not a GGUF file (starts with {magic!r}, not {GGUF_MAGIC!r})")
        job.cancel.check()
        self.engine.clear_errors()
        start = time.perf_counter()
        try:
            llm = llama_cpp.Llama(
                model_path=str(job.model_path),
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
            reason = self.engine.first_error or type(error).__name__
            raise JobFailed(MODEL_LOAD_FAILED, f"llama.cpp could not load the model: {reason}") from None
        load_seconds = time.perf_counter() - start
        log.info("job %s: model loaded in %.3f s (n_gpu_layers %d, n_ctx %d)", job.id, load_seconds, gpu_layers, n_ctx)
        if job.cancel.is_set():
            llm.close()
            raise Cancelled  # a load cannot be interrupted; a cancel during it takes effect here
        return llm, load_seconds

    def _benchmark(self, job: Job, llm, llama_cpp, params: BenchmarkParams) -> dict:
        """runtime.benchmark.v1 on the loaded model; a cancel stops it between evals or mid-batch."""
        try:
            return measure_benchmark(
                llm,
                llama_cpp,
                params.prompt_tokens,
                params.generate_tokens,
                params.repetitions,
                step=job.advance,
                cancel=job.cancel,
            )
        except RuntimeError as error:  # llama_decode's non-zero return, an abort included
            job.cancel.check()
            raise JobFailed(RUNTIME_FAILED, f"llama.cpp failed during the benchmark: {error}") from None

    def _generate(self, job: Job, llm, llama_cpp, params: GenerateParams) -> list[dict]:
        """runtime.generate.v1: each prompt from a fresh state, greedy, fixed seed."""
        outputs = []
        job.cancel.attach(llama_cpp, llm)
        stop_when_cancelled = llama_cpp.StoppingCriteriaList([lambda _tokens, _logits: job.cancel.is_set()])
        for prompt in params.prompts:
            job.cancel.check()
            llm.reset()  # fresh state: no prefix reuse, so results do not depend on prompt order
            try:
                completion = llm.create_completion(
                    prompt,
                    max_tokens=params.max_tokens,
                    temperature=0.0,
                    seed=SEED,
                    stopping_criteria=stop_when_cancelled,
                )
            except (RuntimeError, ValueError) as error:
                job.cancel.check()
                raise JobFailed(RUNTIME_FAILED, f"llama.cpp failed on a prompt: {error}") from None
            job.cancel.check()
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
            job.advance("prompts")
        return outputs


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
                self._answer(*getattr(self, "_" + action)(body, **match.groupdict()))
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

    def _submit(self, body: bytes) -> tuple[int, dict]:
        try:
            document = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise invalid("body", f"is not JSON ({error})") from None
        return 202, self.server.worker.submit(document)

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
