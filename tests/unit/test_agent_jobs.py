"""The agent's side of jobs and storage roots (J1, J2, L4, A1–A3).

The control plane is faked only as a recipient: a loopback HTTP server that records every body
the agent sends and answers from a script. The Hub is the stand-in (tests/support/hub.py).
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from pathlib import Path

import pytest

import modelforge_node_agent as agent
from tests.support.agent import (
    CREDENTIAL,
    FakeControlPlane,
    assert_matches_the_servers_schema,
    make_agent,
    make_config,
    runner_for,
)
from tests.support.hub import Generated

MiB = 1 << 20
REPO = "org/model"
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


@pytest.fixture
def control_plane():
    fake = FakeControlPlane()
    yield fake
    fake.close()


def claimed_job(tmp_path: Path, interval: float = 0.1, **params) -> dict:
    """The `job` of a claim reply, as the control plane resolves it (J2 wire format)."""
    return {
        "id": "job-1",
        "type": agent.ACQUIRE_JOB_TYPE,
        "attempt": 1,
        "max_attempts": 3,
        "params": {
            "repo_id": REPO,
            "revision": "main",
            "repo_type": "model",
            "allow_patterns": None,
            "ignore_patterns": None,
            "storage_root_id": "root-1",
            "container_path": str(tmp_path / "artifacts" / "registry"),
            "min_free_bytes": 0,
            **params,
        },
        "lease_expires_at": "2030-01-01T00:00:00Z",
        "lease_seconds": 60,
        "progress_interval_seconds": interval,
    }


# --------------------------------------------------------------------------- the loop


def test_a_waiting_job_is_claimed_within_a_heartbeat_and_run_while_heartbeats_go_on(tmp_path, control_plane, hub):
    commit = hub.add_repo(REPO, {"config.json": b"{}", "weights/model.gguf": Generated(3 * MiB)})
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=1.5)  # a job that outlasts a heartbeat
    claims = []

    def claim(body):
        claims.append(time.monotonic())
        if len(claims) == 2:
            control_plane.jobs_waiting = 0
            return 200, {"job": claimed_job(tmp_path)}
        control_plane.jobs_waiting = 1  # J2: the next heartbeat says a job waits
        return 204, None

    control_plane.scripts["claim"] = claim
    running = make_agent(make_config(tmp_path, control_plane.url, hub.url))
    loop = threading.Thread(target=running.run, daemon=True)
    loop.start()
    try:
        (complete,) = control_plane.wait_for("complete")
    finally:
        running.stop.set()
        loop.join(timeout=5)

    names = control_plane.names()
    assert names[:3] == ["inventory", "heartbeat", "claim"]  # a claim right after start-up
    assert control_plane.bodies("inventory")[0]["capabilities"] == [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE]
    versions = {"protocol_version": 1, "agent_version": agent.AGENT_VERSION}
    assert control_plane.bodies("claim")[0] == {
        **versions,
        "capabilities": [agent.ACQUIRE_JOB_TYPE, agent.DELETE_JOB_TYPE],
    }
    # Picked up at the first heartbeat that said a job waits: within one interval of the first claim.
    assert claims[1] - claims[0] < 1.9
    started, ended = names.index("claim", 3), names.index("complete")
    during = names[started:ended]
    assert "heartbeat" in during and "claim" not in during[1:]  # beats go on; one job at a time
    progress = control_plane.bodies("progress")
    assert len(progress) >= 3 and all(
        body["attempt"] == 1 and body.keys() == {*versions, "attempt", "progress"} for body in progress
    )
    total = hub.file(REPO, "weights/model.gguf").size + 2
    assert progress[-1]["progress"] == {"bytes_done": total, "bytes_total": total, "files_done": 2, "files_total": 2}
    final = tmp_path / "artifacts" / "registry" / "models" / REPO / commit
    assert complete == {
        **versions,
        "attempt": 1,
        "result": {
            "commit": commit,
            "container_path": str(final),
            "files": 2,
            "total_bytes": total,
            # S3: each .gguf's header, read on the node; the stand-in Hub's "model" is random bytes.
            "models": {
                "weights/model.gguf": {
                    "problem": "the header cannot be read (GGUF magic invalid); the file may be cut short or not GGUF"
                }
            },
        },
    }
    with control_plane.lock:
        job_headers = [headers for path, _, headers, _ in control_plane.received if "/jobs/" in path]
    assert all(headers["Authorization"] == f"Bearer {CREDENTIAL}" for headers in job_headers)
    schemas = {"inventory": "InventoryRequest", "heartbeat": "HeartbeatRequest", "claim": "ClaimRequest"}
    for name, schema in {**schemas, "progress": "ProgressRequest", "complete": "CompleteRequest"}.items():
        for body in control_plane.bodies(name):
            assert_matches_the_servers_schema(body, schema)


def test_no_capability_no_claim(tmp_path, control_plane, hub, monkeypatch):
    real = agent.importlib.util.find_spec
    monkeypatch.setattr(
        agent.importlib.util,
        "find_spec",
        lambda name: None if name in ("huggingface_hub", "modelforge_agent_artifacts") else real(name),
    )
    control_plane.jobs_waiting = 3
    running = make_agent(make_config(tmp_path, control_plane.url, hub.url))
    assert running.capabilities == []
    running.start()
    running.publish_once()
    running.maybe_claim()
    assert control_plane.names() == ["inventory", "heartbeat"]
    assert control_plane.bodies("inventory")[0]["capabilities"] == []


def test_a_refused_claim_is_logged_once_and_heartbeats_are_untouched(tmp_path, control_plane, hub, caplog):
    control_plane.scripts["claim"] = lambda body: (404, {"error": {"code": "NOT_FOUND", "message": "m"}})
    control_plane.jobs_waiting = 1
    running = make_agent(make_config(tmp_path, control_plane.url, hub.url))
    caplog.set_level("INFO", logger="modelforge_node_agent")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent.log, "propagate", True)
        running.start()
        for _ in range(3):
            running.publish_once()
            running.maybe_claim()
    assert control_plane.names().count("heartbeat") == 3
    assert caplog.text.count("HTTP 404 NOT_FOUND on POST /api/v1/agent/jobs/claim") == 1


# --------------------------------------------------------------------------- the runner


def test_cancel_requested_stops_the_job_removes_its_partial_files_and_reports_job_cancelled(
    tmp_path, control_plane, hub
):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(4 * MiB)})
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=0.5)
    control_plane.scripts["progress"] = lambda body: (200, {"lease_expires_at": "x", "cancel_requested": True})
    config = make_config(tmp_path, control_plane.url, hub.url)
    runner = runner_for(config, claimed_job(tmp_path)).start()
    runner.thread.join(timeout=10)
    (fail,) = control_plane.bodies("fail")
    assert_matches_the_servers_schema(fail, "FailRequest")
    assert fail["attempt"] == 1 and fail["retryable"] is False
    assert fail["error"]["code"] == agent.JOB_CANCELLED and fail["error"].keys() == {"code", "message"}
    assert control_plane.bodies("complete") == []
    assert not (tmp_path / "artifacts" / "registry" / ".partial" / "job-1").exists()


def test_a_lost_lease_stops_the_job_keeps_its_partial_files_and_sends_nothing_more(tmp_path, control_plane, hub):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(4 * MiB)})
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=0.5)
    lost = {"error": {"code": "JOB_LEASE_LOST", "message": "m", "next_step": "n"}}
    answered = []

    def progress(body):
        # The lease lapses once bytes are on disk (the sweep gave the job to a later attempt).
        answered.append(409 if body["progress"]["bytes_done"] else 200)
        return (answered[-1], lost if answered[-1] == 409 else {"lease_expires_at": "x", "cancel_requested": False})

    control_plane.scripts["progress"] = progress
    config = make_config(tmp_path, control_plane.url, hub.url)
    runner = runner_for(config, claimed_job(tmp_path)).start()
    runner.thread.join(timeout=10)
    assert not runner.alive()
    assert set(control_plane.names()) == {"progress"} and answered[-1] == 409 and answered.count(409) == 1
    partial = tmp_path / "artifacts" / "registry" / ".partial" / "job-1" / "weights" / "model.gguf"
    assert partial.stat().st_size >= MiB  # a later attempt resumes from here
    assert not (tmp_path / "artifacts" / "registry" / "models").exists()


def test_an_unreachable_control_plane_never_stops_the_download(tmp_path, control_plane, hub, caplog):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(3 * MiB)})
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=0.5)
    control_plane.scripts["progress"] = lambda body: (503, {})
    completes = []

    def complete(body):
        completes.append(body)
        return (503, {}) if len(completes) == 1 else (200, {})

    control_plane.scripts["complete"] = complete
    config = make_config(tmp_path, control_plane.url, hub.url)
    caplog.set_level("INFO", logger="modelforge_node_agent")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent.log, "propagate", True)
        runner = runner_for(config, claimed_job(tmp_path)).start()
        runner.thread.join(timeout=15)
    assert len(completes) == 2 and completes[0] == completes[1]  # delivered on the second try
    assert "HTTP 503 ERROR on POST /api/v1/agent/jobs/job-1/progress; the job goes on" in caplog.text
    assert "HTTP 503 ERROR on POST /api/v1/agent/jobs/job-1/complete (backoff 1s…16s)" in caplog.text


def test_a_job_type_the_agent_cannot_run_fails_at_once_not_retryable(tmp_path, control_plane, hub):
    config = make_config(tmp_path, control_plane.url, hub.url)
    runner = runner_for(config, {**claimed_job(tmp_path), "type": "runtime.train.v9"}).start()
    runner.thread.join(timeout=5)
    (fail,) = control_plane.bodies("fail")
    assert (fail["error"]["code"], fail["retryable"]) == (agent.JOB_TYPE_UNSUPPORTED, False)


def test_bad_params_fail_naming_the_field(tmp_path, control_plane, hub):
    config = make_config(tmp_path, control_plane.url, hub.url)
    runner = runner_for(config, claimed_job(tmp_path, repo_id="../etc")).start()
    runner.thread.join(timeout=5)
    (fail,) = control_plane.bodies("fail")
    assert (fail["error"]["code"], fail["retryable"]) == (agent.JOB_PARAMS_INVALID, False)
    assert fail["error"]["message"].startswith("params.repo_id ")
    assert hub.requests == []


@pytest.mark.parametrize(
    "job",
    [{"id": "../x", "attempt": 1}, {"id": "j", "attempt": 0}, {"id": "j", "attempt": True}, {"attempt": 1}, "job"],
)
def test_a_claimed_job_without_a_usable_id_or_attempt_is_not_run(job):
    assert agent.Job.from_claim(job) is None


# --------------------------------------------------------------------------- storage roots (J1)


def test_the_heartbeat_reports_each_storage_root_it_was_told_about(tmp_path, control_plane, hub):
    config = make_config(tmp_path, control_plane.url, hub.url)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "artifacts" / "linked").symlink_to(outside)
    r1, r2, r3, r4 = (str(uuid.uuid4()) for _ in range(4))  # root ids as the control plane makes them
    artifacts = tmp_path / "artifacts"
    control_plane.roots = [
        {"id": r1, "name": "registry", "container_path": str(artifacts / "registry"), "min_free_bytes": 0},
        {"id": r2, "name": "escapes", "container_path": str(artifacts / "linked"), "min_free_bytes": 0},
        {"id": r3, "name": "missing", "container_path": str(artifacts / "gone" / "deeper"), "min_free_bytes": 0},
        {"id": r4, "name": "new", "container_path": str(artifacts / "new"), "min_free_bytes": 0},
    ]
    running = make_agent(config)
    running.start()
    running.heartbeat()
    running.heartbeat()
    running.heartbeat()
    first, second, third = control_plane.bodies("heartbeat")
    assert "storage_roots_etag" not in first and "storage_roots" not in first  # it holds no list yet
    assert second["storage_roots_etag"] == "etag-1"
    observed = {facts["id"]: facts for facts in second["storage_roots"]}
    registry = observed[r1]
    assert (registry["exists"], registry["writable"]) == (True, True) and "problem" not in registry
    assert 0 < registry["free_bytes"] <= registry["total_bytes"] and RFC3339.fullmatch(registry["observed_at"])
    # J1: a missing root whose parent the agent may write to is made, and usable at once.
    assert (observed[r4]["exists"], observed[r4]["writable"]) == (True, True) and (artifacts / "new").is_dir()
    assert observed[r2]["problem"] == f"is a symlink: {artifacts / 'linked'} is never followed"
    assert observed[r3]["problem"] == f"parent missing: {artifacts / 'gone'} does not exist"
    assert not (artifacts / "gone").exists()  # a missing parent is never made: a typo grows no tree
    for escaped in (observed[r2], observed[r3]):
        assert (escaped["exists"], escaped["writable"], escaped["free_bytes"], escaped["total_bytes"]) == (
            False,
            False,
            None,
            None,
        )
    assert list(outside.iterdir()) == []  # a root outside the artifact directory is never probed
    assert list((tmp_path / "artifacts" / "registry").iterdir()) == []  # the probe file is gone
    assert third == {**third, "storage_roots_etag": "etag-1"} and "storage_roots" not in third  # not due yet
    for body in (first, second, third):
        assert_matches_the_servers_schema(body, "HeartbeatRequest")


def test_root_observations_go_out_on_a_notable_change_or_after_a_minute(tmp_path):
    artifacts = tmp_path / "artifacts"
    (artifacts / "shelf" / "registry").mkdir(parents=True)
    roots = agent.StorageRoots(artifacts)
    root = {
        "id": "r1",
        "name": "registry",
        "container_path": str(artifacts / "shelf" / "registry"),
        "min_free_bytes": 5,
    }
    roots.take_reply({"storage_roots_etag": "e", "storage_roots": [root]})
    sent = roots.heartbeat_fields(100.0)
    roots.delivered(sent, 100.0)
    assert "storage_roots" in sent and "storage_roots" not in roots.heartbeat_fields(130.0)
    assert "storage_roots" in roots.heartbeat_fields(161.0)  # a minute on
    (artifacts / "shelf" / "registry").rmdir()
    (artifacts / "shelf").rmdir()  # its parent too, or the agent would make the root again (J1)
    assert roots.heartbeat_fields(131.0)["storage_roots"][0]["exists"] is False  # gone: at once
    roots.take_reply({"storage_roots_etag": "e2", "storage_roots": []})
    assert roots.heartbeat_fields(132.0) == {"storage_roots_etag": "e2", "storage_roots": []}


def test_the_write_probe_runs_once_a_minute_not_on_every_heartbeat(tmp_path, monkeypatch):
    artifacts = tmp_path / "artifacts"
    (artifacts / "registry").mkdir(parents=True)
    roots = agent.StorageRoots(artifacts)
    root = {"id": "r1", "name": "registry", "container_path": str(artifacts / "registry"), "min_free_bytes": 0}
    roots.take_reply({"storage_roots_etag": "e", "storage_roots": [root]})
    probes, real_open = [], agent.os.open

    def counting_open(path, *args, **kwargs):
        if ".modelforge-probe-" in str(path):
            probes.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(agent.os, "open", counting_open)
    for beat in range(12):  # every five seconds for a minute; only the first one arrives
        sent = roots.heartbeat_fields(100.0 + 5 * beat)
        if beat == 0:
            roots.delivered(sent, 100.0)
    assert len(probes) == 1
    assert roots.heartbeat_fields(160.0)["storage_roots"][0]["writable"] is True  # due: probed again
    assert len(probes) == 2


def test_a_probe_file_that_cannot_be_removed_reads_as_not_writable(tmp_path, monkeypatch):
    artifacts = tmp_path / "artifacts"
    (artifacts / "registry").mkdir(parents=True)
    roots = agent.StorageRoots(artifacts)
    root = {"id": "r1", "name": "registry", "container_path": str(artifacts / "registry"), "min_free_bytes": 0}
    roots.take_reply({"storage_roots_etag": "e", "storage_roots": [root]})

    def failing_unlink(path, *args, **kwargs):
        raise OSError(16, "Device or resource busy", str(path))

    monkeypatch.setattr(agent.os, "unlink", failing_unlink)
    assert agent.writable_dir(str(artifacts / "registry")) is False
    assert roots.heartbeat_fields(100.0)["storage_roots"][0]["writable"] is False


def test_a_reply_without_roots_keeps_the_list_and_a_bad_root_is_dropped(tmp_path):
    roots = agent.StorageRoots(tmp_path)
    good = {"id": "r1", "name": "n", "container_path": str(tmp_path), "min_free_bytes": 0}
    roots.take_reply({"storage_roots_etag": "e", "storage_roots": [good, {"id": "r2"}, "x"]})
    roots.take_reply({"storage_roots_etag": "e"})  # unchanged: the server sends only the etag
    assert [root.id for root in roots.roots] == ["r1"] and roots.etag == "e"


@pytest.fixture
def read_only_dir(monkeypatch):
    """Make a directory read-only: mode 0555, and, since root writes in it all the same, a mkdir in
    it refused as the kernel refuses anyone else (EACCES)."""
    locked: list[Path] = []
    real_mkdir = agent.os.mkdir

    def refusing_mkdir(path, mode=0o777, *, dir_fd=None):
        parent = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.path.dirname(path)
        if any(os.path.samefile(parent, directory) for directory in locked):
            raise PermissionError(13, "Permission denied", path)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(agent.os, "mkdir", refusing_mkdir)

    def lock(directory: Path) -> Path:
        directory.mkdir(parents=True)
        directory.chmod(0o555)
        locked.append(directory)
        return directory

    def unlock(directory: Path) -> None:
        directory.chmod(0o755)
        locked.remove(directory)

    lock.unlock = unlock
    yield lock
    for directory in locked:
        directory.chmod(0o755)  # so tmp_path can be cleaned up


def test_a_missing_root_is_created_when_its_parent_lets_the_agent_and_refused_with_why_otherwise(
    tmp_path, read_only_dir
):
    artifacts = tmp_path / "artifacts"
    (artifacts / "shelf").mkdir(parents=True)
    (artifacts / "a-file").write_text("not a directory")
    (artifacts / "inner").mkdir()
    (artifacts / "alias").symlink_to(artifacts / "inner")  # even a link that stays inside is not followed
    locked = read_only_dir(artifacts / "locked")

    assert agent.root_problem(str(artifacts / "shelf" / "models"), artifacts) is not None  # looking makes nothing
    assert not (artifacts / "shelf" / "models").exists()
    assert agent.root_problem(str(artifacts / "shelf" / "models"), artifacts, create=True) is None
    assert (artifacts / "shelf" / "models").is_dir()
    problems = {
        name: agent.root_problem(path, artifacts, create=True)
        for name, path in {
            "locked": str(locked / "models"),
            "symlink": str(artifacts / "alias"),
            "below a symlink": str(artifacts / "alias" / "models"),
            "file": str(artifacts / "a-file"),
            "outside": str(tmp_path / "elsewhere"),
            "prefix": f"{artifacts}-other/models",
            "dots": f"{artifacts}/shelf/../../elsewhere",
            "relative": "artifacts/models",
        }.items()
    }
    assert problems == {
        "locked": f"parent not writable: the agent (uid {os.getuid()}) cannot create models in {locked}",
        "symlink": f"is a symlink: {artifacts / 'alias'} is never followed",
        "below a symlink": f"is a symlink: {artifacts / 'alias'} is never followed",
        "file": f"not a directory: {artifacts / 'a-file'}",
        "outside": f"outside the artifact directory {artifacts}: {tmp_path / 'elsewhere'}",
        "prefix": f"outside the artifact directory {artifacts}: {artifacts}-other/models",
        "dots": f"not a plain path (empty, . or .. parts are never resolved): {artifacts}/shelf/../../elsewhere",
        "relative": "not an absolute path: artifacts/models",
    }
    assert list((artifacts / "inner").iterdir()) == [] and not (tmp_path / "elsewhere").exists()
    assert agent.root_problem(str(artifacts), artifacts) is None  # the artifact directory itself may be a root


def test_a_refused_root_is_reported_with_its_reason_once_and_again_when_it_changes(tmp_path, read_only_dir):
    artifacts = tmp_path / "artifacts"
    locked = read_only_dir(artifacts / "locked")
    roots = agent.StorageRoots(artifacts)
    far = "/elsewhere" + f"/{'x' * 250}" * 3  # a path longer than the heartbeat carries: the reason is cut
    wire = [
        {"id": "r1", "name": "locked", "container_path": str(locked / "models"), "min_free_bytes": 0},
        {"id": "r2", "name": "long", "container_path": far, "min_free_bytes": 0},
    ]
    roots.take_reply({"storage_roots_etag": "e", "storage_roots": wire})
    sent = roots.heartbeat_fields(100.0)
    roots.delivered(sent, 100.0)
    first, long = sent["storage_roots"]
    assert (first["exists"], first["writable"]) == (False, False)
    assert first["problem"].startswith("parent not writable: ") and len(long["problem"]) == agent.ROOT_PROBLEM_MAX
    assert "storage_roots" not in roots.heartbeat_fields(110.0)  # the same refusal: not due again
    read_only_dir.unlock(locked)  # the operator let the agent write there: it makes the root itself
    fixed = roots.heartbeat_fields(111.0)["storage_roots"][0]
    assert (fixed["exists"], fixed["writable"]) == (True, True) and "problem" not in fixed
    assert (locked / "models").is_dir()


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HF_ENDPOINT": "ftp://mirror"}, "HF_ENDPOINT"),
        ({"MODELFORGE_AGENT_STALL_SECONDS": "soon"}, "MODELFORGE_AGENT_STALL_SECONDS"),
        ({"MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS": "-1"}, "MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS"),
        ({"MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS": "a fortnight"}, "MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS"),
        ({"MODELFORGE_HF_TOKEN_FILE": "/nonexistent/token"}, "MODELFORGE_HF_TOKEN_FILE"),
        ({"MODELFORGE_HF_TOKEN": "hf_a b"}, "MODELFORGE_HF_TOKEN"),
        ({"MODELFORGE_HF_TOKEN": "hf_x", "MODELFORGE_HF_TOKEN_FILE": "/t"}, "MODELFORGE_HF_TOKEN_FILE"),
    ],
)
def test_hub_settings_refusals_name_the_variable_and_never_echo_a_token(tmp_path, env, named):
    with pytest.raises(agent.ConfigError) as refused:
        agent.load_config({"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", **env})
    assert named in str(refused.value) and "hf_a b" not in str(refused.value)


def test_the_hub_token_comes_from_its_file_without_the_newline(tmp_path):
    (tmp_path / "token").write_text("hf_from_file\n")
    config = agent.load_config(
        {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.lan", "MODELFORGE_HF_TOKEN_FILE": str(tmp_path / "token")}
    )
    assert config.hub.token == "hf_from_file" and "hf_from_file" not in repr(config)
    assert config.hub.endpoint == agent.DEFAULT_HF_ENDPOINT and config.hub.stall_seconds == agent.STALL_SECONDS
