"""ModelForge node agent: one file that runs on every GPU host and only ever dials out.

Sections, each using only what the ones above it define: constants, configuration, NVML and
preflight, inventory, state, HTTP client, storage roots, jobs client, acquire, runtime worker,
publishing loop, command line. Standard
library + requests + nvidia-ml-py; huggingface_hub is imported only while an artifact.acquire.v1
job runs, so an idle agent stays small. Runtime jobs run in the separate runtime worker (W1),
which the agent reaches over a Unix socket.

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
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

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
# Example hosts from our docs: an agent pointed at one was never configured.
PLACEHOLDER_HOSTS = ("modelforge.example", "example.com", "example.internal")

# J2: the job types this agent can run, and the job error codes it reports or is answered with.
ACQUIRE_JOB_TYPE = "artifact.acquire.v1"
STORAGE_CAPACITY_GUARD = "STORAGE_CAPACITY_GUARD"
STORAGE_ROOT_UNAVAILABLE = "STORAGE_ROOT_UNAVAILABLE"
HUB_REPO_NOT_FOUND = "HUB_REPO_NOT_FOUND"
HUB_REVISION_NOT_FOUND = "HUB_REVISION_NOT_FOUND"
HUB_AUTH_REQUIRED = "HUB_AUTH_REQUIRED"
HUB_UNAVAILABLE = "HUB_UNAVAILABLE"
ARTIFACT_VERIFICATION_FAILED = "ARTIFACT_VERIFICATION_FAILED"
ARTIFACT_PATH_UNSAFE = "ARTIFACT_PATH_UNSAFE"
HUB_TREE_INVALID = "HUB_TREE_INVALID"
JOB_LEASE_LOST = "JOB_LEASE_LOST"
JOB_CANCELLED = "JOB_CANCELLED"
JOB_PARAMS_INVALID = "JOB_PARAMS_INVALID"
JOB_TYPE_UNSUPPORTED = "JOB_TYPE_UNSUPPORTED"

# V1: the GPU facts nvidia-smi prints, relayed raw beside NVML's for the control plane to compare.
NVIDIA_SMI_ARGS = ("--query-gpu=name,uuid,driver_version,memory.total", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT_SECONDS = 5.0
NVIDIA_SMI_MAX_OUTPUT = 16 * 1024  # the inventory's limit (app/api/bodies.py MAX_NVIDIA_SMI_OUTPUT)

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
STALL_SECONDS = 30.0  # J2: a transfer with no byte for this long is a stall (MODELFORGE_AGENT_STALL_SECONDS)
PROGRESS_INTERVAL_SECONDS = 10.0  # when a claim names none
STORAGE_REPORT_SECONDS = 60.0  # J1: root observations go out at least this often
NOTABLE_FREE_CHANGE = 0.01  # … and sooner when free space moves by 1 % of the filesystem
DOWNLOAD_CHUNK_BYTES = 1 << 20
CAPACITY_CHECK_BYTES = 4 << 20  # J1: statvfs again after every 4 MiB written
TRANSFER_RETRIES = 3  # a transfer that broke after making progress resumes at once, this often per file
FINAL_REPORT_PATIENCE_SECONDS = 600.0  # how long a complete/fail report is retried while unreachable
MANIFEST_NAME = "modelforge-manifest.json"

# W1: the runtime worker, its job types and the protocol versions of its socket this agent speaks.
RUNTIME_BENCHMARK_JOB_TYPE = "runtime.benchmark.v1"
RUNTIME_GENERATE_JOB_TYPE = "runtime.generate.v1"
RUNTIME_JOB_TYPES = (RUNTIME_BENCHMARK_JOB_TYPE, RUNTIME_GENERATE_JOB_TYPE)
RUNTIME_WORKER_UNAVAILABLE = "RUNTIME_WORKER_UNAVAILABLE"
MODEL_FILE_INVALID = "MODEL_FILE_INVALID"
WORKER_PROTOCOLS = (1,)
DEFAULT_WORKER_SOCKET = "/run/modelforge/worker.sock"
UNIX_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one NUL
WORKER_CONNECT_TIMEOUT_SECONDS = 1.0  # a local socket answers at once or not at all
WORKER_READ_TIMEOUT_SECONDS = 5.0
WORKER_REPLY_MAX_BYTES = 1 << 20  # a generate result of 16 prompts is far below this
WORKER_POLL_SECONDS = 0.25
WORKER_POLL_TIMEOUTS = 3  # this many timed-out polls in a row: the worker is gone
WORKER_CANCEL_WAIT_SECONDS = 5.0  # W1: a cancelled job stops within a second; wait a little longer
MAX_WORKER_DEVICES = 64
JOB_STOP_GRACE_SECONDS = 1.0  # how long a stopping agent lets a running job tell its worker

log = logging.getLogger("modelforge_node_agent")

# --------------------------------------------------------------------------- configuration


class ConfigError(Exception):
    """A setting is missing or invalid; the message names the variable. main() exits 2 with it."""


@dataclass(frozen=True)
class HubSettings:
    """Where artifacts come from (J3): the Hub endpoint, the optional token, the stall limit.

    The token lives only here, in memory: it is never logged, put in a URL, an error or a result,
    and never sent to a host other than the endpoint's.
    """

    endpoint: str = DEFAULT_HF_ENDPOINT
    token: str | None = field(default=None, repr=False)
    stall_seconds: float = STALL_SECONDS


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


def _stall_seconds(env: dict[str, str]) -> float:
    name = "MODELFORGE_AGENT_STALL_SECONDS"
    raw = env.get(name, "").strip()
    if not raw:
        return STALL_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0.1 <= seconds <= 3600:
        raise ConfigError(f"{name} must be between 0.1 and 3600 seconds, got {raw!r}")
    return seconds


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
    dirs = {
        "state": Path(env.get("MODELFORGE_AGENT_STATE_DIR") or "/data/state"),
        "hf-cache": Path(env.get("MODELFORGE_AGENT_HF_CACHE_DIR") or "/data/hf-cache"),
        "artifacts": Path(env.get("MODELFORGE_AGENT_ARTIFACT_DIR") or "/data/artifacts"),
        "quarantine": Path(env.get("MODELFORGE_AGENT_QUARANTINE_DIR") or "/data/quarantine"),
    }
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
        hub=HubSettings(endpoint=_hf_endpoint(env), token=_hf_token(env), stall_seconds=_stall_seconds(env)),
        worker_socket=_worker_socket(env),
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


def preflight_report(result: Preflight) -> str:
    """A short human report of the preflight."""
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
    if result.ok:
        lines.append("  result: PASS")
    else:
        lines.append(f"  result: FAIL {result.code}: {result.hint}")
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


def root_problem(container_path: str, artifact_dir: Path) -> str | None:
    """Why the agent may not write to this root, or None: it must be a directory below the
    artifact directory once symlinks are resolved (J1: never a path outside it)."""
    if not os.path.isabs(container_path):
        return f"{container_path} is not an absolute path"
    real = os.path.realpath(container_path)
    base = os.path.realpath(artifact_dir)
    if os.path.commonpath([real, base]) != base:
        return f"{container_path} resolves outside the artifact directory {artifact_dir}"
    if not os.path.isdir(real):
        return f"{container_path} does not exist or is not a directory"
    return None


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


def observe_root(root: StorageRoot, artifact_dir: Path, writable: bool | None = None) -> dict[str, object]:
    """What the agent sees of one root now (J1); a root outside the artifact directory is never probed.
    `writable`, when given, is a recent probe's answer and no probe file is written."""
    facts: dict[str, object] = {
        "id": root.id,
        "exists": False,
        "writable": False,
        "free_bytes": None,
        "total_bytes": None,
        "observed_at": rfc3339_now(),
    }
    if root_problem(root.container_path, artifact_dir) is not None:
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
    """A root appeared, vanished, changed state, or its free space moved by 1 % of its size."""
    if any(old.get(key) != new.get(key) for key in ("exists", "writable", "total_bytes")):
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

    def heartbeat_fields(self, now: float) -> dict[str, object]:
        """The etag we hold, and fresh observations when they are due (changed, or a minute old)."""
        if self.etag is None:
            return {}
        fields_: dict[str, object] = {"storage_roots_etag": self.etag}
        observed = {root.id: self.observe(root, now) for root in self.roots}
        due = (
            self.reported is None
            or now - self.reported_at >= STORAGE_REPORT_SECONDS
            or observed.keys() != self.reported.keys()
            or any(_notably_different(self.reported[key], value) for key, value in observed.items())
        )
        if due:
            fields_["storage_roots"] = list(observed.values())
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
            self.reported_at = now


