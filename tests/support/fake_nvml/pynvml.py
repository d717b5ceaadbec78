"""A stand-in for nvidia-ml-py's `pynvml`, for machines without an NVIDIA GPU (tests only).

It raises the REAL error classes of nvidia-ml-py (loaded from site-packages), so the agent's
`except pynvml.NVMLError` paths run exactly as against a real driver. The scenario comes from
the JSON in FAKE_NVML_SCENARIO, read at import:

    {"init_error": null | "NVMLError_LibraryNotFound", "driver": "550.54.14", "cuda": 12040,
     "gpus": [{"uuid": "GPU-…", "name": "…", "memory_total": 17171480576, "memory_used": 1,
               "utilization": 12, "temperature": 40, "power_mw": 85000,
               "errors": {"utilization": "NVMLError_NotSupported"}, "lost_after_samples": 3}]}
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from types import SimpleNamespace

_here = os.path.dirname(os.path.abspath(__file__))
_found = importlib.machinery.PathFinder.find_spec(
    "pynvml", [path for path in sys.path if os.path.abspath(path or ".") != _here]
)
# Load the real module under another name: it attaches its NVMLError_* classes to
# sys.modules[__name__], which must be itself, not this fake.
_spec = importlib.util.spec_from_file_location("_real_pynvml", _found.origin)
_real = importlib.util.module_from_spec(_spec)
sys.modules["_real_pynvml"] = _real
_spec.loader.exec_module(_real)

NVMLError = _real.NVMLError
for _name in dir(_real):
    if _name.startswith("NVMLError_"):
        globals()[_name] = getattr(_real, _name)
NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU

SCENARIO = json.loads(os.environ.get("FAKE_NVML_SCENARIO") or "{}")
_initialised = False
_samples: dict[int, int] = {}


def _raise(name: str):
    raise getattr(_real, name)()


def _gpu(handle):
    gpu = SCENARIO["gpus"][handle]
    lost_after = gpu.get("lost_after_samples")
    if lost_after is not None and _samples.get(handle, 0) > lost_after:
        _raise("NVMLError_GpuIsLost")
    return gpu


def _metric(handle, name: str):
    gpu = _gpu(handle)
    error = gpu.get("errors", {}).get(name)
    if error:
        _raise(error)
    return gpu


def nvmlInit():
    global _initialised
    if SCENARIO.get("init_error"):
        _raise(SCENARIO["init_error"])
    _initialised = True


def nvmlShutdown():
    global _initialised
    _initialised = False


def _check():
    if not _initialised:
        _raise("NVMLError_Uninitialized")


def nvmlSystemGetDriverVersion():
    _check()
    return SCENARIO.get("driver", "550.54.14")


def nvmlSystemGetCudaDriverVersion():
    _check()
    return SCENARIO.get("cuda", 12040)


def nvmlDeviceGetCount():
    _check()
    if SCENARIO.get("count_error"):
        _raise(SCENARIO["count_error"])
    return len(SCENARIO.get("gpus", []))


def nvmlDeviceGetHandleByIndex(index):
    _check()
    _gpu(index)
    return index


def nvmlDeviceGetUUID(handle):
    return _metric(handle, "uuid")["uuid"]


def nvmlDeviceGetName(handle):
    return _metric(handle, "name")["name"]


def nvmlDeviceGetMemoryInfo(handle):
    gpu = _metric(handle, "memory")
    return SimpleNamespace(
        total=gpu["memory_total"], used=gpu["memory_used"], free=gpu["memory_total"] - gpu["memory_used"]
    )


def nvmlDeviceGetPciInfo(handle):
    return SimpleNamespace(busId=_metric(handle, "pci")["pci_bus_id"].encode())


def nvmlDeviceGetUtilizationRates(handle):
    _samples[handle] = _samples.get(handle, 0) + 1
    return SimpleNamespace(gpu=_metric(handle, "utilization")["utilization"], memory=0)


def nvmlDeviceGetTemperature(handle, sensor):
    assert sensor == NVML_TEMPERATURE_GPU
    return _metric(handle, "temperature")["temperature"]


def nvmlDeviceGetPowerUsage(handle):
    return _metric(handle, "power")["power_mw"]
