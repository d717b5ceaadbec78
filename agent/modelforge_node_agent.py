"""ModelForge node agent: the core that runs on every GPU host and only ever dials out.

Sections, each using only what the ones above it define: constants, configuration, NVML and
preflight, inventory, state, HTTP client, storage roots, runtime worker, jobs, safe paths, job
registry and runner, publishing loop, command line. Standard library + requests + nvidia-ml-py.

Each job family is a module beside this file that registers its handler when it is imported, and
it is imported only when a job of its type is claimed (JOB_FAMILIES), so an idle agent stays
small: modelforge_agent_acquire runs artifact.acquire.v1 with huggingface_hub (J3),
modelforge_agent_artifacts runs artifact.delete.v1 and keeps the disk in order (J5: quarantine
past its retention, partial directories of finished jobs, each root's use), and
modelforge_agent_runtime relays runtime.benchmark.v1 and runtime.generate.v1 to the separate
runtime worker (W1) over its Unix socket.

    python3 -m modelforge_node_agent [--preflight] [--once] [--version]
"""

from __future__ import annotations

import argparse
import atexit
import errno
import glob
import hashlib
import http.client
import importlib
import importlib.util
import json
import logging
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urlsplit

# --------------------------------------------------------------------------- constants

AGENT_VERSION = "0.1.0"
PROTOCOL_VERSION = 1

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_PREFLIGHT = 3
EXIT_ENROLLMENT_REFUSED = 4
EXIT_CREDENTIAL_REVOKED = 5

NVIDIA_NVML_UNAVAILABLE = "NVIDIA_NVML_UNAVAILABLE"
NVIDIA_DEVICE_NOT_FOUND = "NVIDIA_DEVICE_NOT_FOUND"
NVIDIA_TELEMETRY_UNAVAILABLE = "NVIDIA_TELEMETRY_UNAVAILABLE"
TELEMETRY_METRICS = ("utilization_gpu_percent", "memory_used_bytes", "temperature_c", "power_w")
# N1: a GPU whose utilisation and memory cannot be read gives the scheduler nothing to go on.
REQUIRED_METRICS = ("utilization_gpu_percent", "memory_used_bytes")

BACKOFF_MIN_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 16.0
INVENTORY_CHECK_SECONDS = 60.0
INVENTORY_MAX_AGE_SECONDS = 3600.0
RETRY_AFTER_MAX_SECONDS = 3600  # A2: the longest Retry-After the agent honours as given
SERVER_WORDS_MAX = 600  # the most of a refusal's message and next step one log line carries
# N4: the four named data directories: the variable that sets each, and its default (the image's
# volumes, D2). Outside the image each must be set: health and --preflight check all four.
DATA_DIRS = {
    "state": ("MODELFORGE_AGENT_STATE_DIR", "/data/state"),
    "hf-cache": ("MODELFORGE_AGENT_HF_CACHE_DIR", "/data/hf-cache"),
    "artifacts": ("MODELFORGE_AGENT_ARTIFACT_DIR", "/data/artifacts"),
    "quarantine": ("MODELFORGE_AGENT_QUARANTINE_DIR", "/data/quarantine"),
}
# Example hosts from our docs: an agent pointed at one was never configured.
PLACEHOLDER_HOSTS = ("modelforge.example", "example.com", "example.internal")