# --------------------------------------------------------------------------- jobs client

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


JobHandler = Callable[[Job, Config, JobControl, Callable[[Progress], None]], dict[str, object]]
# Job type → the function that runs it, the libraries it imports when it runs, and how the log
# line of its success sums its result up; each job section below registers its own.
JOB_HANDLERS: dict[str, JobHandler] = {}
JOB_LIBRARIES: dict[str, tuple[str, ...]] = {}
JOB_SUMMARIES: dict[str, Callable[[dict[str, object]], str]] = {}


def advertised_capabilities(worker_compatible: bool = False) -> list[str]:
    """The job types this agent can run (J2): those with a handler whose library is installed,
    and the runtime types only while a compatible runtime worker answers (W1). The library is
    only looked for here, not imported, so an idle agent stays small."""
    return [
        job_type
        for job_type in JOB_HANDLERS
        if all(importlib.util.find_spec(module) is not None for module in JOB_LIBRARIES.get(job_type, ()))
        and (worker_compatible or job_type not in RUNTIME_JOB_TYPES)
    ]


def result_summary(job_type: str, result: dict[str, object]) -> str:
    """A few words on a job's result for its success log line (never the whole result)."""
    summary = JOB_SUMMARIES.get(job_type)
    return summary(result) if summary is not None else "result with " + ", ".join(sorted(result)[:8])


class JobRunner:
    """One claimed job in a worker thread, so heartbeats go on (J2): progress every interval,
    then exactly one complete or fail report, or none when the lease was lost."""

    def __init__(
        self,
        job: Job,
        client: JobsClient,
        config: Config,
        shutdown: threading.Event,
        handlers: dict[str, JobHandler] | None = None,
    ) -> None:
        self.job, self.client, self.config, self.shutdown = job, client, config, shutdown
        self.handlers = handlers if handlers is not None else JOB_HANDLERS
        self.control = JobControl()
        self.finished = threading.Event()
        self._progress = Progress()
        self._lock = threading.Lock()
        self.failure: JobFailure | None = None  # how the attempt failed, once it has
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
        elif result is not None and self.send_progress():
            log.info("%s succeeded: %s", job.describe(), result_summary(job.type, result))
            self.deliver("complete", lambda: self.client.complete(job, result))

    def execute(self) -> dict[str, object]:
        """Dispatch to the handler for the job's type."""
        handler = self.handlers.get(self.job.type)
        if handler is None:
            raise JobFailure(JOB_TYPE_UNSUPPORTED, f"this agent does not run {self.job.type!r} jobs", retryable=False)
        return handler(self.job, self.config, self.control, self.on_progress)

    def report_progress_loop(self) -> None:
        """Every progress interval until the job ends: report, and stop the job if told to."""
        while not self.finished.wait(self.job.progress_interval):
            if self.shutdown.is_set():
                self.control.abandon("the agent is stopping")
                return
            if not self.send_progress():
                return  # the lease is lost: no report of this attempt is ever sent again

    def send_progress(self) -> bool:
        """One progress report; False once the lease is lost. An unreachable control plane is
        only logged: the job goes on and the next interval tries again (the lease may lapse)."""
        try:
            reply = self.client.progress(self.job, self.latest_progress())
        except LeaseLost as lost:
            log.warning("%s: %s; this attempt stops and reports nothing more", self.job.describe(), lost)
            self.control.abandon("lease lost")
            return False
        except PublishError as error:
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
                    log.error("%s: %s; the %s report was refused", self.job.describe(), error.describe(), what)
                    return
                delay = backoff.next_delay()
                if time.monotonic() + delay > deadline:
                    log.error("%s: %s; giving up on the %s report", self.job.describe(), error.describe(), what)
                    return
                log.warning("%s (backoff %s); next try in %gs", error.describe(), backoff.describe(), delay)
                if self.shutdown.wait(backoff.jittered(delay)):
                    return


# --------------------------------------------------------------------------- acquire

REPO_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
MAX_REDIRECTS = 10
TOKEN_HINT = "set MODELFORGE_HF_TOKEN to a token that has access"
CONNECT_TIMEOUT_SECONDS = 10.0
O_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class AcquireRequest:
    """The params of an artifact.acquire.v1 job (J3), each checked before anything is fetched."""

    repo_id: str
    revision: str
    repo_type: str
    container_path: str
    min_free_bytes: int
    storage_root_id: str | None = None
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None

    @classmethod
    def from_params(cls, params: dict[str, object]) -> AcquireRequest:
        """Check the params; a bad one fails the job (not retryable) naming the field."""

        def bad(name: str, rule: str) -> JobFailure:
            return JobFailure(JOB_PARAMS_INVALID, f"params.{name} {rule}", retryable=False)

        repo_id = params.get("repo_id")
        if not isinstance(repo_id, str) or not REPO_ID_PATTERN.fullmatch(repo_id) or ".." in repo_id:
            raise bad("repo_id", "must be owner/name (letters, digits, '.', '_', '-')")
        revision = params.get("revision") if params.get("revision") is not None else "main"
        if not isinstance(revision, str) or not 0 < len(revision) <= 255 or not revision.isprintable():
            raise bad("revision", "must be a branch, tag or commit")
        repo_type = params.get("repo_type") if params.get("repo_type") is not None else "model"
        if repo_type not in ("model", "dataset"):
            raise bad("repo_type", "must be model or dataset")
        container_path = params.get("container_path")
        if not isinstance(container_path, str) or not os.path.isabs(container_path):
            raise bad("container_path", "must be the storage root's absolute path in the agent's container")
        minimum = params.get("min_free_bytes", 0)
        if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 0:
            raise bad("min_free_bytes", "must be a whole number of bytes")
        root_id = params.get("storage_root_id")
        patterns = {}
        for name in ("allow_patterns", "ignore_patterns"):
            value = params.get(name)
            if isinstance(value, str):
                value = [value]
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(item, str) and item for item in value)
            ):
                raise bad(name, "must be a list of glob patterns or null")
            patterns[name] = value
        return cls(
            repo_id=repo_id,
            revision=revision,
            repo_type=repo_type,
            container_path=container_path,
            min_free_bytes=minimum,
            storage_root_id=str(root_id) if root_id is not None else None,
            **patterns,
        )

    def final_parts(self, commit: str) -> list[str]:
        """`<repo_type>s/<owner>/<name>/<commit>`, the artifact's place below the root."""
        return [f"{self.repo_type}s", *self.repo_id.split("/"), commit]


