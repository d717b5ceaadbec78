"""Agent internals: NVIDIA preflight with a fake pynvml, cgroups, state, config, backoff (N1–N4, I1–I3, A4)."""

from __future__ import annotations

import importlib
import json
import logging
import stat
import sys
import threading
from pathlib import Path

import pytest

import modelforge_node_agent as agent
from tests.support.agent import FAKE_NVML_DIR

FAKE_DIR = FAKE_NVML_DIR
GPU_A = {
    "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001",
    "name": "NVIDIA GeForce RTX 4080",
    "memory_total": 17_171_480_576,
    "memory_used": 1_048_576_000,
    "utilization": 12,
    "temperature": 41,
    "power_mw": 85_250,
    "pci_bus_id": "00000000:01:00.0",
}
GPU_B = {**GPU_A, "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000002", "pci_bus_id": "00000000:02:00.0"}


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install the fake pynvml with a scenario; returns a function that takes the scenario."""

    def install(scenario: dict) -> object:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", json.dumps(scenario))
        monkeypatch.syspath_prepend(FAKE_DIR)
        monkeypatch.delitem(sys.modules, "pynvml", raising=False)
        module = importlib.import_module("pynvml")
        assert module.__file__.startswith(FAKE_DIR)
        return module

    yield install
    sys.modules.pop("pynvml", None)


def preflight(mode="nvidia", env=None, root="/nonexistent-root"):
    nvml = agent.Nvml()
    result = agent.run_preflight(mode, nvml, env or {}, root)
    return result, nvml


def test_cpu_mode_never_loads_nvml(monkeypatch):
    def refuse(name):
        raise AssertionError(f"cpu mode imported {name}")

    monkeypatch.setattr(agent.importlib, "import_module", refuse)
    result, _ = preflight("cpu")
    assert result.ok and not result.nvidia_required


def test_nvidia_mode_passes_with_readable_gpus(fake_nvml):
    fake_nvml({"gpus": [GPU_A, GPU_B], "driver": "550.54.14", "cuda": 12040})
    result, nvml = preflight("nvidia")
    assert result.ok and result.code is None
    assert [gpu.uuid for gpu in result.gpus] == [GPU_A["uuid"], GPU_B["uuid"]]
    first = result.gpus[0].to_wire()
    assert first["name"] == "NVIDIA GeForce RTX 4080"
    assert first["memory_total_bytes"] == GPU_A["memory_total"]
    assert (first["driver_version"], first["cuda_driver_version"], first["pci_bus_id"]) == (
        "550.54.14",
        "12.4",
        "00000000:01:00.0",
    )
    sample = result.samples[0]
    assert (sample["utilization_gpu_percent"], sample["memory_used_bytes"]) == (12.0, 1_048_576_000)
    assert (sample["temperature_c"], sample["power_w"]) == (41.0, 85.25)
    report = agent.preflight_report(result)
    assert "PASS" in report and GPU_A["uuid"] in report
    nvml.shutdown()


@pytest.mark.parametrize("error", ["NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NoPermission"])
def test_nvml_that_cannot_start_is_unavailable(fake_nvml, error):
    fake_nvml({"init_error": error, "gpus": [GPU_A]})
    result, _ = preflight("nvidia")
    assert result.code == agent.NVIDIA_NVML_UNAVAILABLE
    assert error in result.hint and "NVIDIA Container Toolkit" in result.hint


def test_missing_pynvml_module_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    result, _ = preflight("nvidia")
    assert result.code == agent.NVIDIA_NVML_UNAVAILABLE and "nvidia-ml-py" in result.hint


def test_no_gpu_is_device_not_found(fake_nvml):
    fake_nvml({"gpus": []})
    result, _ = preflight("nvidia")
    assert result.code == agent.NVIDIA_DEVICE_NOT_FOUND and result.gpus == []


def test_listing_error_is_device_not_found(fake_nvml):
    fake_nvml({"gpus": [GPU_A], "count_error": "NVMLError_Unknown"})
    result, _ = preflight("nvidia")
    assert result.code == agent.NVIDIA_DEVICE_NOT_FOUND and "NVMLError_Unknown" in result.hint


@pytest.mark.parametrize("metric", ["utilization", "memory"])
def test_unreadable_required_telemetry_fails_the_preflight(fake_nvml, metric):
    fake_nvml({"gpus": [GPU_A, {**GPU_B, "errors": {metric: "NVMLError_NotSupported"}}]})
    result, _ = preflight("nvidia")
    assert result.code == agent.NVIDIA_TELEMETRY_UNAVAILABLE
    assert GPU_B["uuid"] in result.hint and "NVMLError_NotSupported" in result.hint


def test_unsupported_temperature_and_power_are_null_not_invented(fake_nvml):
    errors = {"temperature": "NVMLError_NotSupported", "power": "NVMLError_NotSupported"}
    fake_nvml({"gpus": [{**GPU_A, "errors": errors}]})
    result, _ = preflight("nvidia")
    assert result.ok
    (sample,) = result.samples
    assert sample["temperature_c"] is None and sample["power_w"] is None
    assert sample["utilization_gpu_percent"] == 12.0


@pytest.mark.parametrize(
    ("devices", "visible", "required"),
    [
        (["nvidia0"], None, True),
        (["nvidiactl"], None, True),
        ([], "all", True),
        ([], "GPU-1234", True),
        ([], "void", False),
        ([], "none", False),
        ([], "", False),
        ([], None, False),
    ],
)
def test_auto_mode_requires_nvml_only_when_nvidia_hardware_is_seen(tmp_path, fake_nvml, devices, visible, required):
    (tmp_path / "dev").mkdir()
    for device in devices:
        (tmp_path / "dev" / device).touch()
    env = {} if visible is None else {"NVIDIA_VISIBLE_DEVICES": visible}
    fake_nvml({"init_error": "NVMLError_LibraryNotFound"})
    result, _ = preflight("auto", env, str(tmp_path))
    assert result.nvidia_required is required
    assert result.ok is (not required)
    if required:
        assert result.code == agent.NVIDIA_NVML_UNAVAILABLE


def make_agent(tmp_path, gpus, fake_nvml, scenario):
    fake_nvml(scenario)
    config = agent.load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9",
            "MODELFORGE_AGENT_STATE_DIR": str(tmp_path / "state"),
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia",
        }
    )
    result, nvml = preflight("nvidia")
    assert result.ok, result.hint
    return agent.Agent(config, nvml, result, stop=None)


def test_one_gpu_lost_mid_run_becomes_an_error_record_not_a_crash(tmp_path, fake_nvml):
    scenario = {"gpus": [GPU_A, {**GPU_B, "lost_after_samples": 2}]}
    running = make_agent(tmp_path, None, fake_nvml, scenario)
    samples, failures = running.telemetry()  # second sample of GPU B: still there
    assert failures == {}
    samples, failures = running.telemetry()  # third: lost
    by_uuid = {sample["gpu_uuid"]: sample for sample in samples}
    assert by_uuid[GPU_A["uuid"]]["utilization_gpu_percent"] == 12.0
    lost = by_uuid[GPU_B["uuid"]]
    assert all(lost[metric] is None for metric in agent.TELEMETRY_METRICS)
    assert set(failures) == {GPU_B["uuid"]}
    health = running.health(failures)
    assert health["status"] == "degraded" and "NVMLError_GpuIsLost" in health["detail"]


def test_every_gpu_lost_is_failing(tmp_path, fake_nvml):
    running = make_agent(tmp_path, None, fake_nvml, {"gpus": [{**GPU_A, "lost_after_samples": 1}]})
    _, failures = running.telemetry()
    assert running.health(failures)["status"] == "failing"


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("files", "cpus"),
    [
        ({"sys/fs/cgroup/cpu.max": "150000 100000\n"}, 1.5),
        ({"sys/fs/cgroup/cpu.max": "max 100000\n"}, None),
        ({"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "200000", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, 2.0),
        (
            {
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
            },
            0.5,
        ),
        ({"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, None),
        ({}, None),
    ],
)
def test_cgroup_cpu_limits(tmp_path, files, cpus):
    for relative, text in files.items():
        write(tmp_path, relative, text)
    assert agent.cgroup_cpu_limit(str(tmp_path)) == cpus


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"sys/fs/cgroup/memory.max": "4294967296\n"}, 4 * 2**30),
        ({"sys/fs/cgroup/memory.max": "max\n"}, None),
        ({"sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648"}, 2 * 2**30),
        ({"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}, None),
        ({}, None),
    ],
)
def test_cgroup_memory_limits(tmp_path, files, limit):
    for relative, text in files.items():
        write(tmp_path, relative, text)
    assert agent.cgroup_memory_limit(str(tmp_path)) == limit


def test_inventory_honours_container_limits_and_names_unknowns(tmp_path):
    write(tmp_path, "sys/fs/cgroup/cpu.max", "100000 100000")
    write(tmp_path, "sys/fs/cgroup/memory.max", str(2 * 2**30))
    write(tmp_path, "proc/meminfo", "MemTotal:       65536000 kB\n")
    write(tmp_path, "etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    config = agent.load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan",
            "MODELFORGE_AGENT_HOSTNAME": "tower",
            "MODELFORGE_AGENT_STATE_DIR": str(tmp_path),
            "MODELFORGE_AGENT_QUARANTINE_DIR": str(tmp_path / "missing"),
        }
    )
    facts = agent.collect_inventory(config, [], root=str(tmp_path))
    assert facts["hostname"] == "tower"
    assert facts["cpu_count"] == 1.0 and facts["cpu_limited_by_cgroup"] is True
    assert facts["memory_total_bytes"] == 2 * 2**30 and facts["memory_limited_by_cgroup"] is True
    assert facts["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert facts["cpu_model"] is None and "cpu_model" in facts["unknown_reasons"]
    assert facts["storage"]["state"]["total_bytes"] > 0
    assert facts["storage"]["quarantine"]["total_bytes"] is None
    assert facts["storage"]["quarantine"]["unknown_reason"]
    assert set(facts["storage"]) == {"state", "hf-cache", "artifacts", "quarantine"}


def test_node_id_is_created_once_and_kept(tmp_path):
    state = agent.State(tmp_path)
    first = agent.State(tmp_path).node_id()
    assert state.node_id() == first
    assert stat.S_IMODE((tmp_path / "node-id").stat().st_mode) == 0o600
    state.store_credential("mfn_secret")
    assert state.credential() == "mfn_secret"
    assert stat.S_IMODE((tmp_path / "node-credential").stat().st_mode) == 0o600
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no temp files left


def test_a_corrupt_node_id_is_a_configuration_error(tmp_path):
    (tmp_path / "node-id").write_text("not-a-uuid")
    with pytest.raises(agent.ConfigError, match="node-id"):
        agent.State(tmp_path).node_id()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "MODELFORGE_AGENT_CONTROL_PLANE_URL is not set"),
        ({"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://modelforge.example.internal:8000"}, "placeholder"),
        ({"MODELFORGE_AGENT_CONTROL_PLANE_URL": "cp.lan"}, "http\\(s\\) URL"),
        (
            {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_AGENT_ACCELERATOR_MODE": "gpu"},
            "ACCELERATOR_MODE",
        ),
        (
            {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_AGENT_TLS_VERIFY": "maybe"},
            "TLS_VERIFY",
        ),
        (
            {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_AGENT_IDENTITY_MODE": "machine-id"},
            "IDENTITY_MODE",
        ),
        (
            {
                "MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan",
                "MODELFORGE_AGENT_CA_CERT_PATH": "/nonexistent/ca.pem",
            },
            "CA_CERT_PATH",
        ),
        (
            {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_AGENT_WORKER_SOCKET": "worker.sock"},
            "MODELFORGE_AGENT_WORKER_SOCKET must be an absolute path",
        ),
        (
            {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_AGENT_WORKER_SOCKET": "/" + "s" * 107},
            "MODELFORGE_AGENT_WORKER_SOCKET is longer than a Unix socket path",
        ),
    ],
)
def test_configuration_refusals_name_the_variable(env, named):
    with pytest.raises(agent.ConfigError, match=named):
        agent.load_config(env)


def test_unwritable_state_dir_is_a_configuration_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = agent.load_config(
        {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_AGENT_STATE_DIR": str(blocker / "state")}
    )
    with pytest.raises(agent.ConfigError, match="MODELFORGE_AGENT_STATE_DIR"):
        agent.ensure_state_dir(config)


def test_backoff_doubles_from_one_second_and_caps_at_sixteen():
    backoff = agent.Backoff()
    assert [backoff.next_delay() for _ in range(7)] == [1, 2, 4, 8, 16, 16, 16]
    for _ in range(5000):  # days of outage at 16 s: no overflow, still 16 s
        assert backoff.next_delay() == 16
    backoff.reset()
    assert backoff.next_delay() == 1
    jittered = [agent.Backoff.jittered(16) for _ in range(500)]
    assert 16 * 0.8 <= min(jittered) < max(jittered) <= 16 * 1.2
    assert backoff.describe() == "1s…16s"


def test_publish_error_lines_never_carry_a_body():
    error = agent.PublishError("POST", "/api/v1/agent/heartbeat", "HTTPError", 401, "CREDENTIAL_REVOKED")
    assert error.describe() == "HTTP 401 CREDENTIAL_REVOKED on POST /api/v1/agent/heartbeat"
    assert agent.PublishError("POST", "/api/v1/agent/heartbeat", "ConnectError").describe() == (
        "ConnectError on POST /api/v1/agent/heartbeat"
    )


def test_an_unreadable_state_file_is_an_error_not_a_new_identity(tmp_path):
    (tmp_path / "node-id").mkdir()  # exists, cannot be read as a file
    with pytest.raises(agent.ConfigError, match="node-id exists but cannot be read"):
        agent.State(tmp_path).node_id()
    assert (tmp_path / "node-id").is_dir()  # nothing replaced it
    (tmp_path / "node-credential").write_bytes(b"\xff\xfe")
    with pytest.raises(agent.ConfigError, match="not UTF-8"):
        agent.State(tmp_path).credential()


def test_publish_error_keeps_the_reply_for_the_agent_but_never_shows_it():
    reply = {"error": {"code": "ENROLLMENT_TOKEN_CONSUMED", "message": "secret-looking body"}}
    error = agent.PublishError("POST", "/api/v1/agent/enroll", "HTTPError", 409, "ENROLLMENT_TOKEN_CONSUMED", reply)
    assert error.reply is reply
    assert "secret-looking body" not in error.describe() and "secret-looking body" not in str(error)
    assert agent.PublishError("POST", "/api/v1/agent/heartbeat", "ConnectError").reply == {}


def test_a_held_backoff_waits_the_maximum_until_the_next_success():
    backoff = agent.Backoff()
    assert backoff.next_delay() == 1
    backoff.hold_at_max()  # I6: a disabled node checks every 16 s, not 2, 4, 8…
    assert [backoff.next_delay() for _ in range(3)] == [16, 16, 16]
    assert backoff.attempt == 4  # the failures are still counted truly
    backoff.reset()
    assert [backoff.next_delay() for _ in range(3)] == [1, 2, 4]


def cpu_agent(tmp_path) -> agent.Agent:
    """A CPU-only agent holding a stored credential, so it never enrols."""
    config = agent.load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9",
            "MODELFORGE_AGENT_STATE_DIR": str(tmp_path / "state"),
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        }
    )
    agent.ensure_state_dir(config)
    (tmp_path / "state" / "node-credential").write_text("mfn_" + "c" * 43)
    return agent.Agent(config, agent.Nvml(), agent.run_preflight("cpu", agent.Nvml(), {}), threading.Event())


def test_a_disabled_node_checks_every_sixteen_seconds_from_the_first_refusal(tmp_path, caplog, monkeypatch):
    running = cpu_agent(tmp_path)
    waits = []
    running.stop.wait = lambda seconds: waits.append(seconds) or False
    disabled = agent.PublishError("POST", "/api/v1/agent/heartbeat", "HTTPError", 403, "NODE_DISABLED")
    caplog.set_level(logging.INFO, logger="modelforge_node_agent")
    monkeypatch.setattr(agent.log, "propagate", True)
    for _ in range(3):
        running.handle_refusal(disabled)  # I6: not an exit, and no 1, 2, 4 s climb
    assert len(waits) == 3 and all(16 * 0.8 <= wait <= 16 * 1.2 for wait in waits)
    assert caplog.text.count("an operator disabled this node; checking every 16s") == 1


def test_gpu_facts_go_on_the_wire_as_the_six_n4_fields_only(tmp_path, fake_nvml):
    fake_nvml({"gpus": [{**GPU_A, "errors": {"pci": "NVMLError_NotSupported"}}], "driver": "550.54.14", "cuda": 12040})
    result, nvml = preflight("nvidia")
    (gpu,) = result.gpus
    assert gpu == agent.GpuFacts(
        index=0,
        uuid=GPU_A["uuid"],
        name="NVIDIA GeForce RTX 4080",
        memory_total_bytes=17_171_480_576,
        driver_version="550.54.14",
        cuda_driver_version="12.4",
        pci_bus_id=None,  # P3: unreadable is None with a reason, never invented
        unknown_reasons={"pci_bus_id": "NVMLError_NotSupported"},
    )
    wire = {
        "uuid": GPU_A["uuid"],
        "name": "NVIDIA GeForce RTX 4080",
        "memory_total_bytes": 17_171_480_576,
        "driver_version": "550.54.14",
        "cuda_driver_version": "12.4",
        "pci_bus_id": None,
    }
    assert gpu.to_wire() == wire and list(gpu.to_wire()) == list(wire)  # no index, no error records
    config = agent.load_config(
        {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_AGENT_STATE_DIR": str(tmp_path)}
    )
    facts = agent.collect_inventory(config, [gpu], root=str(tmp_path))
    assert facts["gpus"] == [wire]
    assert facts["gpu_unknown_reasons"] == {GPU_A["uuid"]: {"pci_bus_id": "NVMLError_NotSupported"}}
    nvml.shutdown()


@pytest.mark.parametrize(
    "failure",
    [
        agent.PublishError("POST", "/api/v1/agent/inventory", "ConnectError"),
        agent.PublishError("POST", "/api/v1/agent/inventory", "HTTPError", 503),
        agent.PublishError("POST", "/api/v1/agent/inventory", "HTTPError", 403, "NODE_DISABLED"),
    ],
)
def test_an_undelivered_inventory_goes_out_first_when_the_server_is_back(tmp_path, failure):
    running = cpu_agent(tmp_path)
    running.stop.wait = lambda seconds: False
    sent = []

    def post(path, body):
        sent.append(path.rsplit("/", 1)[1])
        if len(sent) == 1:
            raise failure
        return {}

    running.client.post = post
    assert running.run(once=True) == 0
    # Unchanged and only moments later, yet sent again: it never arrived the first time.
    assert sent == ["inventory", "inventory", "heartbeat"]


def test_a_refused_inventory_waits_for_the_next_check_while_heartbeats_go_on(tmp_path):
    running = cpu_agent(tmp_path)
    sent = []

    def post(path, body):
        sent.append(path.rsplit("/", 1)[1])
        if path.endswith("inventory"):
            raise agent.PublishError("POST", path, "HTTPError", 413, "BODY_TOO_LARGE")
        return {}

    running.client.post = post
    running.start()
    for _ in range(3):
        running.publish_once()
    assert sent == ["inventory", "heartbeat", "heartbeat", "heartbeat"]
    running.inventory_checked_at -= agent.INVENTORY_CHECK_SECONDS  # a minute on: the next check
    running.publish_once()
    assert sent[-2:] == ["inventory", "heartbeat"]


@pytest.fixture
def run_main(tmp_path, monkeypatch, capsys):
    """agent.main() in this process with only the given MODELFORGE_AGENT_* settings; returns (code, out, err)."""
    level, propagate = agent.log.level, agent.log.propagate
    monkeypatch.setattr(agent.log, "handlers", [])  # configure_logging() fills a list we throw away
    monkeypatch.setattr(agent.signal, "signal", lambda signum, handler: None)  # keep pytest's handlers
    for name in list(agent.os.environ):
        if name.startswith("MODELFORGE_AGENT_") or name == "NVIDIA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)

    def run(**env: str) -> tuple[int, str, str]:
        settings = {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9",
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_STATE_DIR": str(tmp_path / "state"),
            **env,
        }
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        code = agent.main([])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    yield run
    agent.log.setLevel(level)
    agent.log.propagate = propagate


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MODELFORGE_AGENT_ACCELERATOR_MODE": "tpu"}, "MODELFORGE_AGENT_ACCELERATOR_MODE"),  # load_config
        ({"MODELFORGE_AGENT_STATE_DIR": "/proc/version/state"}, "MODELFORGE_AGENT_STATE_DIR"),  # ensure_state_dir
        ({}, "no MODELFORGE_AGENT_ENROLLMENT_TOKEN"),  # the agent, at enrolment, with nothing to enrol with
    ],
)
def test_every_configuration_error_exits_2_with_one_line(run_main, env, named):
    code, out, err = run_main(**env)
    assert code == agent.EXIT_CONFIG == 2
    *before, line = err.splitlines()
    assert line.startswith("modelforge-node-agent: configuration error: ") and named in line
    # Said once, last; at most the start-up line comes before it (once the agent got that far).
    assert all("starting" in earlier and named not in earlier for earlier in before) and len(before) <= 1
    assert out == ""


def test_a_rate_limited_publication_waits_what_retry_after_says_and_logs_it_once(tmp_path, caplog, monkeypatch):
    running = cpu_agent(tmp_path)
    waits = []
    running.stop.wait = lambda seconds: waits.append(seconds) or False
    sent = []

    def post(path, body):
        sent.append(path.rsplit("/", 1)[1])
        if path.endswith("heartbeat") and sent.count("heartbeat") <= 2:
            raise agent.PublishError("POST", path, "HTTPError", 429, "NODE_RATE_LIMITED", {}, retry_after=7.0)
        return {}

    running.client.post = post
    caplog.set_level(logging.INFO, logger="modelforge_node_agent")
    monkeypatch.setattr(agent.log, "propagate", True)
    assert running.run(once=True) == 0  # A2: not an exit, not a credential problem
    assert sent == ["inventory", "heartbeat", "heartbeat", "heartbeat"]
    assert waits == [7.0, 7.0]  # exactly what Retry-After said, no backoff climb, no jitter
    line = "HTTP 429 NODE_RATE_LIMITED on POST /api/v1/agent/heartbeat (retry after 7s)"
    assert caplog.text.count(line) == 1  # once per episode
    assert running.backoff.attempt == 0 and "re-enrol" not in caplog.text
    assert running.client.credential == "mfn_" + "c" * 43
    assert "rate-limited" not in running.said_once  # accepted again: the next 429 is logged anew


def test_retry_after_is_read_as_seconds_and_bounded():
    assert agent.retry_after_seconds("7") == 7.0
    assert agent.retry_after_seconds(" 2 ") == 2.0
    assert agent.retry_after_seconds("999999") == agent.RETRY_AFTER_MAX_SECONDS
    assert agent.retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert agent.retry_after_seconds("-1") is None and agent.retry_after_seconds(None) is None