# J2: the job types this agent can run (JOB_FAMILIES says which module runs each), and the job
# error codes the core reports or is answered with; each family's module names its own.
ACQUIRE_JOB_TYPE = "artifact.acquire.v1"
DELETE_JOB_TYPE = "artifact.delete.v1"  # J5: modelforge_agent_artifacts removes a verified artifact
RUNTIME_BENCHMARK_JOB_TYPE = "runtime.benchmark.v1"
RUNTIME_GENERATE_JOB_TYPE = "runtime.generate.v1"
# S2: advertised while a compatible worker that serves answers (its /v1/info has `serving`); not a
# job type, so it is no JOB_FAMILIES entry: the heartbeat reply carries this node's deployments.
RUNTIME_SERVE_CAPABILITY = "runtime.serve.v1"
ARTIFACT_PATH_UNSAFE = "ARTIFACT_PATH_UNSAFE"
JOB_LEASE_LOST = "JOB_LEASE_LOST"
JOB_CANCELLED = "JOB_CANCELLED"
JOB_PARAMS_INVALID = "JOB_PARAMS_INVALID"
JOB_TYPE_UNSUPPORTED = "JOB_TYPE_UNSUPPORTED"
RUNTIME_WORKER_UNAVAILABLE = "RUNTIME_WORKER_UNAVAILABLE"
# A directory opened without following a symlink: how every path below a trusted base is walked.
O_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# V1: the GPU facts nvidia-smi prints, relayed raw beside NVML's for the control plane to compare.
NVIDIA_SMI_ARGS = ("--query-gpu=name,uuid,driver_version,memory.total", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT_SECONDS = 5.0
NVIDIA_SMI_MAX_OUTPUT = 16 * 1024  # the inventory's limit (app/api/bodies.py MAX_NVIDIA_SMI_OUTPUT)

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
STALL_SECONDS = 30.0  # J2: a transfer with no byte for this long is a stall (MODELFORGE_AGENT_STALL_SECONDS)
# J2: the longest one Hub API call may take, every retry, wait and page included: the revision
# lookup, or the whole tree listing (MODELFORGE_AGENT_HUB_DEADLINE_SECONDS). The acquire module
# holds the other Hub limits (Retry-After cap, pages, entries).
HUB_DEADLINE_SECONDS = 300.0
# J5: a verification failure's evidence in the quarantine directory is kept this long, then the
# agent removes it (MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS; 0 keeps it forever). It looks
# when it starts and then hourly.
QUARANTINE_RETENTION_DAYS = 14.0
QUARANTINE_PRUNE_EVERY_SECONDS = 3600.0
# J5: each root's use (artifacts, partials) and the quarantine's is measured at most this often,
# and again as soon as a job has ended or a finished job's partial directory was removed.
STORAGE_USE_SECONDS = 60.0
PROGRESS_INTERVAL_SECONDS = 10.0  # when a claim names none
STORAGE_REPORT_SECONDS = 60.0  # J1: root observations go out at least this often
NOTABLE_FREE_CHANGE = 0.01  # … and sooner when free space moves by 1 % of the filesystem
ROOT_PROBLEM_MAX = 500  # J1: a root's `problem` as the heartbeat may carry it (the control plane's bound)
FINAL_REPORT_PATIENCE_SECONDS = 600.0  # how long a complete/fail report is retried while unreachable
MANIFEST_NAME = "modelforge-manifest.json"  # J3: an acquire writes it; a runtime job trusts only what it lists

# W1: the runtime worker and the protocol versions of its socket this agent speaks.
WORKER_PROTOCOLS = (1,)
DEFAULT_WORKER_SOCKET = "/run/modelforge/worker.sock"
UNIX_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one NUL
WORKER_CONNECT_TIMEOUT_SECONDS = 1.0  # a local socket answers at once or not at all
WORKER_READ_TIMEOUT_SECONDS = 5.0
WORKER_REPLY_MAX_BYTES = 1 << 20  # a generate result of 16 prompts is far below this
MAX_WORKER_DEVICES = 64
JOB_STOP_GRACE_SECONDS = 1.0  # how long a stopping agent lets a running job tell its worker

log = logging.getLogger("modelforge_node_agent")

# --------------------------------------------------------------------------- configuration


class ConfigError(Exception):
    """A setting is missing or invalid; the message names the variable. main() exits 2 with it."""


@dataclass(frozen=True)
class HubSettings:
    """Where artifacts come from (J3): the Hub endpoint, the optional token, the stall limit and
    the deadline of each Hub API call.

    The token lives only here, in memory: it is never logged, put in a URL, an error or a result,
    and never sent to a host other than the endpoint's.
    """

    endpoint: str = DEFAULT_HF_ENDPOINT
    token: str | None = field(default=None, repr=False)
    stall_seconds: float = STALL_SECONDS
    deadline_seconds: float = HUB_DEADLINE_SECONDS


@dataclass(frozen=True)
class Config:
    """The agent's settings, from MODELFORGE_AGENT_* variables."""

    control_plane_url: str | None
    enrollment_token: str | None
    display_name: str | None
    hostname: str
    accelerator_mode: str
    tls_verify: bool
    ca_cert_path: str | None
    identity_mode: str
    state_dir: Path
    data_dirs: dict[str, Path]
    hub: HubSettings = field(default_factory=HubSettings)
    worker_socket: str = DEFAULT_WORKER_SOCKET
    quarantine_retention_days: float = QUARANTINE_RETENTION_DAYS

    @property
    def verify(self) -> bool | str:
        """What requests should verify the control plane's certificate with."""
        if self.ca_cert_path:
            return self.ca_cert_path
        return self.tls_verify


def _env_bool(env: dict[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _control_plane_url(env: dict[str, str]) -> str:
    name = "MODELFORGE_AGENT_CONTROL_PLANE_URL"
    url = env.get(name, "").strip().rstrip("/")
    if not url:
        raise ConfigError(f"{name} is not set; set it to the control plane's https:// address")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ConfigError(f"{name} is not a valid URL: {url!r}") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ConfigError(f"{name} must be an http(s) URL such as https://modelforge.lan, got {url!r}")
    if any(parts.hostname == host or parts.hostname.endswith("." + host) for host in PLACEHOLDER_HOSTS):
        raise ConfigError(f"{name} is still the example placeholder ({parts.hostname}); set it to your control plane")
    return url


def _hf_endpoint(env: dict[str, str]) -> str:
    """HF_ENDPOINT (J3: mirrors are honoured), an http(s) origin with an optional path."""
    url = env.get("HF_ENDPOINT", "").strip().rstrip("/") or DEFAULT_HF_ENDPOINT
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ConfigError(f"HF_ENDPOINT is not a valid URL: {url!r}") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.query or parts.username:
        raise ConfigError(f"HF_ENDPOINT must be an http(s) URL such as {DEFAULT_HF_ENDPOINT}, got {url!r}")
    return url


def _hf_token(env: dict[str, str]) -> str | None:
    """MODELFORGE_HF_TOKEN, or the file MODELFORGE_HF_TOKEN_FILE names; never echoed in an error."""
    token = env.get("MODELFORGE_HF_TOKEN", "").strip()
    path = env.get("MODELFORGE_HF_TOKEN_FILE", "").strip()
    if token and path:
        raise ConfigError("set MODELFORGE_HF_TOKEN or MODELFORGE_HF_TOKEN_FILE, not both")
    name = "MODELFORGE_HF_TOKEN"
    if path:
        name = "MODELFORGE_HF_TOKEN_FILE"
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise ConfigError(f"{name}={path} cannot be read ({reason})") from None
    # It goes into an HTTP header: one printable word, or a header could be forged with it.
    if token and not re.fullmatch(r"[\x21-\x7e]+", token):
        raise ConfigError(f"{name} holds characters a Hub token never has (spaces or control characters)")
    return token or None


def _seconds(env: dict[str, str], name: str, default: float) -> float:
    """A number of seconds between 0.1 and an hour, or the default when unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0.1 <= seconds <= 3600:
        raise ConfigError(f"{name} must be between 0.1 and 3600 seconds, got {raw!r}")
    return seconds


def _days(env: dict[str, str], name: str, default: float) -> float:
    """A number of days from 0 to 3650 (0: never), or the default when unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        days = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of days, got {raw!r}") from None
    if not 0 <= days <= 3650:
        raise ConfigError(f"{name} must be between 0 (keep forever) and 3650 days, got {raw!r}")
    return days


def _worker_socket(env: dict[str, str]) -> str:
    """MODELFORGE_AGENT_WORKER_SOCKET: where the runtime worker listens (W1)."""
    name = "MODELFORGE_AGENT_WORKER_SOCKET"
    path = env.get(name, "").strip() or DEFAULT_WORKER_SOCKET
    if not os.path.isabs(path) or "\0" in path:
        raise ConfigError(f"{name} must be an absolute path such as {DEFAULT_WORKER_SOCKET}, got {path!r}")
    if len(os.fsencode(path)) > UNIX_SOCKET_PATH_MAX:
        raise ConfigError(f"{name} is longer than a Unix socket path may be ({UNIX_SOCKET_PATH_MAX} bytes)")
    return path


def load_config(env: dict[str, str], *, need_url: bool = True) -> Config:
    """Read and validate the agent's environment."""
    mode = env.get("MODELFORGE_AGENT_ACCELERATOR_MODE", "auto").strip().lower() or "auto"
    if mode not in {"nvidia", "cpu", "auto"}:
        raise ConfigError(f"MODELFORGE_AGENT_ACCELERATOR_MODE must be nvidia, cpu or auto, got {mode!r}")
    identity_mode = env.get("MODELFORGE_AGENT_IDENTITY_MODE", "persisted").strip() or "persisted"
    if identity_mode != "persisted":
        raise ConfigError(f"MODELFORGE_AGENT_IDENTITY_MODE supports only 'persisted', got {identity_mode!r}")
    tls_verify = _env_bool(env, "MODELFORGE_AGENT_TLS_VERIFY", True)
    ca_cert_path = env.get("MODELFORGE_AGENT_CA_CERT_PATH", "").strip() or None
    if ca_cert_path and not os.access(ca_cert_path, os.R_OK):
        raise ConfigError(f"MODELFORGE_AGENT_CA_CERT_PATH={ca_cert_path} is not a readable file")
    if ca_cert_path and not tls_verify:
        raise ConfigError("MODELFORGE_AGENT_TLS_VERIFY=false contradicts MODELFORGE_AGENT_CA_CERT_PATH")
    dirs = {name: Path(env.get(variable) or default) for name, (variable, default) in DATA_DIRS.items()}
    return Config(
        control_plane_url=_control_plane_url(env) if need_url else None,
        enrollment_token=env.get("MODELFORGE_AGENT_ENROLLMENT_TOKEN", "").strip() or None,
        display_name=env.get("MODELFORGE_AGENT_DISPLAY_NAME", "").strip() or None,
        hostname=env.get("MODELFORGE_AGENT_HOSTNAME", "").strip() or socket.gethostname(),
        accelerator_mode=mode,
        tls_verify=tls_verify,
        ca_cert_path=ca_cert_path,
        identity_mode=identity_mode,
        state_dir=dirs["state"],
        data_dirs=dirs,
        hub=HubSettings(
            endpoint=_hf_endpoint(env),
            token=_hf_token(env),
            stall_seconds=_seconds(env, "MODELFORGE_AGENT_STALL_SECONDS", STALL_SECONDS),
            deadline_seconds=_seconds(env, "MODELFORGE_AGENT_HUB_DEADLINE_SECONDS", HUB_DEADLINE_SECONDS),
        ),
        worker_socket=_worker_socket(env),
        quarantine_retention_days=_days(env, "MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS", QUARANTINE_RETENTION_DAYS),
    )


def ensure_state_dir(config: Config) -> None:
    """Create the state directory (0700) and prove it is writable, or raise ConfigError."""
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = tempfile.NamedTemporaryFile(dir=config.state_dir, prefix=".probe-", delete=True)
        probe.close()
    except OSError as error:
        raise ConfigError(
            f"MODELFORGE_AGENT_STATE_DIR={config.state_dir} is not writable ({error.strerror}); "
            "mount a durable volume there"
        ) from None


# --------------------------------------------------------------------------- NVML and preflight


def rfc3339_now() -> str:
    """The current UTC time in RFC 3339."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML reported it (N4); a fact NVML could not read is None, its error in unknown_reasons."""

    index: int
    uuid: str | None
    name: str | None
    memory_total_bytes: int | None
    driver_version: str | None
    cuda_driver_version: str | None
    pci_bus_id: str | None
    unknown_reasons: dict[str, str] = field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        """The GPU as the inventory request carries it; the NVML index and errors stay local."""
        return {
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "pci_bus_id": self.pci_bus_id,
        }


class Nvml:
    """NVML behind one wrapper: lazy init under a lock, shutdown at exit, per-call errors kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._module = None

    def module(self):
        """Import and initialise pynvml once; raises ImportError or NVMLError."""
        with self._lock:
            if self._module is None:
                pynvml = importlib.import_module("pynvml")
                pynvml.nvmlInit()
                atexit.register(self.shutdown)
                self._module = pynvml
            return self._module

    def shutdown(self) -> None:
        """Release NVML; errors at exit are of no use to anyone."""
        with self._lock:
            if self._module is not None:
                try:
                    self._module.nvmlShutdown()
                except self._module.NVMLError:
                    pass
                self._module = None

    @staticmethod
    def _text(value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _call(self, errors: dict[str, str], name: str, function, *args):
        """One NVML call; an NVMLError becomes an error record instead of a crash."""
        pynvml = self._module
        try:
            return function(*args)
        except pynvml.NVMLError as error:
            errors[name] = type(error).__name__
            return None

    def gpus(self) -> list[GpuFacts]:
        """Inventory facts for every GPU NVML reports."""
        pynvml = self.module()
        system_errors: dict[str, str] = {}
        driver = self._call(system_errors, "driver_version", pynvml.nvmlSystemGetDriverVersion)
        cuda = self._call(system_errors, "cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            errors = dict(system_errors)
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid_ = self._call(errors, "uuid", pynvml.nvmlDeviceGetUUID, handle)
            name = self._call(errors, "name", pynvml.nvmlDeviceGetName, handle)
            memory = self._call(errors, "memory_total_bytes", pynvml.nvmlDeviceGetMemoryInfo, handle)
            pci = self._call(errors, "pci_bus_id", pynvml.nvmlDeviceGetPciInfo, handle)
            gpus.append(
                GpuFacts(
                    index=index,
                    uuid=self._text(uuid_) if uuid_ is not None else None,
                    name=self._text(name) if name is not None else None,
                    memory_total_bytes=int(memory.total) if memory is not None else None,
                    driver_version=self._text(driver) if driver is not None else None,
                    cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda is not None else None,
                    pci_bus_id=self._text(pci.busId) if pci is not None else None,
                    unknown_reasons=errors,
                )
            )
        return gpus

    def sample(self, index: int, gpu_uuid: str) -> tuple[dict[str, object], dict[str, str]]:
        """Read one GPU's telemetry now; a metric NVML cannot read is None with its error."""
        pynvml = self.module()
        errors: dict[str, str] = {}
        handle = self._call(errors, "handle", pynvml.nvmlDeviceGetHandleByIndex, index)
        metrics: dict[str, object] = dict.fromkeys(TELEMETRY_METRICS)
        if handle is not None:
            utilization = self._call(errors, "utilization_gpu_percent", pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._call(errors, "memory_used_bytes", pynvml.nvmlDeviceGetMemoryInfo, handle)
            temperature = self._call(
                errors, "temperature_c", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
            )
            power = self._call(errors, "power_w", pynvml.nvmlDeviceGetPowerUsage, handle)
            metrics = {
                "utilization_gpu_percent": float(utilization.gpu) if utilization is not None else None,
                "memory_used_bytes": int(memory.used) if memory is not None else None,
                "temperature_c": float(temperature) if temperature is not None else None,
                "power_w": round(power / 1000.0, 3) if power is not None else None,  # NVML gives mW
            }
        sample = {"gpu_uuid": gpu_uuid, "sampled_at": rfc3339_now(), **metrics}
        return sample, errors


@dataclass
class Preflight:
    """The outcome of the NVIDIA preflight (N1–N3)."""

    nvidia_required: bool
    reason: str
    code: str | None = None
    hint: str | None = None
    gpus: list[GpuFacts] = field(default_factory=list)
    samples: list[dict[str, object]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the agent may go on to enrol and publish."""
        return self.code is None


def nvidia_devices_seen(env: dict[str, str], root: str = "/") -> str | None:
    """N1 `auto`: why NVIDIA hardware is expected here, or None."""
    devices = sorted(glob.glob(os.path.join(root, "dev", "nvidia*")))
    if devices:
        return f"found {os.path.basename(devices[0])} under {os.path.join(root, 'dev')}"
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if visible and visible.lower() not in {"void", "none"}:
        return f"NVIDIA_VISIBLE_DEVICES={visible}"
    return None


def run_preflight(mode: str, nvml: Nvml, env: dict[str, str], root: str = "/") -> Preflight:
    """Decide whether NVML is required and, if so, that it works for every GPU (N1, N2)."""
    if mode == "cpu":
        return Preflight(False, "MODELFORGE_AGENT_ACCELERATOR_MODE=cpu: NVML is never loaded")
    if mode == "auto":
        seen = nvidia_devices_seen(env, root)
        if seen is None:
            return Preflight(False, "auto: no /dev/nvidia* devices and no NVIDIA_VISIBLE_DEVICES; CPU-only node")
        reason = f"auto: {seen}, so NVML is required"
    else:
        reason = "MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia: NVML is required"
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError:
        return Preflight(
            True,
            reason,
            NVIDIA_NVML_UNAVAILABLE,
            "the pynvml module (nvidia-ml-py) is not installed in this image",
        )
    try:
        nvml.module()
    except pynvml.NVMLError as error:
        return Preflight(
            True,
            reason,
            NVIDIA_NVML_UNAVAILABLE,
            f"{type(error).__name__}: libnvidia-ml.so.1 could not be used; run the container with the "
            "NVIDIA Container Toolkit (--gpus all or a device reservation) on a glibc-based image",
        )
    try:
        gpus = nvml.gpus()
    except pynvml.NVMLError as error:
        return Preflight(True, reason, NVIDIA_DEVICE_NOT_FOUND, f"{type(error).__name__} while listing GPUs")
    if not gpus:
        return Preflight(
            True,
            reason,
            NVIDIA_DEVICE_NOT_FOUND,
            "NVML reports no GPU; check NVIDIA_VISIBLE_DEVICES and nvidia-smi",
        )
    result = Preflight(True, reason, gpus=gpus)
    for gpu in gpus:
        if gpu.uuid is None:
            result.code, result.hint = NVIDIA_DEVICE_NOT_FOUND, f"GPU {gpu.index} has no readable UUID"
            return result
        sample, errors = nvml.sample(gpu.index, gpu.uuid)
        missing = [metric for metric in REQUIRED_METRICS if sample[metric] is None]
        if missing:
            detail = ", ".join(
                f"{metric}: {errors.get(metric, errors.get('handle', 'unreadable'))}" for metric in missing
            )
            result.code = NVIDIA_TELEMETRY_UNAVAILABLE
            result.hint = f"GPU {gpu.uuid} telemetry unreadable ({detail})"
            return result
        result.samples.append(sample)
    return result


def preflight_report(
    result: Preflight, directories: dict[str, Path] | None = None, problems: dict[str, str] | None = None
) -> str:
    """A short human report of the preflight: the NVIDIA checks, then each data directory given."""
    lines = [f"modelforge-node-agent {AGENT_VERSION} preflight", f"  accelerator: {result.reason}"]
    for gpu in result.gpus:
        memory = gpu.memory_total_bytes
        memory_text = f"{memory / 2**30:.1f} GiB" if isinstance(memory, int) else "unknown"
        lines.append(
            f"  GPU {gpu.index}: {gpu.name} {gpu.uuid} {memory_text} "
            f"driver {gpu.driver_version} CUDA {gpu.cuda_driver_version} PCI {gpu.pci_bus_id}"
        )
    for sample in result.samples:
        lines.append(
            f"  telemetry {sample['gpu_uuid']}: util {sample['utilization_gpu_percent']}% "
            f"mem {sample['memory_used_bytes']}B temp {sample['temperature_c']}C power {sample['power_w']}W"
        )
    problems = problems or {}
    for name, path in (directories or {}).items():
        if name in problems:
            lines.append(f"  data directory {name}: {problems[name]}; create it or set {DATA_DIRS[name][0]}")
        else:
            lines.append(f"  data directory {name}: {path} is writable")
    if not result.ok:
        lines.append(f"  result: FAIL {result.code}: {result.hint}")
    elif problems:
        lines.append(f"  result: FAIL data directories unusable: {', '.join(sorted(problems))}")
    else:
        lines.append("  result: PASS")
    return "\n".join(lines)


# --------------------------------------------------------------------------- inventory


def short_text(value: object, limit: int) -> str | None:
    """A string from outside (nvidia-smi, the runtime worker) as the inventory may carry it:
    printable, at most `limit` characters; None for anything that is not a string."""
    if not isinstance(value, str):
        return None
    return "".join(char if char.isprintable() else "?" for char in value[:limit])


def label(value: object, limit: int) -> str | None:
    """short_text() without outer spaces, or None when nothing is left: a name that must say something."""
    text = short_text(value, limit)
    if text is None or not text.strip():
        return None
    return text.strip()


def whole_number(value: object) -> int | None:
    """A non-negative JSON integer, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def os_release(root: str = "/") -> str | None:
    """PRETTY_NAME from os-release, or None."""
    for path in ("etc/os-release", "usr/lib/os-release"):
        text = _read(os.path.join(root, path))
        if text is None:
            continue
        for line in text.splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    return None


def cpu_model(root: str = "/") -> str | None:
    """The first `model name` in /proc/cpuinfo, or None."""
    text = _read(os.path.join(root, "proc/cpuinfo")) or ""
    for line in text.splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return None


def cgroup_cpu_limit(root: str = "/") -> float | None:
    """CPUs allowed by the container's cgroup (v2 cpu.max, v1 cfs quota), or None if unlimited."""
    text = _read(os.path.join(root, "sys/fs/cgroup/cpu.max"))
    if text:
        quota, _, period = text.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    for base in ("sys/fs/cgroup/cpu", "sys/fs/cgroup/cpu,cpuacct"):
        quota = _read(os.path.join(root, base, "cpu.cfs_quota_us"))
        period = _read(os.path.join(root, base, "cpu.cfs_period_us"))
        if quota and period and int(quota) > 0:
            return int(quota) / int(period)
    return None


def cgroup_memory_limit(root: str = "/") -> int | None:
    """Bytes allowed by the container's cgroup (v2 memory.max, v1 limit_in_bytes), or None."""
    text = _read(os.path.join(root, "sys/fs/cgroup/memory.max"))
    if text:
        return None if text == "max" else int(text)
    text = _read(os.path.join(root, "sys/fs/cgroup/memory/memory.limit_in_bytes"))
    # cgroup v1 writes a page-rounded 2**63 when there is no limit.
    if text and int(text) < 2**60:
        return int(text)
    return None


def host_memory_bytes(root: str = "/") -> int | None:
    """MemTotal from /proc/meminfo, or None."""
    for line in (_read(os.path.join(root, "proc/meminfo")) or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def storage(directories: dict[str, Path]) -> dict[str, dict[str, object]]:
    """Total and free bytes of the named data directories only (N4)."""
    facts = {}
    for name, path in directories.items():
        try:
            stats = os.statvfs(path)
        except OSError as error:
            facts[name] = {
                "path": str(path),
                "total_bytes": None,
                "free_bytes": None,
                "unknown_reason": error.strerror,
            }
            continue
        facts[name] = {
            "path": str(path),
            "total_bytes": stats.f_blocks * stats.f_frsize,
            "free_bytes": stats.f_bavail * stats.f_frsize,
        }
    return facts


# V1: this process's start, random per run, so the control plane sees a restart as a new id and
# compares the node ID and GPU UUIDs before and after it (the restart identity item).
PROCESS_START = {"start_id": uuid.uuid4().hex, "started_at": rfc3339_now()}


def run_nvidia_smi(env: dict[str, str] | None = None) -> dict[str, object]:
    """V1: nvidia-smi's answer to NVIDIA_SMI_ARGS, raw and capped, or why there is none; never raises."""
    path = shutil.which("nvidia-smi", path=(env if env is not None else os.environ).get("PATH"))
    if path is None:
        return {"output": None, "problem": "nvidia-smi is not on PATH"}
    try:
        done = subprocess.run(
            [path, *NVIDIA_SMI_ARGS],
            capture_output=True,
            timeout=NVIDIA_SMI_TIMEOUT_SECONDS,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"output": None, "problem": f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_SECONDS:g} s"}
    except OSError as error:
        return {"output": None, "problem": short_text(f"nvidia-smi could not be run: {error.strerror or error}", 500)}
    if done.returncode != 0:
        said = (
            done.stderr.decode("utf-8", "replace").strip().splitlines()
            or done.stdout.decode("utf-8", "replace").strip().splitlines()
            or [""]
        )
        problem = short_text(f"nvidia-smi exited with status {done.returncode}: {said[0]}".rstrip(": "), 500)
        return {"output": None, "problem": problem, "exit_status": max(-256, min(done.returncode, 255))}
    output = done.stdout[:NVIDIA_SMI_MAX_OUTPUT].decode("utf-8", "replace").replace("\x00", "")
    return {"output": output, "problem": None, "exit_status": 0}


class NvidiaSmi:
    """Runs nvidia-smi at start and again only when NVML's GPUs change, not at every inventory check."""

    def __init__(self) -> None:
        self._seen: tuple | None = None
        self._facts: dict[str, object] = {}

    def facts(self, gpus: list[GpuFacts]) -> dict[str, object]:
        """nvidia-smi's latest answer for this set of GPUs."""
        seen = tuple((gpu.uuid, gpu.name, gpu.driver_version, gpu.memory_total_bytes) for gpu in gpus)
        if seen != self._seen:
            self._seen, self._facts = seen, run_nvidia_smi()
        return self._facts


def collect_inventory(config: Config, gpus: list[GpuFacts], root: str = "/") -> dict[str, object]:
    """N4 facts as this container really has them; unknowns are None with a reason."""
    unknown: dict[str, str] = {}
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count()
    cpu_limit = cgroup_cpu_limit(root)
    cpu_count = min(affinity, cpu_limit) if cpu_limit is not None and affinity else affinity
    host_memory = host_memory_bytes(root)
    memory_limit = cgroup_memory_limit(root)
    memory = min(filter(None, (host_memory, memory_limit)), default=None)
    if memory is None:
        unknown["memory_total_bytes"] = "neither /proc/meminfo nor a cgroup memory limit was readable"
    model = cpu_model(root)
    if model is None:
        unknown["cpu_model"] = "no model name in /proc/cpuinfo"
    release = os_release(root)
    if release is None:
        unknown["os"] = "no os-release file"
    return {
        "hostname": config.hostname,
        "os": release,
        "kernel": platform.release() or None,
        "architecture": platform.machine() or None,
        "cpu_model": model,
        "cpu_count": round(cpu_count, 2) if isinstance(cpu_count, float) else cpu_count,
        "cpu_limited_by_cgroup": cpu_limit is not None,
        "memory_total_bytes": memory,
        "memory_limited_by_cgroup": memory_limit is not None and (host_memory is None or memory_limit < host_memory),
        "storage": storage(config.data_dirs),
        "accelerator_mode": config.accelerator_mode,
        "gpus": [gpu.to_wire() for gpu in gpus],
        "gpu_unknown_reasons": {gpu.uuid: gpu.unknown_reasons for gpu in gpus if gpu.unknown_reasons},
        "unknown_reasons": unknown,
        "agent": {"version": AGENT_VERSION, "python": platform.python_version(), **PROCESS_START},
    }


# --------------------------------------------------------------------------- state


def write_private_file(path: Path, text: str) -> None:
    """Write atomically (temp file, fsync, rename) with mode 0600 (I2)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class State:
    """The node ID and credential in the state directory (I1–I3); never /etc/machine-id."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.node_id_path = directory / "node-id"
        self.credential_path = directory / "node-credential"

    @staticmethod
    def _read_state(path: Path) -> str | None:
        """A state file's text; None only when it does not exist (I1: never guess a new identity)."""
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise ConfigError(
                f"{path} exists but cannot be read ({reason}); fix its ownership (uid 65532 in the image) "
                "rather than letting the node take a new identity"
            ) from None

    def node_id(self) -> str:
        """The persisted node ID, created on first start."""
        text = self._read_state(self.node_id_path)
        if text:
            try:
                return str(uuid.UUID(text))
            except ValueError:
                raise ConfigError(
                    f"{self.node_id_path} does not hold a UUID; restore it from a backup or re-enrol"
                ) from None
        node_id = str(uuid.uuid4())
        write_private_file(self.node_id_path, node_id)
        return node_id

    def credential(self) -> str | None:
        """The stored node credential, if any."""
        return self._read_state(self.credential_path)

    def store_credential(self, credential: str) -> None:
        """Keep the credential from a claim."""
        write_private_file(self.credential_path, credential)


# --------------------------------------------------------------------------- HTTP client


def as_dict(value: object) -> dict:
    """`value` if it is a JSON object, else an empty one: replies are read defensively."""
    return value if isinstance(value, dict) else {}


class PublishError(Exception):
    """A request that did not succeed, described without its body or any secret (A3).

    `reply` is the parsed JSON object of an HTTP error (empty otherwise): the agent reads a
    few fields of it (the error's message, the compatibility answer), but describe() never
    shows it. `retry_after` is the reply's Retry-After in seconds, when it named a number.
    """

    def __init__(
        self,
        method: str,
        path: str,
        kind: str,
        status: int | None = None,
        code: str | None = None,
        reply: dict[str, object] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.method, self.path, self.kind, self.status, self.code = method, path, kind, status, code
        self.reply: dict[str, object] = reply if reply is not None else {}
        self.retry_after = retry_after
        super().__init__(self.describe())

    def describe(self) -> str:
        """`ConnectError on POST /path` or `HTTP 401 CREDENTIAL_REVOKED on POST /path`."""
        if self.status is not None:
            return f"HTTP {self.status} {self.code or 'ERROR'} on {self.method} {self.path}"
        return f"{self.kind} on {self.method} {self.path}"

    def server_says(self) -> str:
        """The error's `message` and `next_step` as the control plane wrote them (issue 22: "check
        the node's clock" reaches the log), one line, bounded; empty when the reply had none. The
        control plane's error shape never carries a secret or the request's body (P5)."""
        details = as_dict(self.reply.get("error"))
        words = [details.get(name) for name in ("message", "next_step")]
        text = " ".join(word.strip() for word in words if isinstance(word, str) and word.strip())
        return " ".join(text.split())[:SERVER_WORDS_MAX]


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's delay in seconds (the form this control plane sends), at most an
    hour so a wrong header cannot silence the node; None when absent or an HTTP date."""
    if value is None or not value.strip().isdigit():
        return None
    return float(min(int(value.strip()), RETRY_AFTER_MAX_SECONDS))


class Client:
    """Outbound-only HTTP to the control plane (P1)."""

    def __init__(self, config: Config) -> None:
        # The agent only ever reads JSON (whose encoding RFC 8259 fixes), so requests' optional
        # character-set detector would be 4 MiB of resident memory for nothing: leave it out.
        for detector in ("charset_normalizer", "chardet"):
            sys.modules.setdefault(detector, None)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unable to find acceptable character detection")
            import requests

        self._requests = requests
        self.base = config.control_plane_url
        self.session = requests.Session()
        self.session.verify = config.verify
        self.session.headers["User-Agent"] = f"modelforge-node-agent/{AGENT_VERSION}"
        self.credential: str | None = None

    def post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        """POST JSON; return the reply, or raise PublishError naming what failed."""
        requests = self._requests
        headers = {"Authorization": f"Bearer {self.credential}"} if self.credential else {}
        try:
            response = self.session.post(self.base + path, json=body, headers=headers, timeout=(5, 15))
        except requests.exceptions.SSLError:
            raise PublishError(
                "POST",
                path,
                "TLSError (certificate verify failed: set MODELFORGE_AGENT_CA_CERT_PATH "
                "to the CA that signed the control plane's certificate; never turn off "
                "TLS verification)",
            ) from None
        except requests.exceptions.ConnectionError:
            raise PublishError("POST", path, "ConnectError") from None
        except requests.exceptions.Timeout:
            raise PublishError("POST", path, "Timeout") from None
        except requests.exceptions.RequestException as error:
            raise PublishError("POST", path, type(error).__name__) from None
        try:
            reply = response.json()
        except ValueError:
            reply = {}
        if not isinstance(reply, dict):
            reply = {}
        if response.status_code >= 400:
            error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            code = error.get("code") if isinstance(error.get("code"), str) else None
            retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            raise PublishError("POST", path, "HTTPError", response.status_code, code, reply, retry_after)
        return reply


def wire_versions() -> dict[str, object]:
    """The version fields every agent request carries (A1)."""
    return {"protocol_version": PROTOCOL_VERSION, "agent_version": AGENT_VERSION}


class Backoff:
    """A4: bounded exponential backoff, 1 s → 16 s, with jitter."""

    def __init__(self, low: float = BACKOFF_MIN_SECONDS, high: float = BACKOFF_MAX_SECONDS) -> None:
        self.low, self.high = low, high
        self.attempt = 0
        self.held = False

    def next_delay(self) -> float:
        """The nominal delay for this failure, then doubled for the next (capped)."""
        delay = self.high if self.held else min(self.high, self.low * 2 ** min(self.attempt, 16))
        self.attempt = min(self.attempt + 1, 99)  # bounded: hours of outage must not overflow
        return delay

    def hold_at_max(self) -> None:
        """Wait the longest delay until the next success: retrying sooner would be refused again."""
        self.held = True

    @staticmethod
    def jittered(delay: float) -> float:
        """Up to ±20 % jitter so many nodes do not retry in lock step."""
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        """After a success, start again from the bottom."""
        self.attempt = 0
        self.held = False

    def describe(self) -> str:
        """The range, as the A3 log line shows it."""
        return f"{self.low:g}s…{self.high:g}s"


# --------------------------------------------------------------------------- storage roots


@dataclass(frozen=True)
class StorageRoot:
    """A storage root as the control plane names it (J1): the agent sees only its container path."""

    id: str
    name: str
    container_path: str
    min_free_bytes: int

    @classmethod
    def from_wire(cls, value: object) -> StorageRoot | None:
        """A root from a heartbeat reply, or None when its fields are not what J1 says."""
        item = as_dict(value)
        fields_ = (item.get("id"), item.get("name"), item.get("container_path"))
        minimum = item.get("min_free_bytes")
        if not all(isinstance(text, str) and text for text in fields_):
            return None
        if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 0:
            return None
        return cls(*fields_, minimum)


def root_problem(container_path: str, artifact_dir: Path, *, create: bool = False) -> str | None:
    """Why the agent may not use this root, or None (J1): an absolute path, as written, at or below
    the artifact directory, reached from it one directory at a time without following a symlink
    (O_DIR_NOFOLLOW). With `create`, a missing root whose parent exists is made (mode 0755) when
    the parent lets the agent; a missing parent is not, so a typo never grows a tree. The reason
    starts with what the console shows: "outside the artifact directory", "is a symlink",
    "parent not writable", "parent missing", "not a directory"."""
    if not os.path.isabs(container_path):
        return f"not an absolute path: {container_path}"
    parts = container_path.strip("/").split("/")
    if any(part in ("", ".", "..") for part in parts) and container_path.strip("/"):
        return f"not a plain path (empty, . or .. parts are never resolved): {container_path}"
    base = os.path.abspath(artifact_dir)
    path = os.path.abspath(container_path)
    if os.path.commonpath([path, base]) != base:
        return f"outside the artifact directory {artifact_dir}: {container_path}"
    below = [part for part in os.path.relpath(path, base).split("/") if part != "."]
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the operator's own setting
    except OSError as error:
        return f"the artifact directory {artifact_dir} cannot be opened ({error.strerror})"
    try:
        for depth, part in enumerate(below):
            here = os.path.join(base, *below[: depth + 1])
            try:
                next_fd = os.open(part, O_DIR_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                parent = os.path.dirname(here)
                if depth < len(below) - 1:
                    return f"parent missing: {here} does not exist"
                if not create:
                    return f"missing: {here} does not exist"
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile (another beat, the operator); opened below like any
                except OSError as error:
                    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                        return f"parent not writable: the agent (uid {os.getuid()}) cannot create {part} in {parent}"
                    return f"cannot create {here} ({error.strerror})"
                else:
                    log.info("storage root %s did not exist; created it", here)
                try:
                    next_fd = os.open(part, O_DIR_NOFOLLOW, dir_fd=fd)
                except OSError as error:
                    return _walk_problem(error, here)
            except OSError as error:
                return _walk_problem(error, here)
            os.close(fd)
            fd = next_fd
        return None
    finally:
        os.close(fd)


def _walk_problem(error: OSError, here: str) -> str:
    """A directory on a root's path that could not be opened, in the words the console shows."""
    if error.errno == errno.ELOOP or os.path.islink(here):
        return f"is a symlink: {here} is never followed"
    if error.errno == errno.ENOTDIR:
        return f"not a directory: {here}"
    return f"{here} cannot be opened ({error.strerror})"


def writable_dir(path: str) -> bool:
    """Whether a file can really be created and removed in `path` (os.access alone can lie)."""
    if not os.access(path, os.W_OK | os.X_OK):
        return False
    name = os.path.join(path, f".modelforge-probe-{uuid.uuid4().hex}")
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        os.close(fd)
        os.unlink(name)
    except OSError:  # a root we cannot clean up after is not one to write to; never let this escape
        return False
    return True


# N4, R1: what the agent's health and `--preflight` both ask of each named data directory, in one
# place: a directory this agent can create files in. A bare-metal agent whose variables point at
# nothing (the /data/* defaults outside the image) hears it from both, in the same words.
def data_dir_problems(directories: dict[str, Path]) -> dict[str, str]:
    """Why each unusable data directory cannot be used (name -> reason); empty when all can."""
    problems = {}
    for name, path in directories.items():
        if not path.exists():
            problems[name] = f"{path} does not exist"
        elif not path.is_dir():
            problems[name] = f"{path} is not a directory"
        elif not writable_dir(str(path)):
            problems[name] = f"{path} is not writable by this agent (uid {os.getuid()})"
    return problems


def observe_root(root: StorageRoot, artifact_dir: Path, writable: bool | None = None) -> dict[str, object]:
    """What the agent sees of one root now (J1): a missing root is created when its parent lets the
    agent, and a root it cannot use carries `problem`, why (the console shows it on the root's row);
    one outside the artifact directory is never probed. `writable`, when given, is a recent probe's
    answer and no probe file is written."""
    facts: dict[str, object] = {
        "id": root.id,
        "exists": False,
        "writable": False,
        "free_bytes": None,
        "total_bytes": None,
        "observed_at": rfc3339_now(),
    }
    problem = root_problem(root.container_path, artifact_dir, create=True)
    if problem is not None:
        facts["problem"] = short_text(problem, ROOT_PROBLEM_MAX)
        return facts
    real = os.path.realpath(root.container_path)
    facts["exists"] = True
    facts["writable"] = writable_dir(real) if writable is None else writable
    try:
        stats = os.statvfs(real)
    except OSError:
        return facts
    facts["free_bytes"] = stats.f_bavail * stats.f_frsize
    facts["total_bytes"] = stats.f_blocks * stats.f_frsize
    return facts


def _notably_different(old: dict[str, object], new: dict[str, object]) -> bool:
    """A root appeared, vanished, changed state, its use was measured anew (J5: at most once a
    minute) and differs, or its free space moved by 1 % of its size."""
    if any(old.get(key) != new.get(key) for key in ("exists", "writable", "total_bytes", "usage", "problem")):
        return True
    before, after, total = old.get("free_bytes"), new.get("free_bytes"), new.get("total_bytes")
    if before is None or after is None or not total:
        return before != after
    return abs(after - before) >= NOTABLE_FREE_CHANGE * total


class StorageRoots:
    """The roots the control plane told this node about, and what the heartbeat reports of them (J1)."""

    def __init__(self, artifact_dir: Path) -> None:
        self.artifact_dir = artifact_dir
        self.etag: str | None = None
        self.roots: list[StorageRoot] = []
        self.reported: dict[str, dict[str, object]] | None = None
        self.reported_quarantine: dict[str, object] | None = None
        self.reported_at = 0.0
        # root id -> (writable, when probed): the write probe runs at most once a minute per root,
        # whether or not the heartbeat carrying it arrived; the cheap checks run on every beat.
        self.probes: dict[str, tuple[bool, float]] = {}

    def take_reply(self, reply: dict[str, object]) -> None:
        """Keep the root list a heartbeat reply carries (sent only when our etag was out of date)."""
        etag, roots = reply.get("storage_roots_etag"), reply.get("storage_roots")
        if not isinstance(etag, str) or not isinstance(roots, list):
            return
        parsed = [StorageRoot.from_wire(item) for item in roots]
        kept = [root for root in parsed if root is not None]
        if len(kept) != len(parsed):
            log.warning(
                "%d storage root(s) in the heartbeat reply lacked id, name or path; ignored", len(parsed) - len(kept)
            )
        if etag == self.etag and kept == self.roots:
            return
        log.info("storage roots: %s", ", ".join(f"{r.name} at {r.container_path}" for r in kept) or "none")
        self.etag, self.roots = etag, kept
        self.reported = None  # a new list: observations go out with the next heartbeat
        self.probes = {}  # and each root is probed afresh (its path may have changed)

    def heartbeat_fields(
        self,
        now: float,
        usage: dict[str, dict[str, object]] | None = None,
        quarantine: dict[str, object] | None = None,
    ) -> dict[str, object]:
        """The etag we hold, and fresh observations when they are due (changed, or a minute old).
        J5: the last measurement adds each root's `usage` (by root id) and the node's
        `quarantine_usage`; what was not measured is left out, never sent as 0."""
        if self.etag is None:
            return {}
        fields_: dict[str, object] = {"storage_roots_etag": self.etag}
        observed = {root.id: self.observe(root, now) for root in self.roots}
        for root_id, facts in observed.items():
            if facts["exists"] and (usage or {}).get(root_id) is not None:
                facts["usage"] = usage[root_id]
        due = (
            self.reported is None
            or now - self.reported_at >= STORAGE_REPORT_SECONDS
            or observed.keys() != self.reported.keys()
            or any(_notably_different(self.reported[key], value) for key, value in observed.items())
            or quarantine != self.reported_quarantine
        )
        if due:
            fields_["storage_roots"] = list(observed.values())
            if quarantine is not None:
                fields_["quarantine_usage"] = quarantine
        return fields_

    def observe(self, root: StorageRoot, now: float) -> dict[str, object]:
        """One root's facts for this beat: realpath and statvfs every time, but the write probe (a
        file created and deleted in the root) only when none was made in the last minute or the
        root has just (re)appeared; otherwise the last probe's answer stands."""
        probe = self.probes.get(root.id)
        fresh = probe is not None and 0 <= now - probe[1] < STORAGE_REPORT_SECONDS
        facts = observe_root(root, self.artifact_dir, probe[0] if fresh else None)
        if not facts["exists"]:
            self.probes.pop(root.id, None)  # probe again as soon as it is back
        elif not fresh:
            self.probes[root.id] = (bool(facts["writable"]), now)
        return facts

    def delivered(self, fields_: dict[str, object], now: float) -> None:
        """The heartbeat carrying `fields_` arrived: its observations are the ones the server has."""
        if "storage_roots" in fields_:
            self.reported = {facts["id"]: facts for facts in fields_["storage_roots"]}
            self.reported_quarantine = fields_.get("quarantine_usage")
            self.reported_at = now


# --------------------------------------------------------------------------- runtime worker

# W1: who the runtime worker is, asked at every inventory check for the inventory and for what
# is advertised; relaying a job to it is modelforge_agent_runtime's part.

ERROR_CODE_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,63}")  # an error code as the worker may send one


class WorkerError(Exception):
    """The runtime worker did not answer as its protocol says (W1). `reason` is one line for the
    log, the inventory's runtime_worker_problem and a job's error: no socket, refused, timed out,
    not JSON, or `HTTP 409 WORKER_BUSY on POST /v1/jobs`. An HTTP error answer also gives its
    `status`, `code`, `message` and `retryable`."""

    def __init__(
        self,
        reason: str,
        *,
        timed_out: bool = False,
        status: int | None = None,
        code: str | None = None,
        message: str = "",
        retryable: bool = False,
        reply: dict[str, object] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason, self.timed_out = reason, timed_out
        self.status, self.code, self.message, self.retryable = status, code, message, retryable
        self.reply: dict[str, object] = reply if reply is not None else {}


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix stream socket, with a short connect and a longer read timeout."""

    def __init__(self, path: str, connect_timeout: float, read_timeout: float) -> None:
        super().__init__("localhost", timeout=read_timeout)
        self.socket_path, self.connect_timeout = path, connect_timeout

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connect_timeout)
            sock.connect(self.socket_path)
            sock.settimeout(self.timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class WorkerClient:
    """The agent's side of the runtime worker's socket protocol v1 (worker/README.md): one short
    connection per request, JSON both ways, a bounded reply. The core asks info(); the runtime
    relay (modelforge_agent_runtime) submits, polls and cancels a job."""

    def __init__(
        self,
        socket_path: str,
        connect_timeout: float = WORKER_CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = WORKER_READ_TIMEOUT_SECONDS,
    ) -> None:
        self.socket_path, self.connect_timeout, self.read_timeout = socket_path, connect_timeout, read_timeout

    def request(self, method: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
        """One request; the reply's JSON object, or WorkerError saying in one line what went wrong."""
        where = f"{method} {path}"
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        connection = UnixHTTPConnection(self.socket_path, self.connect_timeout, self.read_timeout)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read(WORKER_REPLY_MAX_BYTES + 1)
        except FileNotFoundError:
            raise WorkerError(f"no socket at {self.socket_path}") from None
        except ConnectionRefusedError:
            raise WorkerError(f"connection refused at {self.socket_path}") from None
        except TimeoutError:
            raise WorkerError(f"timed out on {where} at {self.socket_path}", timed_out=True) from None
        except http.client.HTTPException as error:
            raise WorkerError(f"no HTTP answer to {where} ({type(error).__name__})") from None
        except OSError as error:
            raise WorkerError(f"{error.strerror or type(error).__name__} at {self.socket_path}") from None
        finally:
            connection.close()
        if len(raw) > WORKER_REPLY_MAX_BYTES:
            raise WorkerError(f"reply to {where} is larger than {WORKER_REPLY_MAX_BYTES} bytes")
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        if response.status >= 400:
            error = as_dict(as_dict(reply).get("error"))
            code = error.get("code") if isinstance(error.get("code"), str) else None
            code = code if code and ERROR_CODE_PATTERN.fullmatch(code) else None
            raise WorkerError(
                f"HTTP {response.status} {code or 'ERROR'} on {where}",
                status=response.status,
                code=code,
                message=short_text(error.get("message"), 1000) or "",
                retryable=error.get("retryable") is True,
                reply=as_dict(reply),
            )
        if not isinstance(reply, dict):
            raise WorkerError(f"not JSON on {where}" if reply is None else f"not a JSON object on {where}")
        return reply

    def info(self) -> dict[str, object]:
        """GET /v1/info: who the worker is, and the job it holds."""
        return self.request("GET", "/v1/info")

    def submit(self, job_id: str, job_type: str, params: dict[str, object]) -> dict[str, object]:
        """POST /v1/jobs: the job's status (the same id again answers its status)."""
        return self.request("POST", "/v1/jobs", {"id": job_id, "type": job_type, "params": params})

    def status(self, job_id: str) -> dict[str, object]:
        """GET /v1/jobs/{id}."""
        return self.request("GET", f"/v1/jobs/{quote(job_id, safe='')}")

    def cancel(self, job_id: str) -> dict[str, object]:
        """POST /v1/jobs/{id}/cancel: the job stops within a second and the model is freed."""
        return self.request("POST", f"/v1/jobs/{quote(job_id, safe='')}/cancel", {})


def worker_facts(info: dict[str, object]) -> dict[str, object]:
    """The inventory's `runtime_worker` from a GET /v1/info answer: the protocol version as the
    worker sent it (A1: a non-integer goes as a short string, which the control plane answers
    UNKNOWN), the rest cut to what the control plane stores; an engine without a name or a device
    without a UUID is left out, so one odd entry never gets the whole inventory refused. An answer
    without a worker_version is no worker's: WorkerError."""
    version = label(info.get("worker_version"), 64)
    if version is None:
        raise WorkerError("GET /v1/info answered without a worker_version")
    protocol = info.get("protocol_version")
    if whole_number(protocol) is None:
        protocol = label(protocol, 32) or label(json.dumps(protocol), 32)
    engines = [item for item in info.get("engines") or [] if isinstance(item, dict) and label(item.get("name"), 64)]
    devices = [item for item in info.get("devices") or [] if isinstance(item, dict) and label(item.get("uuid"), 96)]
    return {
        "worker_version": version,
        "protocol_version": protocol,
        "engines": [
            {
                "name": label(engine.get("name"), 64),
                "version": label(engine.get("version"), 64),
                "backend": label(engine.get("backend"), 32),
            }
            for engine in engines[:8]
        ],
        "devices": [
            {
                "uuid": label(device.get("uuid"), 96),
                "name": label(device.get("name"), 200),
                "memory_total_bytes": whole_number(device.get("memory_total_bytes")),
            }
            for device in devices[:MAX_WORKER_DEVICES]
        ],
    }


def describe_engines(facts: dict[str, object]) -> str:
    """`llama.cpp 0.3.16 (cpu)` for log lines."""
    engines = [f"{e['name']} {e['version']} ({e['backend']})" for e in facts["engines"]]
    return ", ".join(engines) or "no engine"


class RuntimeWorkerWatch:
    """What the agent knows of its runtime worker (W1), from its last answer to GET /v1/info:
    the inventory's runtime_worker and runtime_worker_problem, and whether runtime jobs are
    advertised. Each change is logged once."""

    def __init__(self, client: WorkerClient) -> None:
        self.client = client
        self.facts: dict[str, object] | None = None
        self.problem: str | None = "not asked yet"
        self.compatible = False
        self.serves = False  # S2: a compatible worker whose /v1/info offers deployments
        self.said: tuple[object, ...] | None = None

    def inventory_fields(self) -> dict[str, object]:
        """`runtime_worker` (null unless one answers) and `runtime_worker_problem` (null while a
        compatible one answers, else one line: why not)."""
        return {"runtime_worker": self.facts, "runtime_worker_problem": self.problem}

    def probe(self) -> bool:
        """Ask the worker who it is; True when what the inventory says of it changed."""
        before = (self.compatible, self.serves, self.inventory_fields())
        try:
            info = self.client.info()
            facts = worker_facts(info)
        except WorkerError as error:
            self.forget(error.reason)
        else:
            self.take(facts)
            self.serves = self.compatible and isinstance(info.get("serving"), dict)
        return (self.compatible, self.serves, self.inventory_fields()) != before

    def take(self, facts: dict[str, object]) -> None:
        """A worker answered: compatible when it speaks a protocol version this agent speaks."""
        protocol = facts["protocol_version"]
        self.facts, self.compatible = facts, protocol in WORKER_PROTOCOLS and isinstance(protocol, int)
        if self.compatible:
            self.problem = None
            self.say(
                ("compatible", facts["worker_version"], protocol, describe_engines(facts)),
                logging.INFO,
                "runtime worker %s (protocol %s, %s) answers at %s; runtime jobs are advertised",
                facts["worker_version"],
                protocol,
                describe_engines(facts),
                self.client.socket_path,
            )
            return
        speaks = ", ".join(str(version) for version in WORKER_PROTOCOLS)
        self.problem = f"the worker speaks protocol {protocol}; this agent speaks {speaks}"
        self.say(
            ("incompatible", facts["worker_version"], protocol),
            logging.WARNING,
            "runtime worker %s at %s is incompatible: %s; runtime jobs are not advertised",
            facts["worker_version"],
            self.client.socket_path,
            self.problem,
        )

    def forget(self, reason: str) -> None:
        """No worker answers (or a job found it gone): runtime jobs are not advertised until one does."""
        self.facts, self.compatible, self.serves, self.problem = None, False, False, reason[:500]
        # Said once when it goes (or at start-up), not again for each new way of not answering.
        if self.said is None:
            self.say(("absent",), logging.INFO, "no runtime worker: %s; runtime jobs are not advertised", reason)
        else:
            self.say(("absent",), logging.WARNING, "runtime worker gone: %s; runtime jobs are not advertised", reason)

    def say(self, key: tuple[object, ...], level: int, message: str, *args: object) -> None:
        """Log a state once, when it differs from the last one logged (A3: no line every heartbeat)."""
        if key != self.said:
            self.said = key
            log.log(level, message, *args)


# --------------------------------------------------------------------------- jobs

# A job id names a directory (<root>/.partial/<job_id>/) and a URL segment: letters, digits, - and _.
JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


class JobFailure(Exception):
    """A job that cannot finish: its error code, a message without any secret, and whether a
    later attempt may succeed (J2: network, Hub 5xx, stall, a corrupt byte) or not (the rest)."""

    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.retryable = code, message, retryable

    def to_wire(self) -> dict[str, str]:
        """The `error` of a fail report."""
        return {"code": self.code, "message": self.message[:1000]}


class JobAbandoned(Exception):
    """Stop the job and report nothing: its lease is lost or the agent is stopping; partial files stay."""


class LeaseLost(Exception):
    """409 JOB_LEASE_LOST: this attempt no longer owns the job (J2 fencing)."""

    def __init__(self, error: PublishError) -> None:
        super().__init__(error.describe())
        self.error = error


class JobControl:
    """How a running job is told to stop, checked between chunks: cancelled (clean up, report
    JOB_CANCELLED) or abandoned (lease lost, agent stopping: keep the partial files, report nothing)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.abandoned = threading.Event()
        self.stopped = threading.Event()  # either of the two
        self.reason = ""

    def cancel(self) -> None:
        """An operator cancelled the job."""
        self.cancelled.set()
        self.stopped.set()

    def abandon(self, reason: str) -> None:
        """Stop without a report."""
        self.reason = reason
        self.abandoned.set()
        self.stopped.set()

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking at once when the job is told to stop."""
        self.stopped.wait(seconds)

    def check(self) -> None:
        """Raise if the job must stop now."""
        if self.abandoned.is_set():
            raise JobAbandoned(self.reason)
        if self.cancelled.is_set():
            raise JobFailure(JOB_CANCELLED, "cancelled by an operator", retryable=False)


@dataclass(frozen=True)
class Progress:
    """How far a job is (J4 shows it as bytes and files; a runtime job as its phase and steps)."""

    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    phase: str | None = None
    steps_done: int | None = None
    steps_total: int | None = None

    def to_wire(self) -> dict[str, object]:
        """The `progress` of a progress report: the four counts, and the runtime fields only when
        set (an acquire sends exactly the four)."""
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class Job:
    """A claimed job (J2): the attempt number is the fencing token every report carries."""

    id: str
    type: str
    attempt: int
    params: dict[str, object]
    max_attempts: int | None = None
    progress_interval: float = PROGRESS_INTERVAL_SECONDS
    lease_seconds: float | None = None

    @classmethod
    def from_claim(cls, value: object) -> Job | None:
        """The job of a claim reply, or None when it lacks what any report on it needs."""
        item = as_dict(value)
        job_id, attempt = item.get("id"), item.get("attempt")
        if isinstance(job_id, int) and not isinstance(job_id, bool):
            job_id = str(job_id)
        if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
            return None
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            return None

        def number(name: str, low: float, high: float) -> float | None:
            raw = item.get(name)
            ok = isinstance(raw, int | float) and not isinstance(raw, bool) and low <= raw <= high
            return float(raw) if ok else None

        max_attempts = item.get("max_attempts")
        return cls(
            id=job_id,
            type=item.get("type") if isinstance(item.get("type"), str) else "",
            attempt=attempt,
            params=as_dict(item.get("params")),
            max_attempts=max_attempts if isinstance(max_attempts, int) and not isinstance(max_attempts, bool) else None,
            progress_interval=number("progress_interval_seconds", 0.05, 3600) or PROGRESS_INTERVAL_SECONDS,
            lease_seconds=number("lease_seconds", 1, 86400),
        )

    def describe(self) -> str:
        """`job <id> (<type>, attempt <n>)` for log lines."""
        return f"job {self.id} ({self.type or 'no type'}, attempt {self.attempt})"


class JobsClient:
    """The agent's side of the job endpoints (J2); a 409 JOB_LEASE_LOST is raised as LeaseLost."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def _post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        try:
            return self.client.post(path, {**wire_versions(), **body})
        except PublishError as error:
            if error.status == 409 and error.code == JOB_LEASE_LOST:
                raise LeaseLost(error) from None
            raise

    def claim(self, capabilities: list[str]) -> dict[str, object]:
        """POST …/jobs/claim: the reply's `job`, or an empty reply (204) when none is waiting."""
        return self._post("/api/v1/agent/jobs/claim", {"capabilities": capabilities})

    def progress(self, job: Job, progress: Progress) -> dict[str, object]:
        """POST …/progress: renews the lease; the reply says whether an operator cancelled."""
        return self._post(
            f"/api/v1/agent/jobs/{job.id}/progress", {"attempt": job.attempt, "progress": progress.to_wire()}
        )

    def complete(self, job: Job, result: dict[str, object]) -> None:
        """POST …/complete with the job's result."""
        self._post(f"/api/v1/agent/jobs/{job.id}/complete", {"attempt": job.attempt, "result": result})

    def fail(self, job: Job, failure: JobFailure) -> None:
        """POST …/fail with the error and whether a retry may help."""
        body = {"attempt": job.attempt, "error": failure.to_wire(), "retryable": failure.retryable}
        self._post(f"/api/v1/agent/jobs/{job.id}/fail", body)


# --------------------------------------------------------------------------- safe paths

# What the job families share to reach files below a base they trust: a path from outside is
# checked before use, and every directory on the way is opened without following a symlink
# (O_DIR_NOFOLLOW, with the constants: storage roots are walked the same way).


def is_safe_relative_path(path: str) -> bool:
    """Relative, no '.', '..' or empty segment, no backslash, NUL or control character, and every
    segment a name a filesystem can hold: a path that can only mean one file below its base."""
    parts = path.split("/")
    return not (
        not path
        or path.startswith("/")
        or "\\" in path
        or not path.isprintable()
        or any(part in ("", ".", "..") for part in parts)
        or any(len(part.encode()) > 255 for part in parts)
    )


def open_dir_chain(base_fd: int, parts: list[str], *, create: bool) -> int:
    """Open (creating if asked) each directory below `base_fd` without following a symlink; the
    caller closes the returned descriptor. A symlink or a file in the way is ARTIFACT_PATH_UNSAFE."""
    fd = os.dup(base_fd)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                next_fd = os.open(part, O_DIR_NOFOLLOW, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise JobFailure(
                        ARTIFACT_PATH_UNSAFE,
                        f"{ascii(part)[:300]} is a symlink or a file where a directory belongs; it is never followed",
                        retryable=False,
                    ) from None
                raise
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_json_at(dir_fd: int, name: str) -> dict[str, object] | None:
    """A JSON object from `name` in `dir_fd` (never through a symlink), or None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            value = json.loads(handle.read(16 << 20))
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


# --------------------------------------------------------------------------- job registry and runner

JobHandler = Callable[[Job, Config, JobControl, Callable[[Progress], None]], dict[str, object]]


@dataclass(frozen=True)
class JobFamily:
    """Where a job type is run (J2): the module beside this file that runs it, the libraries that
    module imports, and whether it needs a compatible runtime worker (W1)."""

    module: str
    libraries: tuple[str, ...] = ()
    needs_worker: bool = False


# Job type → its family. What the agent advertises is read from here without importing anything;
# a family's module is imported when a job of its type is first claimed, and registers itself.
JOB_FAMILIES: dict[str, JobFamily] = {
    ACQUIRE_JOB_TYPE: JobFamily("modelforge_agent_acquire", libraries=("huggingface_hub",)),
    DELETE_JOB_TYPE: JobFamily("modelforge_agent_artifacts"),
    RUNTIME_BENCHMARK_JOB_TYPE: JobFamily("modelforge_agent_runtime", needs_worker=True),
    RUNTIME_GENERATE_JOB_TYPE: JobFamily("modelforge_agent_runtime", needs_worker=True),
}
# Job type → the function that runs it, and how the log line of its success sums its result up;
# filled by register_job_type() as each family's module is imported.
JOB_HANDLERS: dict[str, JobHandler] = {}
JOB_SUMMARIES: dict[str, Callable[[dict[str, object]], str]] = {}


def register_job_type(job_type: str, handler: JobHandler, summary: Callable[[dict[str, object]], str]) -> None:
    """A family's module, as it is imported: the handler of one of its job types, and its summary."""
    if job_type not in JOB_FAMILIES:
        raise ValueError(f"{job_type!r} is not in JOB_FAMILIES: it would never be advertised")
    JOB_HANDLERS[job_type] = handler
    JOB_SUMMARIES[job_type] = summary


def job_handler(job_type: str) -> JobHandler | None:
    """The handler of a job type, its family's module imported on first use; None for a type this
    agent does not run."""
    family = JOB_FAMILIES.get(job_type)
    if family is not None and job_type not in JOB_HANDLERS:
        importlib.import_module(family.module)
    return JOB_HANDLERS.get(job_type)


def advertised_capabilities(worker_compatible: bool = False, worker_serves: bool = False) -> list[str]:
    """The job types this agent can run (J2): those whose module and libraries are installed, and
    the ones that need the runtime worker only while a compatible one answers (W1); and
    runtime.serve.v1 while that worker serves deployments (S2). They are only looked for here, not
    imported, so an idle agent stays small."""
    job_types = [
        job_type
        for job_type, family in JOB_FAMILIES.items()
        if all(importlib.util.find_spec(name) is not None for name in (family.module, *family.libraries))
        and (worker_compatible or not family.needs_worker)
    ]
    serving = worker_compatible and worker_serves and RUNTIME_GENERATE_JOB_TYPE in job_types
    return [*job_types, RUNTIME_SERVE_CAPABILITY] if serving else job_types


def result_summary(job_type: str, result: dict[str, object]) -> str:
    """A few words on a job's result for its success log line (never the whole result)."""
    summary = JOB_SUMMARIES.get(job_type)
    return summary(result) if summary is not None else "result with " + ", ".join(sorted(result)[:8])


class JobRunner:
    """One claimed job in a worker thread, so heartbeats go on (J2): progress every interval,
    then exactly one complete or fail report, or none when the lease was lost."""

    def __init__(self, job: Job, client: JobsClient, config: Config, shutdown: threading.Event) -> None:
        self.job, self.client, self.config, self.shutdown = job, client, config, shutdown
        self.control = JobControl()
        self.finished = threading.Event()
        self._progress = Progress()
        self._lock = threading.Lock()
        self.failure: JobFailure | None = None  # how the attempt failed, once it has
        self.retry_after = 0.0  # a 429's Retry-After, waited before the next report when longer than the interval
        self.thread = threading.Thread(target=self.run, name=f"job-{job.id}", daemon=True)

    def start(self) -> JobRunner:
        """Run the job in its own thread."""
        self.thread.start()
        return self

    def alive(self) -> bool:
        """Whether the job is still running."""
        return self.thread.is_alive()

    def on_progress(self, progress: Progress) -> None:
        """Called by the job as it goes; the reporter thread sends the latest on its interval."""
        with self._lock:
            self._progress = progress

    def latest_progress(self) -> Progress:
        """The last progress the job gave."""
        with self._lock:
            return self._progress

    def run(self) -> None:
        """Run the handler while a reporter thread sends progress, then report the outcome."""
        job = self.job
        log.info("%s claimed", job.describe())
        reporter = threading.Thread(target=self.report_progress_loop, name=f"job-{job.id}-progress", daemon=True)
        reporter.start()
        result: dict[str, object] | None = None
        failure: JobFailure | None = None
        try:
            result = self.execute()
        except JobAbandoned as abandoned:
            log.info("%s stopped (%s); its partial files are kept for the next attempt", job.describe(), abandoned)
        except JobFailure as error:
            failure = error
        except Exception as error:  # the worker thread must always end the job's story with a report
            log.exception("%s: unexpected %s", job.describe(), type(error).__name__)
            failure = JobFailure("AGENT_INTERNAL_ERROR", f"the agent hit {type(error).__name__}", retryable=True)
        finally:
            self.finished.set()
            reporter.join()
        if failure is not None:
            self.failure = failure
            log.warning(
                "%s failed: %s %s (%s)",
                job.describe(),
                failure.code,
                failure.message,
                "retryable" if failure.retryable else "not retryable",
            )
            self.deliver("fail", lambda: self.client.fail(job, failure))
        elif result is not None and self.send_progress(final=True):
            log.info("%s succeeded: %s", job.describe(), result_summary(job.type, result))
            self.deliver("complete", lambda: self.client.complete(job, result))

    def execute(self) -> dict[str, object]:
        """Dispatch to the handler for the job's type (in this worker thread, so the first job of a
        family imports its module here, while heartbeats go on)."""
        handler = job_handler(self.job.type)
        if handler is None:
            raise JobFailure(JOB_TYPE_UNSUPPORTED, f"this agent does not run {self.job.type} jobs", retryable=False)
        return handler(self.job, self.config, self.control, self.on_progress)

    def report_progress_loop(self) -> None:
        """Every progress interval until the job ends: report, and stop the job if told to."""
        while not self.finished.wait(max(self.job.progress_interval, self.retry_after)):
            self.retry_after = 0.0
            if self.shutdown.is_set():
                self.control.abandon("the agent is stopping")
                return
            if not self.send_progress():
                return  # the lease is lost: no report of this attempt is ever sent again

    def send_progress(self, final: bool = False) -> bool:
        """One progress report; False once the lease is lost. An unreachable control plane is
        only logged: the job goes on and the next interval tries again (the lease may lapse).

        A 429 (issue 22: the control plane bounds progress per node at half the interval it named)
        is not a failure either: the next report waits Retry-After if that is longer than the
        interval, and the final report before `complete`, which may come moments after the last
        one, waits it once and is sent again.
        """
        try:
            reply = self.client.progress(self.job, self.latest_progress())
        except LeaseLost as lost:
            log.warning("%s: %s; this attempt stops and reports nothing more", self.job.describe(), lost)
            self.control.abandon("lease lost")
            return False
        except PublishError as error:
            if error.status == 429:
                delay = min(error.retry_after or self.job.progress_interval, self.job.progress_interval)
                if final:
                    log.info("%s (retry after %gs); the final progress report waits", error.describe(), delay)
                    return self.shutdown.wait(delay) or self.send_progress()
                self.retry_after = delay
                log.info("%s (retry after %gs); the job goes on", error.describe(), delay)
                return True
            log.warning("%s; the job goes on, next report in %gs", error.describe(), self.job.progress_interval)
            return True
        if reply.get("cancel_requested") is True and not self.control.cancelled.is_set():
            log.info("%s: cancel requested", self.job.describe())
            self.control.cancel()
        return True

    def deliver(self, what: str, send: Callable[[], None]) -> None:
        """Send the final report, retrying an unreachable control plane with backoff for a while;
        a 409 lease lost or another refusal is never retried."""
        backoff = Backoff()
        deadline = time.monotonic() + FINAL_REPORT_PATIENCE_SECONDS
        while True:
            try:
                send()
                return
            except LeaseLost as lost:
                log.warning("%s: %s; the %s report is dropped", self.job.describe(), lost, what)
                return
            except PublishError as error:
                if error.status is not None and error.status < 500:
                    log.error(
                        "%s: %s; the %s report was refused. %s",
                        self.job.describe(),
                        error.describe(),
                        what,
                        error.server_says(),
                    )
                    return
                delay = backoff.next_delay()
                if time.monotonic() + delay > deadline:
                    log.error("%s: %s; giving up on the %s report", self.job.describe(), error.describe(), what)
                    return
                log.warning("%s (backoff %s); next try in %gs", error.describe(), backoff.describe(), delay)
                if self.shutdown.wait(backoff.jittered(delay)):
                    return


# --------------------------------------------------------------------------- publishing loop


class Exit(Exception):
    """Stop the agent with an exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Agent:
    """Enrol once, then publish inventory and heartbeats, and run the jobs it claims, until stopped."""

    def __init__(self, config: Config, nvml: Nvml, preflight: Preflight, stop: threading.Event) -> None:
        self.config = config
        self.nvml = nvml
        self.preflight = preflight
        self.stop = stop
        self.state = State(config.state_dir)
        self.client = Client(config)
        self.interval = 15.0
        self.backoff = Backoff()
        self.gpus = preflight.gpus
        self.inventory_digest: str | None = None
        self.inventory_sent_at = 0.0
        self.inventory_checked_at: float | None = None  # None: check at the next chance
        self.said_once: set[str] = set()
        self.storage_problems: dict[str, str] = {}
        self.unnamed_gpus: list[int] = []
        self.worker = RuntimeWorkerWatch(WorkerClient(config.worker_socket))
        self.nvidia_smi = NvidiaSmi()
        self.capabilities = advertised_capabilities(self.worker.compatible, self.worker.serves)
        self.storage_roots = StorageRoots(config.data_dirs["artifacts"])
        self.deployments = None  # S2: modelforge_agent_runtime.Deployments, once a reply carries the list
        self.relay = None  # S5: modelforge_agent_relay.Relay, once the worker serves deployments
        self.jobs = JobsClient(self.client)
        self.jobs_waiting = 0
        self.claim_due = True  # J2: one claim right after start-up, in case a job waits already
        self.runner: JobRunner | None = None
        self.heartbeat_sent_at: float | None = None  # monotonic; the schedule's reference point (issue 22)
        self.quarantine_pruned_at: float | None = None  # monotonic; J5: when old evidence was last looked for
        # J5: the last measurement of each root's use (modelforge_agent_artifacts.StorageUse), when
        # it was made (monotonic) and for which root list; due again after a minute or a job's end.
        self.storage_use = None
        self.storage_use_measured_at: float | None = None
        self.storage_use_etag: str | None = None
        self.storage_use_due = True

    def versions(self) -> dict[str, object]:
        """The version fields every request carries (A1)."""
        return wire_versions()

    def enroll(self, node_id: str) -> None:
        """Claim the token once, or exit 4 naming the reason (E2, E3, I2); no token is a ConfigError.

        A timeout, a dropped connection or a 5xx is retried with the A4 backoff, with the same
        body: the same node ID and token. If the control plane committed a claim whose reply was
        lost, it answers that retry with a fresh credential (the lost one was never used, so it
        revokes it); once the token expires the retry is refused and the agent exits 4.
        """
        token = self.config.enrollment_token
        if not token:
            raise ConfigError(
                f"no stored credential in {self.state.credential_path} and no MODELFORGE_AGENT_ENROLLMENT_TOKEN; "
                "mint a token in Console → Hardware → Enroll node"
            )
        body = {
            "enrollment_token": token,
            "node_id": node_id,
            "hostname": self.config.hostname,
            "control_plane_url": self.config.control_plane_url,
            **self.versions(),
        }
        if self.config.display_name:
            body["display_name"] = self.config.display_name
        while True:
            try:
                reply = self.client.post("/api/v1/agent/enroll", body)
                break
            except PublishError as error:
                # A 4xx is a refusal (also after a retry); no status at all means no reply came.
                if error.status is not None and error.status < 500:
                    details = as_dict(error.reply.get("error"))
                    message, next_step = str(details.get("message", "")), str(details.get("next_step", ""))
                    log.error("%s: enrolment refused. %s %s", error.describe(), message, next_step)
                    raise Exit(EXIT_ENROLLMENT_REFUSED) from None
                self.wait_after(error)
        credential = reply.get("credential")
        if not isinstance(credential, str) or not credential:
            log.error("the control plane's enrolment reply carried no credential")
            raise Exit(EXIT_ENROLLMENT_REFUSED)
        # The token is spent: a SIGTERM now must not lose the only copy of the credential.
        signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            self.state.store_credential(credential)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        self.client.credential = credential
        self.take_interval(reply)
        log.info("enrolled as node %s; credential stored in %s (mode 0600)", node_id, self.state.credential_path)

    def take_interval(self, reply: dict[str, object]) -> None:
        """Follow the heartbeat interval the server names in each reply."""
        interval = reply.get("heartbeat_interval_seconds")
        if isinstance(interval, int | float) and not isinstance(interval, bool) and 1 <= interval <= 3600:
            self.interval = float(interval)

    def wait_after(self, error: PublishError) -> None:
        """Log the A3 line and sleep the backoff (interruptible by SIGTERM)."""
        delay = self.backoff.next_delay()
        log.warning("%s (backoff %s); next try in %gs", error.describe(), self.backoff.describe(), delay)
        if self.stop.wait(self.backoff.jittered(delay)):
            raise Exit(EXIT_OK)

    def handle_refusal(self, error: PublishError) -> None:
        """Decide what a 4xx from a publication means (A1, I5, I6)."""
        if error.status == 429:
            self.wait_retry_after(error)
            return
        if error.status == 401:
            log.error("%s: the node credential is no longer accepted; re-enrol with a new token", error.describe())
            raise Exit(EXIT_CREDENTIAL_REVOKED)
        if error.status == 403 and error.code == "NODE_DISABLED":
            if "disabled" not in self.said_once:
                self.said_once.add("disabled")
                log.warning(
                    "%s: an operator disabled this node; checking every %gs",
                    error.describe(),
                    self.backoff.high,
                )
            self.backoff.hold_at_max()
        elif error.status == 426:
            if "incompatible" not in self.said_once:
                self.said_once.add("incompatible")
                compat = as_dict(error.reply.get("compatibility"))
                log.error(
                    "%s: compatibility %s. %s",
                    error.describe(),
                    compat.get("answer", "UNKNOWN"),
                    compat.get("action", "Upgrade the agent or the control plane."),
                )
            self.backoff.hold_at_max()
        elif f"refused-{error.status}-{error.code}" not in self.said_once:
            # Issue 22: what the control plane says about the refusal (a 400's field and rule, its
            # "check the node's clock"), once per kind of refusal until a publication is accepted.
            self.said_once.add(f"refused-{error.status}-{error.code}")
            log.warning("%s: the control plane says: %s", error.describe(), error.server_says() or "nothing more")
        self.wait_after(error)

    def wait_retry_after(self, error: PublishError) -> None:
        """A2: published sooner than the control plane's per-node rate allows. Nothing is wrong
        with the node or its credential: wait what Retry-After says (the backoff when it says
        nothing usable) before the next publication, saying so once until one is accepted."""
        delay = error.retry_after if error.retry_after is not None else self.backoff.next_delay()
        if "rate-limited" not in self.said_once:
            self.said_once.add("rate-limited")
            log.warning("%s (retry after %gs)", error.describe(), delay)
        if self.stop.wait(delay):
            raise Exit(EXIT_OK)

    def health(self, telemetry_errors: dict[str, dict[str, str]]) -> dict[str, str]:
        """ok; degraded (some readings failed, a data directory is unusable); failing (no GPU readable)."""
        problems = [
            f"{uuid_}: " + ", ".join(f"{metric} {name}" for metric, name in errors.items())
            for uuid_, errors in sorted(telemetry_errors.items())
        ]
        problems += [f"{name} directory: {reason}" for name, reason in sorted(self.storage_problems.items())]
        problems += [f"GPU {index}: no readable UUID, left out" for index in self.unnamed_gpus]
        if not problems:
            gpus = f"{len(self.gpus)} GPU(s)" if self.gpus else "CPU-only"
            return {"status": "ok", "detail": f"{gpus}; all readings succeeded"}
        all_lost = (
            bool(self.gpus)
            and len(telemetry_errors) == len(self.gpus)
            and all(
                all(metric in errors or "handle" in errors for metric in REQUIRED_METRICS)
                for errors in telemetry_errors.values()
            )
        )
        return {"status": "failing" if all_lost else "degraded", "detail": "; ".join(problems)[:1000]}

    def telemetry(self) -> tuple[list[dict[str, object]], dict[str, dict[str, str]]]:
        """Fresh NVML readings for every known GPU (never cached, never invented)."""
        samples, failures = [], {}
        for gpu in self.gpus:
            sample, errors = self.nvml.sample(gpu.index, str(gpu.uuid))
            samples.append(sample)
            # A sensor the GPU does not have (NotSupported) is a fact, not a fault: it is sent as
            # null and does not degrade health. Any other failed reading does.
            errors = {metric: name for metric, name in errors.items() if name != "NVMLError_NotSupported"}
            if errors:
                failures[str(gpu.uuid)] = errors
        return samples, failures

    def maybe_publish_inventory(self, now: float) -> None:
        """Inventory at start, whenever it changes (checked each minute), and at least hourly."""
        if self.inventory_checked_at is not None and now - self.inventory_checked_at < INVENTORY_CHECK_SECONDS:
            return
        self.inventory_checked_at = now
        if self.preflight.nvidia_required:
            pynvml = self.nvml.module()
            try:
                self.gpus = self.nvml.gpus()
            except pynvml.NVMLError as error:
                log.warning("could not re-read GPUs (%s); keeping the last inventory", type(error).__name__)
        self.unnamed_gpus = [gpu.index for gpu in self.gpus if gpu.uuid is None]
        self.gpus = [gpu for gpu in self.gpus if gpu.uuid is not None]
        inventory = collect_inventory(self.config, self.gpus)
        inventory["nvidia_smi"] = self.nvidia_smi.facts(self.gpus)  # V1: compared with NVML's by the control plane
        self.storage_problems = data_dir_problems(self.config.data_dirs)
        for name, facts in inventory["storage"].items():
            if name in self.storage_problems:
                facts["problem"] = self.storage_problems[name]  # R1: the readiness hint names the fix
        # The digest covers the capabilities and the runtime worker too (W1): a worker that comes
        # or goes is news for the control plane even when the machine is unchanged.
        fields_ = {"inventory": inventory, "capabilities": self.capabilities, **self.worker.inventory_fields()}
        digest = hashlib.sha256(json.dumps(fields_, sort_keys=True).encode()).hexdigest()
        if digest == self.inventory_digest and now - self.inventory_sent_at < INVENTORY_MAX_AGE_SECONDS:
            return
        self.send_inventory(fields_, digest, now)

    def send_inventory(self, fields_: dict[str, object], digest: str, now: float) -> None:
        """POST the inventory; a refusal (400, 413) never stops heartbeats, other failures re-raise."""
        inventory = fields_["inventory"]
        try:
            reply = self.client.post("/api/v1/agent/inventory", {**self.versions(), **fields_})
        except PublishError as error:
            if error.status in (400, 413):
                # The server refused this inventory (too large, a field it rejects): say so, keep
                # beating, and try again at the next inventory check.
                log.warning(
                    "%s: inventory refused; heartbeats continue, retrying in %gs. %s",
                    error.describe(),
                    INVENTORY_CHECK_SECONDS,
                    error.server_says(),
                )
                return
            # Not delivered: mark it due, so it goes out first once the control plane answers.
            self.inventory_digest = self.inventory_checked_at = None
            raise
        self.take_interval(reply)
        self.inventory_digest, self.inventory_sent_at = digest, now
        log.info(
            "inventory published: %d GPU(s); capabilities: %s",
            len(inventory["gpus"]),
            ", ".join(fields_["capabilities"]) or "none",
        )

    def maybe_probe_worker(self, now: float) -> None:
        """W1: ask the runtime worker who it is at every inventory check while a compatible one
        answers, and at every heartbeat while none does (a missing socket fails at once). A change
        makes the inventory due now, so the control plane learns of it within one heartbeat."""
        inventory_due = self.inventory_checked_at is None or now - self.inventory_checked_at >= INVENTORY_CHECK_SECONDS
        if self.worker.compatible and not inventory_due:
            return
        if self.worker.probe():
            self.worker_changed()

    def worker_changed(self) -> None:
        """Advertise what the worker's state allows, and send the inventory at the next chance."""
        self.capabilities = advertised_capabilities(self.worker.compatible, self.worker.serves)
        self.inventory_checked_at = None

    def heartbeat(self) -> None:
        """One heartbeat with health, fresh telemetry and, when due, what the agent sees of its
        storage roots (J1); the reply may carry a new root list and the number of waiting jobs."""
        samples, failures = self.telemetry()
        now = time.monotonic()
        use = self.measured_storage_use(now)
        roots = self.storage_roots.heartbeat_fields(now, *((use.roots, use.quarantine) if use else ()))
        deployments = self.deployments.heartbeat_fields() if self.deployments is not None else {}
        body = {**self.versions(), "health": self.health(failures), "telemetry": samples, **roots, **deployments}
        self.heartbeat_sent_at = time.monotonic()
        reply = self.client.post("/api/v1/agent/heartbeat", body)
        self.note_clock(as_dict(reply.get("clock_warning")))
        self.storage_roots.delivered(roots, now)
        self.storage_roots.take_reply(reply)
        self.remove_finished_partials(reply)
        self.take_deployments(reply)
        self.take_interval(reply)
        waiting = reply.get("jobs_waiting")
        self.jobs_waiting = waiting if isinstance(waiting, int) and not isinstance(waiting, bool) else 0

    def measured_storage_use(self, now: float):
        """J5: each root's use and the quarantine's, measured again when a minute has passed, the
        root list changed or a job has ended; otherwise the last figures (the walk is bounded, but
        not free). Only roots below the artifact directory are measured, as only they are observed."""
        if self.storage_roots.etag is None:
            return None
        fresh = (
            self.storage_use is not None
            and not self.storage_use_due
            and self.storage_use_etag == self.storage_roots.etag
            and self.storage_use_measured_at is not None
            and 0 <= now - self.storage_use_measured_at < STORAGE_USE_SECONDS
        )
        if fresh:
            return self.storage_use
        artifact_dir = self.config.data_dirs["artifacts"]
        roots = {
            root.id: os.path.realpath(root.container_path)
            for root in self.storage_roots.roots
            if root_problem(root.container_path, artifact_dir) is None
        }
        lifecycle = importlib.import_module("modelforge_agent_artifacts")
        self.storage_use = lifecycle.measure_storage_use(roots, self.config.data_dirs["quarantine"])
        self.storage_use_measured_at, self.storage_use_etag, self.storage_use_due = now, self.storage_roots.etag, False
        return self.storage_use

    def remove_finished_partials(self, reply: dict[str, object]) -> None:
        """J5: the reply names the reported partial directories whose jobs have ended (succeeded,
        failed or cancelled: no attempt will resume from them); each is removed inside the root it
        was measured in, never the one of the job this agent runs now."""
        finished = reply.get("finished_partial_jobs")
        if not isinstance(finished, list) or self.storage_use is None:
            return
        running = self.runner.job.id if self.runner is not None and self.runner.alive() else None
        names = {root.id: root.name for root in self.storage_roots.roots}
        lifecycle = importlib.import_module("modelforge_agent_artifacts")
        for root_id, usage in self.storage_use.roots.items():
            for job_id in usage.get("partial_jobs", []):
                if job_id not in finished or job_id == running:
                    continue
                root = names.get(root_id, root_id)
                try:
                    freed = lifecycle.remove_partial(self.storage_use.places[root_id], job_id)
                except OSError as error:
                    log.warning("job %s has finished; its partial directory on root %s stays (%s)", job_id, root, error)
                    continue
                log.info(
                    "job %s has finished; removed its partial directory on root %s (%d bytes)", job_id, root, freed
                )
                self.storage_use_due = True

    def take_deployments(self, reply: dict[str, object]) -> None:
        """S2: keep the deployment list a reply carries; the runtime relay is imported the first time."""
        if self.deployments is None and isinstance(reply.get("deployments"), list):
            from modelforge_agent_runtime import Deployments

            self.deployments = Deployments(self.client, self.worker.client, self.config.data_dirs["artifacts"])
        if self.deployments is not None:
            self.deployments.take_reply(reply)

    def reconcile_deployments(self) -> None:
        """S2: after each heartbeat, make the worker hold what the control plane wants loaded."""
        if self.deployments is None:
            return
        serves = self.worker.compatible and self.worker.serves
        if serves and self.relay is None:
            from modelforge_agent_relay import Relay  # S5: requests for them arrive over this connection

            self.relay = Relay(
                self.config, lambda: self.client.credential, self.worker.client.socket_path, lambda: self.interval
            ).start()
        try:
            self.deployments.reconcile(serves)
        except Exception:  # one bad reconcile must never stop the heartbeats
            log.exception("reconciling deployments failed; trying again after the next heartbeat")

    def note_clock(self, warning: dict[str, object]) -> None:
        """Issue 22: the control plane dropped readings this node dated too far ahead (or its
        telemetry came in too old): say what it said, once until a heartbeat comes back without it."""
        if not warning:
            self.said_once.discard("clock")
            return
        if "clock" not in self.said_once:
            self.said_once.add("clock")
            words = " ".join(str(warning.get(name, "")) for name in ("message", "next_step"))
            log.warning(
                "the control plane says about this node's clock: %s", " ".join(words.split())[:SERVER_WORDS_MAX]
            )

    def maybe_claim(self) -> None:
        """Claim a job after start-up, after a job ends, and whenever a heartbeat says one waits
        (J2: picked up within one heartbeat interval); one job at a time, in a worker thread."""
        if self.runner is not None:
            if self.runner.alive():
                return
            failure = self.runner.failure
            if failure is not None and failure.code == RUNTIME_WORKER_UNAVAILABLE:
                # W1: no runtime job is claimed until the worker answers a probe again.
                self.worker.forget(failure.message)
                self.worker_changed()
            # J5: what the job wrote, moved or left changes the roots' use; measured at the next beat.
            self.runner, self.claim_due, self.storage_use_due = None, True, True
        job_types = [capability for capability in self.capabilities if capability in JOB_FAMILIES]
        if not job_types or not (self.claim_due or self.jobs_waiting > 0):
            return
        self.claim_due = False
        try:
            reply = self.jobs.claim(job_types)
        except PublishError as error:
            if error.status is None or error.status >= 500 or error.status == 429:
                self.claim_due = True  # a 429 (issue 22) too: the next heartbeat is at least Retry-After away
                log.warning("%s: no job claimed; trying again after the next heartbeat", error.describe())
            elif f"claim-{error.status}" not in self.said_once:
                self.said_once.add(f"claim-{error.status}")
                log.warning("%s: the control plane refused the claim", error.describe())
            return
        if reply.get("job") is None:
            return  # 204: nothing waits for this node
        job = Job.from_claim(reply["job"])
        if job is None:
            log.error("the claim reply's job has no usable id or attempt; it is left to its lease")
            return
        client = Client(self.config)
        client.credential = self.client.credential
        self.runner = JobRunner(job, JobsClient(client), self.config, self.stop).start()

    def publish_once(self) -> None:
        """The worker probe and inventory if due, then one heartbeat, which an inventory the server
        refuses never blocks."""
        now = time.monotonic()
        self.maybe_probe_worker(now)
        self.maybe_publish_inventory(now)
        self.heartbeat()
        self.reconcile_deployments()
        self.maybe_prune_quarantine(now)

    def maybe_prune_quarantine(self, now: float) -> None:
        """J5: once at start and then hourly, remove quarantined attempts past their retention."""
        days = self.config.quarantine_retention_days
        if not days or (
            self.quarantine_pruned_at is not None and now - self.quarantine_pruned_at < QUARANTINE_PRUNE_EVERY_SECONDS
        ):
            return
        self.quarantine_pruned_at = now
        artifacts = importlib.import_module("modelforge_agent_artifacts")
        try:
            removed = artifacts.prune_quarantine(self.config.data_dirs["quarantine"], days * 86400, time.time())
        except OSError as error:
            log.warning("quarantine: could not look for old evidence (%s); trying again in an hour", error.strerror)
            return
        for name in removed:
            log.info("quarantine: removed %s, kept %g days", ascii(name)[1:-1], days)

    def stop_job(self) -> None:
        """The agent is stopping: the running job stops without a report (its lease runs out and it
        is retried), and is given a moment to tell its runtime worker."""
        if self.runner is not None and self.runner.alive():
            self.runner.control.abandon("the agent is stopping")
            self.runner.thread.join(JOB_STOP_GRACE_SECONDS)

    def start(self) -> None:
        """Use the stored credential, or enrol (I3: a stored credential wins over any token)."""
        node_id = self.state.node_id()
        credential = self.state.credential()
        if credential:
            if self.config.enrollment_token and "token-ignored" not in self.said_once:
                self.said_once.add("token-ignored")
                log.info("a credential is stored; ignoring MODELFORGE_AGENT_ENROLLMENT_TOKEN (it can be removed)")
            self.client.credential = credential
            log.info("node %s starting with its stored credential", node_id)
        else:
            self.enroll(node_id)

    def run(self, once: bool = False) -> int:
        """Enrol if needed, then publish on a monotonic schedule, one interval from each beat's send, until stopped."""
        self.start()
        try:
            return self.loop(once)
        finally:
            self.stop_job()

    def loop(self, once: bool) -> int:
        """Publish, claim, and sleep until the next beat, until stopped."""
        next_beat = time.monotonic()
        while not self.stop.is_set():
            try:
                self.publish_once()
            except PublishError as error:
                if error.status is not None and 400 <= error.status < 500:
                    self.handle_refusal(error)
                else:
                    self.wait_after(error)
                next_beat = time.monotonic()
                continue
            if self.backoff.attempt:
                log.info("publishing again after %d failed attempt(s)", self.backoff.attempt)
                self.backoff.reset()
            self.said_once.discard("rate-limited")  # the next 429 is a new episode, logged again
            self.said_once -= {said for said in self.said_once if said.startswith("refused-")}
            if once:
                return EXIT_OK
            self.maybe_claim()
            # The next beat is due one interval after this one was SENT, the moment nearest to when
            # the control plane accepted it, which is where its per-node rate measures from
            # (app/nodes/rate_limits.py, issue 22): a slow start (worker probe, inventory) before the
            # send no longer makes the next beat come too soon. A slow reply does not delay it.
            next_beat = max(next_beat, self.heartbeat_sent_at or next_beat) + self.interval
            delay = next_beat - time.monotonic()
            if delay < 0:
                next_beat, delay = time.monotonic(), 0
            if self.stop.wait(delay):
                break
        return EXIT_OK


# --------------------------------------------------------------------------- command line


def configure_logging() -> None:
    """One line per event on stderr; never a body, token or credential (A3)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: --preflight, --once, --version."""
    parser = argparse.ArgumentParser(
        prog="python3 -m modelforge_node_agent",
        description="ModelForge node agent: enrols once, then publishes inventory, health and GPU "
        "telemetry to the control plane and runs the jobs it claims. Outbound only.",
        epilog="Exit codes: 0 done, 2 configuration error, 3 NVIDIA preflight failure, "
        "4 enrolment refused, 5 credential revoked.",
    )
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="check NVIDIA and the four data directories, print a report, exit 0, 3 (NVIDIA) or 2 (a directory)",
    )
    parser.add_argument(
        "--once", action="store_true", help="enrol if needed, publish one inventory and heartbeat, exit"
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {AGENT_VERSION} (protocol {PROTOCOL_VERSION})"
    )
    return parser.parse_args(argv)


def run_agent(args: argparse.Namespace, env: dict[str, str]) -> int:
    """Configure, preflight, then run; raises ConfigError for any setting that stops the agent."""
    config = load_config(env, need_url=not args.preflight)
    nvml = Nvml()
    result = run_preflight(config.accelerator_mode, nvml, env)
    if args.preflight:
        # N3: checks only — no network, no state. The data directories are checked as health
        # checks them (R1); one that is unusable is a configuration error (exit 2), after NVIDIA's 3.
        problems = data_dir_problems(config.data_dirs)
        print(preflight_report(result, config.data_dirs, problems))
        if not result.ok:
            return EXIT_PREFLIGHT
        return EXIT_CONFIG if problems else EXIT_OK
    if not result.ok:
        # N2: exactly one code with a hint; nothing is sent, nothing is written.
        print(f"{result.code}: {result.hint}", file=sys.stderr)
        return EXIT_PREFLIGHT

    if not config.tls_verify:
        log.warning(
            "MODELFORGE_AGENT_TLS_VERIFY=false: the control plane's certificate is NOT verified. "
            "Use MODELFORGE_AGENT_CA_CERT_PATH for a private CA instead"
        )
    ensure_state_dir(config)
    stop = threading.Event()

    def on_signal(signum, _frame):
        # Ends a sleep at once and interrupts a request in flight: stopped within a second.
        stop.set()
        raise Exit(EXIT_OK)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("modelforge-node-agent %s (protocol %d) starting; %s", AGENT_VERSION, PROTOCOL_VERSION, result.reason)
    return Agent(config, nvml, result, stop).run(once=args.once)


def main(argv: list[str] | None = None) -> int:
    """Run the agent; returns the process exit code."""
    args = parse_args(argv)
    configure_logging()
    try:
        return run_agent(args, dict(os.environ))
    except Exit as done:
        return done.code
    except ConfigError as error:
        # The one exit 2: a single line naming the setting, whichever step refused it.
        print(f"modelforge-node-agent: configuration error: {error}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    # `python -m` runs this file as __main__: a job family's module imports it by name and must
    # find this very module (one JOB_HANDLERS, one JobFailure), not load a second copy of it.
    sys.modules.setdefault("modelforge_node_agent", sys.modules[__name__])
    sys.exit(main())