@dataclass(frozen=True)
class RemoteFile:
    """One file of the tree at the commit and the hash the Hub recorded for it: sha256 for LFS
    files, the git blob id (sha1 of `blob <size>\\0` + content) for the rest (J3)."""

    path: str
    size: int
    algorithm: str  # "sha256" or "git-sha1"
    digest: str

    def new_hash(self):
        """A hasher that yields `digest` once fed exactly this file's bytes."""
        if self.algorithm == "sha256":
            return hashlib.sha256()
        return hashlib.sha1(b"blob %d\0" % self.size, usedforsecurity=False)

    @property
    def hash_name(self) -> str:
        """What the manifest and reason.json call the hash: `sha256` or `git_oid`."""
        return "sha256" if self.algorithm == "sha256" else "git_oid"

    def manifest_entry(self) -> dict[str, object]:
        """How modelforge-manifest.json lists the file."""
        return {"path": self.path, "size": self.size, self.hash_name: self.digest}


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


def safe_repo_path(path: object) -> str:
    """A path from the Hub, checked before any use (J3): a safe relative path (above), not the
    manifest's own name."""
    if not isinstance(path, str) or not path:
        raise JobFailure(ARTIFACT_PATH_UNSAFE, "the Hub listed a file without a path", retryable=False)
    shown = ascii(path)[:300]
    if not is_safe_relative_path(path):
        raise JobFailure(
            ARTIFACT_PATH_UNSAFE,
            f"the Hub listed the unsafe path {shown}; nothing was written for it",
            retryable=False,
        )
    if path == MANIFEST_NAME:
        raise JobFailure(
            ARTIFACT_PATH_UNSAFE, f"the repository holds {MANIFEST_NAME}, a name the agent keeps", retryable=False
        )
    return path


def remote_file(entry) -> RemoteFile:
    """A huggingface_hub RepoFile as a RemoteFile, or HUB_TREE_INVALID when it has no usable size or hash."""
    path = safe_repo_path(entry.path)
    size, lfs, blob_id = entry.size, entry.lfs, entry.blob_id
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise JobFailure(HUB_TREE_INVALID, f"the Hub recorded no size for {path}", retryable=False)
    if lfs is not None:
        digest = lfs.get("sha256") if isinstance(lfs, dict) else None
        if not isinstance(digest, str) or not SHA256_PATTERN.fullmatch(digest) or lfs.get("size") != size:
            raise JobFailure(HUB_TREE_INVALID, f"the Hub recorded no usable sha256 for {path}", retryable=False)
        return RemoteFile(path, size, "sha256", digest)
    if not isinstance(blob_id, str) or not COMMIT_PATTERN.fullmatch(blob_id):
        raise JobFailure(HUB_TREE_INVALID, f"the Hub recorded no usable git blob id for {path}", retryable=False)
    return RemoteFile(path, size, "git-sha1", blob_id)


def refuse_conflicts(files: list[RemoteFile]) -> None:
    """Two entries for one path, or a file where another needs a directory, is a hostile tree."""
    paths = [remote.path for remote in files]
    if len(set(paths)) != len(paths):
        raise JobFailure(ARTIFACT_PATH_UNSAFE, "the Hub listed one path twice", retryable=False)
    taken = set(paths)
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in taken:
                message = f"the Hub listed {ascii(path)[:300]} below the file {ascii('/'.join(parts[:depth]))[:300]}"
                raise JobFailure(ARTIFACT_PATH_UNSAFE, message, retryable=False)


def origin_of(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port: the token goes only where these equal the Hub endpoint's."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def describe_url(method: str, url: str) -> str:
    """`GET host/path` for logs and errors: never the query (signed CDN URLs carry credentials there)."""
    parts = urlsplit(url)
    return f"{method} {parts.hostname}{parts.path}"


_hub_timeout: float | None = None


class HubClient:
    """The Hugging Face Hub: huggingface_hub (imported here, only when a job runs) resolves the
    revision, lists the tree, filters it and builds URLs and headers; the bytes come through
    requests so they are hashed as they are written and resumed with Range (J3)."""

    def __init__(self, hub: HubSettings) -> None:
        global _hub_timeout
        self.hub = hub
        self.hf = importlib.import_module("huggingface_hub")
        self.errors = importlib.import_module("huggingface_hub.errors")
        self.utils = importlib.import_module("huggingface_hub.utils")
        transport = importlib.import_module("httpx2")  # huggingface_hub's own HTTP library
        # Our log lines name each failure (A3 style); the library's own retry chatter would not.
        self.utils.logging.set_verbosity_error()
        if _hub_timeout != hub.stall_seconds:
            # huggingface_hub's shared client waits forever by default: a stalled tree listing
            # would hang the job, so its reads get the same stall limit as the bytes.
            timeout = transport.Timeout(hub.stall_seconds, connect=CONNECT_TIMEOUT_SECONDS)
            self.hf.set_client_factory(lambda: transport.Client(follow_redirects=True, timeout=timeout))
            _hub_timeout = hub.stall_seconds
        self.api_errors = (self.errors.HfHubHTTPError, transport.HTTPError, OSError, ValueError, KeyError, TypeError)
        self.timeout_errors = (transport.TimeoutException,)
        self.api = self.hf.HfApi(
            endpoint=hub.endpoint,
            token=hub.token or False,  # False: never a token from ~/.cache or HF_TOKEN, only ours
            library_name="modelforge-node-agent",
            library_version=AGENT_VERSION,
        )
        self.origin = origin_of(hub.endpoint)
        import requests
        import urllib3

        self.requests, self.urllib3 = requests, urllib3
        self.body_errors = (urllib3.exceptions.HTTPError, requests.exceptions.RequestException)
        self.session = requests.Session()

    def close(self) -> None:
        """Release the byte session's connections."""
        self.session.close()

    def api_failure(self, error: Exception, what: str) -> JobFailure:
        """A huggingface_hub or transport error as one of our codes (J2 classes), without the token."""
        errors = self.errors
        status = getattr(getattr(error, "response", None), "status_code", None)
        if isinstance(error, errors.GatedRepoError):
            message = f"{what}: the repository is gated (HTTP {status}); {TOKEN_HINT}"
            return JobFailure(HUB_AUTH_REQUIRED, message, retryable=False)
        if isinstance(error, errors.RevisionNotFoundError):
            return JobFailure(HUB_REVISION_NOT_FOUND, f"{what}: no such revision (HTTP {status})", retryable=False)
        if isinstance(error, errors.RepositoryNotFoundError | errors.DisabledRepoError) or status == 404:
            # The Hub answers a private repository exactly like a missing one (401 without a token).
            hint = "" if self.hub.token else "; if it is private, set MODELFORGE_HF_TOKEN"
            message = f"{what}: no such repository (HTTP {status}){hint}"
            return JobFailure(HUB_REPO_NOT_FOUND, message, retryable=False)
        if status in (401, 403):
            who = "the Hub refused MODELFORGE_HF_TOKEN" if self.hub.token else "no MODELFORGE_HF_TOKEN is set"
            return JobFailure(HUB_AUTH_REQUIRED, f"{what}: HTTP {status} ({who}); {TOKEN_HINT}", retryable=False)
        if isinstance(error, errors.HFValidationError):
            return JobFailure(JOB_PARAMS_INVALID, f"{what}: huggingface_hub refused the name", retryable=False)
        if isinstance(error, KeyError | TypeError):
            message = f"{what}: an entry lacks a field huggingface_hub needs ({type(error).__name__})"
            return JobFailure(HUB_TREE_INVALID, message, retryable=False)
        if status is not None:
            retryable = status >= 500 or status in (408, 429)
            return JobFailure(HUB_UNAVAILABLE, f"{what}: HTTP {status} from the Hub", retryable=retryable)
        if isinstance(error, self.timeout_errors):
            message = f"{what}: the Hub did not answer within {self.hub.stall_seconds:g}s"
            return JobFailure(HUB_UNAVAILABLE, message, retryable=True)
        return JobFailure(HUB_UNAVAILABLE, f"{what}: {type(error).__name__}", retryable=True)

    def resolve_commit(self, request: AcquireRequest, revision: str) -> str:
        """J3: the revision as a 40-hex commit, before the first byte."""
        what = f"resolving {request.repo_type} {request.repo_id}@{revision}"
        try:
            info = self.api.repo_info(
                request.repo_id, revision=revision, repo_type=request.repo_type, timeout=self.hub.stall_seconds
            )
        except self.api_errors as error:
            raise self.api_failure(error, what) from None
        commit = getattr(info, "sha", None)
        if not isinstance(commit, str) or not COMMIT_PATTERN.fullmatch(commit):
            raise JobFailure(HUB_UNAVAILABLE, f"{what}: the Hub named no 40-hex commit", retryable=True)
        return commit

    def list_files(self, request: AcquireRequest, commit: str) -> list[RemoteFile]:
        """The tree at the commit, recursively, every path checked, then filtered by the patterns."""
        what = f"listing {request.repo_id}@{commit}"
        try:
            entries = list(
                self.api.list_repo_tree(request.repo_id, recursive=True, revision=commit, repo_type=request.repo_type)
            )
        except self.api_errors as error:
            raise self.api_failure(error, what) from None
        repo_file = self.hf.hf_api.RepoFile
        for entry in entries:
            if not isinstance(entry, repo_file):
                safe_repo_path(entry.path)  # folders are never created from the listing, but a hostile one is refused
        files = [remote_file(entry) for entry in entries if isinstance(entry, repo_file)]
        refuse_conflicts(files)
        kept = self.utils.filter_repo_objects(
            files,
            allow_patterns=request.allow_patterns,
            ignore_patterns=request.ignore_patterns,
            key=lambda remote: remote.path,
        )
        return sorted(kept, key=lambda remote: remote.path)

    def open_file(self, request: AcquireRequest, commit: str, path: str, offset: int):
        """GET the file at the commit from `offset` (Range), following redirects by hand so the
        token goes only to the Hub endpoint's own origin, never to the LFS CDN (J3)."""
        url = self.hf.hf_hub_url(
            request.repo_id, path, repo_type=request.repo_type, revision=commit, endpoint=self.hub.endpoint
        )
        headers = self.utils.build_hf_headers(
            token=self.hub.token or False, library_name="modelforge-node-agent", library_version=AGENT_VERSION
        )
        headers["Accept-Encoding"] = "identity"  # byte offsets must mean the file's bytes
        if offset:
            headers["Range"] = f"bytes={offset}-"
        for _ in range(MAX_REDIRECTS):
            sent = {name: value for name, value in headers.items() if name.lower() != "authorization"}
            if origin_of(url) == self.origin and "authorization" in headers:
                sent["authorization"] = headers["authorization"]
            response = self.session.get(
                url,
                headers=sent,
                stream=True,
                allow_redirects=False,
                timeout=(CONNECT_TIMEOUT_SECONDS, self.hub.stall_seconds),
            )
            location = response.headers.get("Location")
            if response.status_code not in (301, 302, 303, 307, 308) or not location:
                return response
            response.close()
            url = urljoin(url, location)
        raise JobFailure(HUB_UNAVAILABLE, f"more than {MAX_REDIRECTS} redirects for {path}", retryable=True)

    @staticmethod
    def file_failure(response, path: str) -> JobFailure | None:
        """A refused file GET as one of our codes, or None for 200/206."""
        status = response.status_code
        if status in (200, 206):
            return None
        what = f"{describe_url('GET', response.url)} for {path}: HTTP {status}"
        code = response.headers.get("X-Error-Code")
        if code == "RepoNotFound":
            return JobFailure(HUB_REPO_NOT_FOUND, what, retryable=False)
        if code == "RevisionNotFound":
            return JobFailure(HUB_REVISION_NOT_FOUND, what, retryable=False)
        if status in (401, 403):
            return JobFailure(HUB_AUTH_REQUIRED, f"{what} ({code or 'refused'}); {TOKEN_HINT}", retryable=False)
        # The tree at this very commit listed the file: a 404 now is the Hub's hiccup, worth a retry.
        return JobFailure(HUB_UNAVAILABLE, what, retryable=status >= 500 or status in (404, 408, 429))

    def is_stall(self, error: Exception) -> bool:
        """Whether a transfer error is a read that waited stall_seconds for a byte."""
        stalls = (self.requests.exceptions.Timeout, self.urllib3.exceptions.ReadTimeoutError)
        return isinstance(error, stalls) or any(isinstance(arg, stalls) for arg in error.args)


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


def with_missing_ok(function: Callable, *args, **kwargs) -> None:
    """Call `function`, ignoring only a path that is already gone."""
    try:
        function(*args, **kwargs)
    except FileNotFoundError:
        pass


def write_json_at(dir_fd: int, name: str, data: dict[str, object]) -> None:
    """Write JSON atomically (temp file, fsync, rename) in the directory `dir_fd`."""
    temp = f".{name}.{uuid.uuid4().hex}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with_missing_ok(os.unlink, temp, dir_fd=dir_fd)
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


class PartialDir:
    """`<root>/.partial/<job_id>/`, where one job's files grow on the root's own filesystem (J3).
    Everything in it is reached through directory descriptors opened with O_NOFOLLOW: a symlink
    planted there is refused, never followed. `<job_id>.json` beside it records the commit."""

    def __init__(self, root: str, job_id: str) -> None:
        self.root = root  # realpath of the storage root
        self.job_id = job_id
        self.path = os.path.join(root, ".partial", job_id)
        self._root_fd: int | None = os.open(root, O_DIR_NOFOLLOW)
        self.fd: int | None = None

    @property
    def closed(self) -> bool:
        return self._root_fd is None

    @property
    def root_fd(self) -> int:
        """The storage root's descriptor; a closed PartialDir refuses every use (its number may by
        now belong to another thread's file)."""
        if self._root_fd is None:
            raise ValueError(f"the partial directory of job {self.job_id} is closed")
        return self._root_fd

    def _dir_fd(self) -> int:
        """The partial directory's descriptor; refused when closed or not created yet."""
        if self._root_fd is None or self.fd is None:
            raise ValueError(f"the partial directory of job {self.job_id} is closed or not created")
        return self.fd

    def close(self) -> None:
        """Close the directory descriptors; a second call does nothing (never a double close)."""
        fds, self.fd, self._root_fd = (self.fd, self._root_fd), None, None
        for fd in fds:
            if fd is not None:
                os.close(fd)

    def _partials_fd(self, create: bool) -> int | None:
        try:
            return open_dir_chain(self.root_fd, [".partial"], create=create)
        except FileNotFoundError:
            return None

    def read_state(self) -> dict[str, object]:
        """What an earlier attempt of this job recorded (repo, revision, commit), or {}."""
        fd = self._partials_fd(create=False)
        if fd is None:
            return {}
        try:
            return read_json_at(fd, f"{self.job_id}.json") or {}
        finally:
            os.close(fd)

    def refuse_links(self) -> None:
        """A symlink, device or pipe anywhere in the partial directory fails the job (J3)."""
        if not os.path.lexists(self.path):
            return
        os.close(open_dir_chain(self.root_fd, [".partial", self.job_id], create=False))  # no link on the way
        for directory, dirs, files in os.walk(self.path):
            for name in dirs + files:
                mode = os.lstat(os.path.join(directory, name)).st_mode
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    relative = os.path.relpath(os.path.join(directory, name), self.path)
                    raise JobFailure(
                        ARTIFACT_PATH_UNSAFE,
                        f"{ascii(relative)[:300]} in the partial directory is not a regular file; it is never followed",
                        retryable=False,
                    )

    def existing_sizes(self, files: list[RemoteFile]) -> dict[str, int]:
        """How many bytes of each file an earlier attempt left (0 if none, or too many)."""
        sizes = {}
        for remote in files:
            try:
                info = os.lstat(os.path.join(self.path, remote.path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size <= remote.size:
                sizes[remote.path] = info.st_size
        return sizes

    def create(self, state: dict[str, object]) -> None:
        """Create the directory (and record the state) before the first byte."""
        partials = open_dir_chain(self.root_fd, [".partial"], create=True)
        try:
            write_json_at(partials, f"{self.job_id}.json", state)
            self.fd = open_dir_chain(partials, [self.job_id], create=True)
        finally:
            os.close(partials)

    def open_file(self, path: str) -> int:
        """Open (or create) one file for writing, never through a symlink, and only below the partial dir."""
        joined = os.path.realpath(os.path.join(self.path, path))
        if not joined.startswith(self.path + os.sep):
            raise JobFailure(ARTIFACT_PATH_UNSAFE, f"{ascii(path)[:300]} leaves the partial directory", retryable=False)
        *parents, name = path.split("/")
        directory = open_dir_chain(self._dir_fd(), parents, create=True)
        try:
            try:
                fd = os.open(
                    name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644, dir_fd=directory
                )
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise JobFailure(
                        ARTIFACT_PATH_UNSAFE, f"{ascii(path)[:300]} is a symlink; never followed", retryable=False
                    ) from None
                raise
        finally:
            os.close(directory)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise JobFailure(ARTIFACT_PATH_UNSAFE, f"{ascii(path)[:300]} is not a regular file", retryable=False)
        return fd

    def prune(self, keep: set[str]) -> None:
        """Remove files no longer part of the tree (and empty directories), so the set is exact."""
        for directory, dirs, files in os.walk(self.path, topdown=False):
            for name in files:
                full = os.path.join(directory, name)
                if os.path.relpath(full, self.path).replace(os.sep, "/") not in keep:
                    os.unlink(full)
            for name in dirs:
                full = os.path.join(directory, name)
                if not os.listdir(full):
                    os.rmdir(full)

    def write_manifest(self, manifest: dict[str, object]) -> None:
        """modelforge-manifest.json inside, the last file before the rename."""
        write_json_at(self._dir_fd(), MANIFEST_NAME, manifest)

    def move_into_place(self, final_parts: list[str]) -> bool:
        """Rename the whole directory to its final place in one step; False if one is already there."""
        parent = open_dir_chain(self.root_fd, final_parts[:-1], create=True)
        partials = open_dir_chain(self.root_fd, [".partial"], create=False)
        try:
            os.fsync(self._dir_fd())
            os.rename(self.job_id, final_parts[-1], src_dir_fd=partials, dst_dir_fd=parent)
            os.fsync(parent)
            with_missing_ok(os.unlink, f"{self.job_id}.json", dir_fd=partials)
            return True
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
        finally:
            os.close(parent)
            os.close(partials)

    def remove(self) -> None:
        """Delete the partial directory and its state (a terminal state that is not success)."""
        try:
            partials = self._partials_fd(create=False)
        except JobFailure:
            return  # .partial itself is a symlink: nothing is deleted through it
        if partials is None:
            return
        try:
            try:
                shutil.rmtree(self.job_id, dir_fd=partials)
            except FileNotFoundError:
                pass
            except OSError:
                # rmtree refuses a symlink planted in the directory's place: remove the link itself.
                if stat.S_ISLNK(os.lstat(self.job_id, dir_fd=partials).st_mode):
                    os.unlink(self.job_id, dir_fd=partials)
                else:
                    raise
            with_missing_ok(os.unlink, f"{self.job_id}.json", dir_fd=partials)
        finally:
            os.close(partials)


def quarantine(source: str, quarantine_dir: Path, name: str, reason: dict[str, object]) -> str:
    """Move the directory `source` to `<quarantine>/<name>/` with a reason.json: evidence is
    never deleted (J3). Across filesystems this is a copy then a delete."""
    quarantine_dir.mkdir(parents=True, exist_ok=True)
    destination = os.path.join(quarantine_dir, name)
    suffix = 1
    while os.path.lexists(destination):
        suffix += 1
        destination = os.path.join(quarantine_dir, f"{name}.{suffix}")
    shutil.move(source, destination)
    fd = os.open(destination, O_DIR_NOFOLLOW)
    try:
        taken = os.path.lexists(os.path.join(destination, "reason.json"))  # a repo file of that name stays
        write_json_at(fd, "modelforge-reason.json" if taken else "reason.json", reason)
    finally:
        os.close(fd)
    return destination


def storage_failure(error: OSError, container_path: str) -> JobFailure:
    """A filesystem error while writing, as J1's codes (never a fall back to another path)."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return JobFailure(STORAGE_CAPACITY_GUARD, f"{container_path} ran out of space", retryable=False)
    reason = error.strerror or type(error).__name__
    return JobFailure(STORAGE_ROOT_UNAVAILABLE, f"{container_path}: {reason}", retryable=False)


class _VerificationFailed(Exception):
    """A fetched file whose hash or size is not what the Hub recorded."""

    def __init__(self, remote: RemoteFile, actual_digest: str, actual_size: int) -> None:
        super().__init__(remote.path)
        self.remote, self.actual_digest, self.actual_size = remote, actual_digest, actual_size


class _TransferBroken(Exception):
    """A GET that broke off; `progressed` says whether it wrote a byte first (then it resumes at once)."""

    def __init__(self, failure: JobFailure, progressed: bool) -> None:
        super().__init__(failure.message)
        self.failure, self.progressed = failure, progressed


@dataclass
class _FileState:
    """One file being fetched: its running hash and how many bytes are on disk."""

    hasher: object
    have: int = 0
    restarts: int = 0


class Acquisition:
    """One attempt of an artifact.acquire.v1 job, step by step (J1, J3)."""

    def __init__(
        self,
        request: AcquireRequest,
        hub: HubClient,
        root: str,
        quarantine_dir: Path,
        *,
        job_id: str,
        attempt: int,
        control: JobControl,
        on_progress: Callable[[Progress], None],
    ) -> None:
        self.request, self.hub, self.root, self.quarantine_dir = request, hub, root, quarantine_dir
        self.job_id, self.attempt, self.control, self.on_progress = job_id, attempt, control, on_progress
        self.partial = PartialDir(root, job_id)
        self.commit = ""
        self.progress = Progress()
        self.written_since_check = 0

    def run(self) -> dict[str, object]:
        """Resolve, list, check capacity, fetch and verify every file, then rename into place."""
        request = self.request
        self.partial.refuse_links()
        state = self.partial.read_state()
        same_job = all(state.get(key) == getattr(request, key) for key in ("repo_id", "repo_type", "revision"))
        recorded = state.get("commit") if same_job else None
        # A resumed attempt keeps the commit its first byte was fetched at (J3: never mixed).
        revision = recorded if isinstance(recorded, str) and COMMIT_PATTERN.fullmatch(recorded) else request.revision
        self.commit = self.hub.resolve_commit(request, revision)
        files = self.hub.list_files(request, self.commit)
        total = sum(remote.size for remote in files)
        self.report(Progress(0, total, 0, len(files)))
        final_parts = request.final_parts(self.commit)
        if self.already_present(final_parts, files):
            self.partial.remove()
            return self.result(files)
        have = self.partial.existing_sizes(files)
        self.check_capacity(total - sum(have.values()))
        self.partial.create(
            {
                "repo_id": request.repo_id,
                "repo_type": request.repo_type,
                "revision": request.revision,
                "commit": self.commit,
                "attempt": self.attempt,
            }
        )
        for remote in files:
            self.control.check()
            self.fetch(remote)
            self.report(replace(self.progress, files_done=self.progress.files_done + 1))
            log.info(
                "job %s: %s verified (%d bytes, %d/%d)",
                self.job_id,
                remote.path,
                remote.size,
                self.progress.files_done,
                len(files),
            )
        self.control.check()
        self.partial.prune({remote.path for remote in files})
        self.partial.write_manifest(self.manifest(files))
        if not self.partial.move_into_place(final_parts) and not self.already_present(final_parts, files):
            raise JobFailure(STORAGE_ROOT_UNAVAILABLE, "another directory took the artifact's place", retryable=True)
        self.partial.remove()  # only left when another attempt won the rename
        return self.result(files)

    def report(self, progress: Progress) -> None:
        """Keep the progress and pass every change on: the caller decides how often to send it."""
        self.progress = progress
        self.on_progress(progress)

    def free_bytes(self) -> int:
        """Free bytes on the root's filesystem for an unprivileged writer."""
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def check_capacity(self, still_to_write: int) -> None:
        """J1: fail before (and while) writing if the root would be left with less than min_free_bytes."""
        free = self.free_bytes()
        if free - still_to_write < self.request.min_free_bytes:
            raise JobFailure(
                STORAGE_CAPACITY_GUARD,
                f"{self.request.container_path} has {free} bytes free; writing {still_to_write} more would leave "
                f"less than min_free_bytes={self.request.min_free_bytes}. Free space or pick another root",
                retryable=False,
            )

    def already_present(self, final_parts: list[str], files: list[RemoteFile]) -> bool:
        """J3: a verified artifact at this commit (its manifest lists exactly these files and sizes)."""
        final = os.path.join(self.root, *final_parts)
        if not os.path.lexists(final):
            return False
        fd = open_dir_chain(self.partial.root_fd, final_parts, create=False)
        try:
            manifest = read_json_at(fd, MANIFEST_NAME) or {}
        finally:
            os.close(fd)
        listed = {item.get("path"): item.get("size") for item in manifest.get("files", []) if isinstance(item, dict)}
        expected = {remote.path: remote.size for remote in files}
        if manifest.get("commit") == self.commit and listed == expected and self.sizes_on_disk(final, expected):
            log.info(
                "job %s: %s is already here, verified at %s; nothing to fetch",
                self.job_id,
                self.request.repo_id,
                self.commit,
            )
            return True
        moved = quarantine(
            final,
            self.quarantine_dir,
            f"{self.job_id}-{self.attempt}-existing",
            {**self.reason_base(), "reason": "a directory at the artifact's place did not match the tree"},
        )
        log.warning("job %s: %s did not match the tree at %s; moved to %s", self.job_id, final, self.commit, moved)
        return False

    @staticmethod
    def sizes_on_disk(final: str, expected: dict[str, int]) -> bool:
        """Every listed file is a regular file of the listed size (no symlink)."""
        for path, size in expected.items():
            try:
                info = os.lstat(os.path.join(final, path))
            except OSError:
                return False
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                return False
        return True

    def fetch(self, remote: RemoteFile) -> None:
        """One file: hash what an earlier attempt wrote, fetch the rest with Range, verify."""
        fd = self.partial.open_file(remote.path)
        try:
            state = _FileState(remote.new_hash(), 0)
            self.hash_existing(fd, remote, state)
            retries = 0
            while state.have < remote.size:
                self.control.check()
                try:
                    self.transfer(fd, remote, state)
                except _TransferBroken as broken:
                    if not broken.progressed or retries >= TRANSFER_RETRIES:
                        raise broken.failure from None
                    retries += 1
                    log.warning("job %s: %s; resuming at byte %d", self.job_id, broken.failure.message, state.have)
                if state.have > remote.size:
                    break
            digest = state.hasher.hexdigest()
            if state.have != remote.size or digest != remote.digest:
                if state.have != remote.size and remote.algorithm == "git-sha1":
                    digest = self.git_blob_id(fd, state.have)
                raise _VerificationFailed(remote, digest, state.have)
            os.fsync(fd)
        except _VerificationFailed as failed:
            os.close(fd)
            fd = -1
            raise self.quarantine_attempt(failed) from None
        finally:
            if fd >= 0:
                os.close(fd)

    def hash_existing(self, fd: int, remote: RemoteFile, state: _FileState) -> None:
        """Hash the bytes an earlier attempt wrote, so only the rest is fetched (J3 resume)."""
        size = os.fstat(fd).st_size
        if size > remote.size:
            os.ftruncate(fd, 0)
            size = 0
        while state.have < size:
            self.control.check()
            chunk = os.pread(fd, min(DOWNLOAD_CHUNK_BYTES, size - state.have), state.have)
            if not chunk:
                break
            state.hasher.update(chunk)
            state.have += len(chunk)
        self.report(replace(self.progress, bytes_done=self.progress.bytes_done + state.have))

    @staticmethod
    def git_blob_id(fd: int, size: int) -> str:
        """The git blob id of what is really on disk (for reason.json when the size is wrong)."""
        hasher = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
        offset = 0
        while offset < size:
            chunk = os.pread(fd, min(DOWNLOAD_CHUNK_BYTES, size - offset), offset)
            if not chunk:
                break
            hasher.update(chunk)
            offset += len(chunk)
        return hasher.hexdigest()

    def restart(self, fd: int, remote: RemoteFile, state: _FileState) -> None:
        """Throw the file's bytes away and start it again (the server ignored or refused the Range)."""
        state.restarts += 1
        if state.restarts > 2:
            raise JobFailure(HUB_UNAVAILABLE, f"the Hub kept refusing a resume of {remote.path}", retryable=True)
        self.report(replace(self.progress, bytes_done=self.progress.bytes_done - state.have))
        os.ftruncate(fd, 0)
        state.hasher, state.have = remote.new_hash(), 0

    def transfer(self, fd: int, remote: RemoteFile, state: _FileState) -> None:
        """One GET from `state.have` on, written and hashed chunk by chunk."""
        requests = self.hub.requests
        started_at = state.have
        try:
            response = self.hub.open_file(self.request, self.commit, remote.path, state.have)
        except requests.exceptions.RequestException as error:
            raise _TransferBroken(self.network_failure(error, remote, "GET"), progressed=False) from None
        with response:
            if response.status_code == 416 and state.have:
                self.restart(fd, remote, state)
                return
            failure = self.hub.file_failure(response, remote.path)
            if failure is not None:
                raise failure
            if state.have and (response.status_code == 200 or not self.range_starts_at(response, state.have)):
                self.restart(fd, remote, state)
                if response.status_code != 200:
                    return
            while state.have <= remote.size:
                chunk = self.next_chunk(response, remote, state, started_at)
                if not chunk:
                    break
                self.control.check()
                self.write(fd, chunk, state)
        if state.have < remote.size:
            message = f"{describe_url('GET', response.url)} ended after {state.have} of {remote.size} bytes"
            raise _TransferBroken(
                JobFailure(HUB_UNAVAILABLE, message, retryable=True), progressed=state.have > started_at
            )

    def next_chunk(self, response, remote: RemoteFile, state: _FileState, started_at: int) -> bytes:
        """Whatever bytes have arrived (read1): a connection that drops loses none it delivered."""
        raw = response.raw
        read = getattr(raw, "read1", None) or raw.read  # urllib3 < 2 has no read1
        try:
            return read(DOWNLOAD_CHUNK_BYTES, decode_content=False)
        except self.hub.body_errors as error:
            failure = self.network_failure(error, remote, describe_url("GET", response.url))
            raise _TransferBroken(failure, progressed=state.have > started_at) from None

    @staticmethod
    def range_starts_at(response, offset: int) -> bool:
        """Whether a 206 answers the Range we asked for."""
        match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", "").strip())
        return match is not None and int(match.group(1)) == offset

    def network_failure(self, error: Exception, remote: RemoteFile, where: str) -> JobFailure:
        """A broken transfer as HUB_UNAVAILABLE, naming a stall apart from a dropped connection."""
        if self.hub.is_stall(error):
            message = f"{where} for {remote.path} stalled: no byte for {self.hub.hub.stall_seconds:g}s"
        else:
            message = f"{type(error).__name__} on {where} for {remote.path}"
        return JobFailure(HUB_UNAVAILABLE, message, retryable=True)

    def write(self, fd: int, chunk: bytes, state: _FileState) -> None:
        """Write, hash and count one chunk; re-check capacity every few MiB (J1)."""
        view = memoryview(chunk)
        while view:
            try:
                written = os.pwrite(fd, view, state.have)
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise JobFailure(
                        STORAGE_CAPACITY_GUARD,
                        f"{self.request.container_path} ran out of space while writing",
                        retryable=False,
                    ) from None
                raise
            state.hasher.update(view[:written])
            state.have += written
            view = view[written:]
            self.written_since_check += written
            self.report(replace(self.progress, bytes_done=self.progress.bytes_done + written))
        if self.written_since_check >= CAPACITY_CHECK_BYTES:
            self.written_since_check = 0
            self.check_capacity(self.progress.bytes_total - self.progress.bytes_done)

    def reason_base(self) -> dict[str, object]:
        """What every reason.json says about the job."""
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "repo_id": self.request.repo_id,
            "repo_type": self.request.repo_type,
            "revision": self.request.revision,
            "commit": self.commit,
            "at": rfc3339_now(),
        }

    def quarantine_attempt(self, failed: _VerificationFailed) -> JobFailure:
        """J3: the attempt's files go to quarantine with the evidence; the next attempt starts clean."""
        remote = failed.remote
        reason = {
            **self.reason_base(),
            "reason": "a file did not match the hash or size the Hub recorded",
            "file": remote.path,
            f"expected_{remote.hash_name}": remote.digest,
            f"actual_{remote.hash_name}": failed.actual_digest,
            "expected_size": remote.size,
            "actual_size": failed.actual_size,
        }
        self.partial.close()
        try:
            moved = quarantine(self.partial.path, self.quarantine_dir, f"{self.job_id}-{self.attempt}", reason)
        except OSError as error:
            # The evidence is never deleted (J3): the files stay where they are, the partial stays
            # closed (acquire_artifact removes nothing through a closed one), and the job fails for
            # good, so no later attempt resumes from a file known to be corrupt.
            failure = storage_failure(error, self.request.container_path)
            kept = self.partial.path if os.path.lexists(self.partial.path) else str(self.quarantine_dir)
            raise JobFailure(
                failure.code,
                f"{remote.path} did not match the hash or size the Hub recorded, and moving the attempt's "
                f"files to quarantine failed ({failure.message}); they are kept in {kept}",
                retryable=False,
            ) from None
        self.partial = PartialDir(self.root, self.job_id)
        self.partial.remove()  # the state file: the next attempt resolves the revision afresh
        return JobFailure(
            ARTIFACT_VERIFICATION_FAILED,
            f"{remote.path}: expected {remote.algorithm} {remote.digest} and {remote.size} bytes, got "
            f"{failed.actual_digest} and {failed.actual_size} bytes; the attempt's files are in {moved}",
            retryable=True,
        )

    def manifest(self, files: list[RemoteFile]) -> dict[str, object]:
        """modelforge-manifest.json: what was fetched, at which commit, with the hashes it matched."""
        return {
            "manifest_version": 1,
            "repo_id": self.request.repo_id,
            "repo_type": self.request.repo_type,
            "revision": self.request.revision,
            "commit": self.commit,
            "files": [remote.manifest_entry() for remote in files],
            "total_bytes": sum(remote.size for remote in files),
            "job_id": self.job_id,
            "acquired_at": rfc3339_now(),
        }

    def result(self, files: list[RemoteFile]) -> dict[str, object]:
        """The job's result (the control plane adds artifact_id and host_path)."""
        total = sum(remote.size for remote in files)
        self.report(Progress(total, total, len(files), len(files)))
        return {
            "commit": self.commit,
            "container_path": os.path.join(self.request.container_path, *self.request.final_parts(self.commit)),
            "files": len(files),
            "total_bytes": total,
        }


def acquire_artifact(
    params: dict[str, object],
    hub: HubSettings,
    *,
    artifact_dir: Path,
    quarantine_dir: Path,
    job_id: str,
    attempt: int,
    control: JobControl | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> dict[str, object]:
    """Run one attempt of an artifact.acquire.v1 job (J3) and return its result
    (`commit`, `container_path`, `files`, `total_bytes`).

    Raises JobFailure (code, message, retryable) or JobAbandoned. A failure that will not be
    retried (cancel included) deletes the partial directory; a retryable one keeps it, so the
    next attempt resumes.
    """
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise JobFailure(JOB_PARAMS_INVALID, "the job id cannot name a directory", retryable=False)
    request = AcquireRequest.from_params(params)
    problem = root_problem(request.container_path, artifact_dir)
    if problem is not None:
        raise JobFailure(STORAGE_ROOT_UNAVAILABLE, problem, retryable=False)
    root = os.path.realpath(request.container_path)
    if not writable_dir(root):
        raise JobFailure(STORAGE_ROOT_UNAVAILABLE, f"{request.container_path} is not writable", retryable=False)
    client = HubClient(hub)
    try:
        acquisition = Acquisition(
            request,
            client,
            root,
            quarantine_dir,
            job_id=job_id,
            attempt=attempt,
            control=control or JobControl(),
            on_progress=on_progress or (lambda progress: None),
        )
    except OSError as error:  # the root vanished since it was checked
        client.close()
        raise storage_failure(error, request.container_path) from None
    try:
        return acquisition.run()
    except JobFailure as failure:
        # A closed partial was handed to quarantine: whatever is left of it is evidence, never deleted.
        if not failure.retryable and not acquisition.partial.closed:
            acquisition.partial.remove()
        raise
    except OSError as error:
        failure = storage_failure(error, request.container_path)
        if not acquisition.partial.closed:
            acquisition.partial.remove()
        raise failure from None
    finally:
        acquisition.partial.close()
        client.close()


def run_acquire_job(
    job: Job, config: Config, control: JobControl, on_progress: Callable[[Progress], None]
) -> dict[str, object]:
    """The artifact.acquire.v1 handler: the job's params with this agent's Hub settings and directories."""
    return acquire_artifact(
        job.params,
        config.hub,
        artifact_dir=config.data_dirs["artifacts"],
        quarantine_dir=config.data_dirs["quarantine"],
        job_id=job.id,
        attempt=job.attempt,
        control=control,
        on_progress=on_progress,
    )


def acquire_summary(result: dict[str, object]) -> str:
    """`3 files, 1234 bytes at /data/artifacts/…` for the success log line."""
    return f"{result.get('files')} files, {result.get('total_bytes')} bytes at {result.get('container_path')}"


JOB_HANDLERS[ACQUIRE_JOB_TYPE] = run_acquire_job
JOB_LIBRARIES[ACQUIRE_JOB_TYPE] = ("huggingface_hub",)
JOB_SUMMARIES[ACQUIRE_JOB_TYPE] = acquire_summary


# --------------------------------------------------------------------------- runtime worker

WORKER_JOB_STATES = ("running", "succeeded", "failed", "cancelled")
ERROR_CODE_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


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
    connection per request, JSON both ways, a bounded reply."""

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
        self.said: tuple[object, ...] | None = None

    def inventory_fields(self) -> dict[str, object]:
        """`runtime_worker` (null unless one answers) and `runtime_worker_problem` (null while a
        compatible one answers, else one line: why not)."""
        return {"runtime_worker": self.facts, "runtime_worker_problem": self.problem}

    def probe(self) -> bool:
        """Ask the worker who it is; True when what the inventory says of it changed."""
        before = (self.compatible, self.inventory_fields())
        try:
            facts = worker_facts(self.client.info())
        except WorkerError as error:
            self.forget(error.reason)
        else:
            self.take(facts)
        return (self.compatible, self.inventory_fields()) != before

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
        self.facts, self.compatible, self.problem = None, False, reason[:500]
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
            raise JobFailure(code, message, retryable=error.get("retryable") is True)
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
        return JobFailure(error.code, error.message or error.reason, retryable=error.retryable or error.status >= 500)


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


JOB_HANDLERS[RUNTIME_BENCHMARK_JOB_TYPE] = run_runtime_job
JOB_HANDLERS[RUNTIME_GENERATE_JOB_TYPE] = run_runtime_job
JOB_SUMMARIES[RUNTIME_BENCHMARK_JOB_TYPE] = benchmark_summary
JOB_SUMMARIES[RUNTIME_GENERATE_JOB_TYPE] = generate_summary


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
        self.capabilities = advertised_capabilities(self.worker.compatible)
        self.storage_roots = StorageRoots(config.data_dirs["artifacts"])
        self.jobs = JobsClient(self.client)
        self.jobs_waiting = 0
        self.claim_due = True  # J2: one claim right after start-up, in case a job waits already
        self.runner: JobRunner | None = None

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
        self.storage_problems = {
            name: str(facts["unknown_reason"])
            for name, facts in inventory["storage"].items()
            if "unknown_reason" in facts
        }
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
                    "%s: inventory refused; heartbeats continue, retrying in %gs",
                    error.describe(),
                    INVENTORY_CHECK_SECONDS,
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
        self.capabilities = advertised_capabilities(self.worker.compatible)
        self.inventory_checked_at = None

    def heartbeat(self) -> None:
        """One heartbeat with health, fresh telemetry and, when due, what the agent sees of its
        storage roots (J1); the reply may carry a new root list and the number of waiting jobs."""
        samples, failures = self.telemetry()
        now = time.monotonic()
        roots = self.storage_roots.heartbeat_fields(now)
        body = {**self.versions(), "health": self.health(failures), "telemetry": samples, **roots}
        reply = self.client.post("/api/v1/agent/heartbeat", body)
        self.storage_roots.delivered(roots, now)
        self.storage_roots.take_reply(reply)
        self.take_interval(reply)
        waiting = reply.get("jobs_waiting")
        self.jobs_waiting = waiting if isinstance(waiting, int) and not isinstance(waiting, bool) else 0

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
            self.runner, self.claim_due = None, True
        if not self.capabilities or not (self.claim_due or self.jobs_waiting > 0):
            return
        self.claim_due = False
        try:
            reply = self.jobs.claim(self.capabilities)
        except PublishError as error:
            if error.status is None or error.status >= 500:
                self.claim_due = True
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
        """Enrol if needed, then publish on a drift-free monotonic schedule until stopped."""
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
            if once:
                return EXIT_OK
            self.maybe_claim()
            # Drift-free: the next beat is scheduled from the last one, not from "now".
            next_beat += self.interval
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
    parser.add_argument("--preflight", action="store_true", help="run the NVIDIA checks, print a report, exit 0 or 3")
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
        # N3: checks only — no network, no state.
        print(preflight_report(result))
        return EXIT_OK if result.ok else EXIT_PREFLIGHT
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
    sys.exit(main())
