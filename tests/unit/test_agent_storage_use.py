"""J5 in the agent: what each storage root holds, split into artifacts and partial downloads, and
the quarantine beside them, measured on a real directory tree without following a link; and the
partial directory of a job the control plane says is finished, removed inside its root only."""

from __future__ import annotations

import logging
import os
import threading
import uuid
from pathlib import Path

import pytest

import modelforge_agent_artifacts as lifecycle
import modelforge_node_agent as agent
from tests.support.agent import FakeControlPlane, assert_matches_the_servers_schema, make_agent, make_config

COMMIT = "c" * 40
ROOT_ID = str(uuid.uuid4())


@pytest.fixture
def control_plane():
    fake = FakeControlPlane()
    yield fake
    fake.close()


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


@pytest.fixture
def locked_dirs(monkeypatch):
    """Make directories unreadable: mode 000, and, since root reads them all the same, an open of
    one refused as the kernel would refuse anyone else (EACCES)."""
    locked: set[str] = set()  # each directory by its full path, and by its name below an open parent
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        name = os.fsdecode(path)
        if (name if kwargs.get("dir_fd") is None else f"*/{name}") in locked:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(agent.os, "open", refusing_open)
    chmodded: list[Path] = []

    def lock(directory: Path) -> None:
        locked.update((str(directory), f"*/{directory.name}"))
        directory.chmod(0)
        chmodded.append(directory)

    yield lock
    for directory in chmodded:
        directory.chmod(0o755)  # so tmp_path can be cleaned up


def tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A root with one artifact, one job's partial download, a link pointing outside, and the
    node's quarantine beside the artifact directory; returns (root, outside, quarantine)."""
    root = tmp_path / "artifacts" / "registry"
    artifact = root / "models" / "owner" / "tiny" / COMMIT
    write(artifact / "tiny.gguf", 1000)
    write(artifact / "sub" / "README.md", 7)
    write(root / ".partial" / "job-1" / "weights" / "model.gguf", 300)
    write(root / ".partial" / "job-1.json", 20)
    outside = tmp_path / "outside"
    write(outside / "big.bin", 1 << 20)
    os.symlink(outside, artifact / "linked-dir")  # never followed
    os.symlink(outside / "big.bin", artifact / "linked.bin")  # never counted
    os.symlink(outside, root / ".partial" / "job-1" / "escape")
    quarantine = tmp_path / "quarantine"
    write(quarantine / "job-9-1" / "model.gguf", 50)
    write(quarantine / "job-9-1" / "reason.json", 5)
    return root, outside, quarantine


def test_each_roots_use_is_split_and_a_link_out_is_neither_followed_nor_counted(tmp_path):
    root, outside, quarantine = tree(tmp_path)
    use = lifecycle.measure_storage_use({ROOT_ID: str(root)}, quarantine)
    assert use.roots[ROOT_ID] == {
        "artifacts_bytes": 1007,
        "artifacts_unread_dirs": 0,
        "partials_bytes": 320,  # the job's files and the state file beside them
        "partials_unread_dirs": 0,
        "partial_jobs": ["job-1"],
    }
    assert use.quarantine == {"quarantine_bytes": 55, "quarantine_unread_dirs": 0}
    assert use.places == {ROOT_ID: str(root)}
    assert sorted(os.listdir(outside)) == ["big.bin"]


def test_a_directory_it_cannot_read_is_unknown_never_zero(tmp_path, locked_dirs):
    root, _, quarantine = tree(tmp_path)
    locked = root / "models" / "locked"
    write(locked / "hidden.gguf", 5000)
    locked_dirs(locked)
    use = lifecycle.measure_storage_use({ROOT_ID: str(root), "gone": str(tmp_path / "artifacts" / "gone")}, quarantine)
    # What could be read is counted; the directory that could not is said, so 1007 reads "at least".
    assert (use.roots[ROOT_ID]["artifacts_bytes"], use.roots[ROOT_ID]["artifacts_unread_dirs"]) == (1007, 1)
    assert use.roots[ROOT_ID]["partials_unread_dirs"] == 0
    # A root it cannot open at all: nothing is known, and nothing is said to be 0.
    assert use.roots["gone"]["artifacts_bytes"] is None and use.roots["gone"]["partials_bytes"] is None
    locked_dirs(quarantine)
    assert lifecycle.measure_storage_use({}, quarantine).quarantine["quarantine_bytes"] is None
    # No quarantine directory yet (nothing ever failed verification): truly nothing.
    assert lifecycle.measure_storage_use({}, tmp_path / "none").quarantine == {
        "quarantine_bytes": 0,
        "quarantine_unread_dirs": 0,
    }


def test_a_root_nested_in_another_and_the_quarantine_inside_one_are_counted_once(tmp_path):
    outer = tmp_path / "artifacts"
    write(outer / "models" / "a" / "x.bin", 10)
    inner = outer / "fast"
    write(inner / "models" / "b" / "y.bin", 20)
    quarantine = outer / "quarantine"
    write(quarantine / "job-1-1" / "bad.bin", 40)
    use = lifecycle.measure_storage_use({"outer": str(outer), "inner": str(inner)}, quarantine)
    assert use.roots["outer"]["artifacts_bytes"] == 10 and use.roots["inner"]["artifacts_bytes"] == 20
    assert use.quarantine["quarantine_bytes"] == 40


def test_the_measurement_is_bounded(tmp_path, monkeypatch):
    root = tmp_path / "artifacts" / "registry"
    for index in range(30):
        write(root / f"d{index}" / "f.bin", 1)
    monkeypatch.setattr(lifecycle, "MAX_USE_ENTRIES", 10)
    figures = lifecycle.measure_storage_use({ROOT_ID: str(root)}, tmp_path / "none").roots[ROOT_ID]
    assert figures["artifacts_unread_dirs"] > 0 and figures["artifacts_bytes"] < 30  # a lower bound, said so


def with_roots(tmp_path: Path, control_plane: FakeControlPlane) -> agent.Agent:
    config = make_config(tmp_path, control_plane.url)
    container_path = str(tmp_path / "artifacts" / "registry")
    control_plane.roots = [{"id": ROOT_ID, "name": "registry", "container_path": container_path, "min_free_bytes": 0}]
    running = make_agent(config)
    running.start()
    return running


def test_the_heartbeat_carries_the_use_measured_at_most_once_a_minute_or_after_a_job(
    tmp_path, control_plane, monkeypatch
):
    root, _, _ = tree(tmp_path)
    running = with_roots(tmp_path, control_plane)
    measured = []
    real_measure = lifecycle.measure_storage_use

    def counting(*args):
        measured.append(args)
        return real_measure(*args)

    monkeypatch.setattr(lifecycle, "measure_storage_use", counting)
    running.heartbeat()  # learns its roots
    running.heartbeat()  # reports them, with their use
    running.heartbeat()
    bodies = control_plane.bodies("heartbeat")
    (reported,) = bodies[1]["storage_roots"]
    assert reported["usage"]["artifacts_bytes"] == 1007 and reported["usage"]["partial_jobs"] == ["job-1"]
    assert bodies[1]["quarantine_usage"] == {"quarantine_bytes": 55, "quarantine_unread_dirs": 0}
    for body in bodies:
        assert_matches_the_servers_schema(body, "HeartbeatRequest")
    assert len(measured) == 1  # a second beat within the minute uses the figure it has
    write(root / "models" / "owner" / "other" / COMMIT / "more.bin", 93)
    running.storage_use_measured_at -= agent.STORAGE_USE_SECONDS  # a minute on
    running.heartbeat()
    assert len(measured) == 2  # and a new figure goes out at once, before the minute of the report
    assert control_plane.bodies("heartbeat")[-1]["storage_roots"][0]["usage"]["artifacts_bytes"] == 1100
    write(root / ".partial" / "job-2" / "model.gguf", 80)
    running.storage_use_due = True  # what maybe_claim sets when a job ends
    running.heartbeat()
    assert len(measured) == 3
    assert control_plane.bodies("heartbeat")[-1]["storage_roots"][0]["usage"]["partial_jobs"] == ["job-1", "job-2"]


def reported_partials(body: dict) -> list[str]:
    """The job ids whose partial directories a heartbeat reports, over all its roots."""
    return [job for seen in body.get("storage_roots", []) for job in seen.get("usage", {}).get("partial_jobs", [])]


class FinishedJob:
    """A runner whose job ended."""

    def __init__(self, job_id: str, alive: bool = False) -> None:
        self.job = agent.Job(id=job_id, type=agent.ACQUIRE_JOB_TYPE, attempt=3, params={})
        self.failure = None
        self.thread = threading.Thread()
        self._alive = alive

    def alive(self) -> bool:
        return self._alive


def test_a_finished_jobs_partial_directory_is_removed_inside_its_root_only(tmp_path, control_plane, caplog):
    root, outside, _ = tree(tmp_path)
    write(root / ".partial" / "job-2" / "model.gguf", 64)  # a job still queued for another attempt
    write(root / ".partial" / "job-3" / "model.gguf", 64)  # a job this agent runs right now
    running = with_roots(tmp_path, control_plane)
    told = []

    def reply(body):
        answer = control_plane.publication_reply(body)
        reported = reported_partials(body)
        if reported:
            told.append(reported)
            # The control plane answers with the reported jobs it knows have ended (J2 terminal states).
            answer["finished_partial_jobs"] = [job for job in reported if job in ("job-1", "job-3")]
        return 200, answer

    control_plane.scripts["heartbeat"] = reply
    running.runner = FinishedJob("job-3", alive=True)
    with caplog.at_level(logging.INFO, logger=agent.log.name):
        running.heartbeat()
        running.heartbeat()
    assert told == [["job-1", "job-2", "job-3"]]
    assert not (root / ".partial" / "job-1").exists() and not (root / ".partial" / "job-1.json").exists()
    assert (root / ".partial" / "job-2" / "model.gguf").exists()  # not finished: kept for its next attempt
    assert (root / ".partial" / "job-3" / "model.gguf").exists()  # still running here: never touched
    assert sorted(os.listdir(outside)) == ["big.bin"] and (outside / "big.bin").stat().st_size == 1 << 20
    assert "job job-1 has finished; removed its partial directory on root registry (320 bytes)" in caplog.text
    # Once that job's runner is gone, the next measurement reports it again and it goes too.
    running.runner = FinishedJob("job-3")
    running.maybe_claim()
    running.heartbeat()
    assert not (root / ".partial" / "job-3").exists() and (root / ".partial" / "job-2").exists()


def test_a_partial_is_removed_through_no_link(tmp_path):
    root, outside, _ = tree(tmp_path)
    assert lifecycle.remove_partial(str(root), "../registry") == 0  # not a job id: nothing done
    os.symlink(outside, root / ".partial" / "job-4")  # a link in the job's place: unlinked, never followed
    assert lifecycle.remove_partial(str(root), "job-4") == 0
    assert not os.path.lexists(root / ".partial" / "job-4") and (outside / "big.bin").exists()
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "job-5" / "keep.bin", 3)
    other = tmp_path / "artifacts" / "other"
    other.mkdir()
    os.symlink(elsewhere, other / ".partial")  # .partial itself a link: nothing is removed through it
    assert lifecycle.remove_partial(str(other), "job-5") == 0
    assert (elsewhere / "job-5" / "keep.bin").exists()
    assert lifecycle.remove_partial(str(root), "job-1") == 320 and not (root / ".partial" / "job-1").exists()
    assert lifecycle.remove_partial(str(root), "job-1") == 0  # already gone


def test_a_stall_on_the_last_attempt_leaves_a_partial_that_goes_once_the_job_has_failed(tmp_path, control_plane, hub):
    # J2: a stall is retryable, so the acquire keeps the attempt's files for the next one; on the
    # last attempt there is no next one: the control plane fails the job, and only the agent's
    # clean-up ever removes what the attempt left.
    hub.add_repo("org/model", {"weights/model.gguf": b"w" * (3 << 20)})
    hub.stall("weights/model.gguf", after_bytes=0, seconds=5, times=None)
    running = with_roots(tmp_path, control_plane)
    running.config = make_config(tmp_path, control_plane.url, hub.url, MODELFORGE_AGENT_STALL_SECONDS="0.3")
    container_path = str(tmp_path / "artifacts" / "registry")
    job = {
        "id": "job-7",
        "type": agent.ACQUIRE_JOB_TYPE,
        "attempt": 3,
        "max_attempts": 3,
        "params": {"repo_id": "org/model", "revision": "main", "repo_type": "model", "container_path": container_path},
        "progress_interval_seconds": 0.1,
    }
    control_plane.scripts["claim"] = lambda body: (200, {"job": job})
    control_plane.jobs_waiting = 1
    running.heartbeat()
    running.maybe_claim()
    running.runner.thread.join(timeout=20)
    (fail,) = control_plane.bodies("fail")
    assert fail["retryable"] is True and fail["attempt"] == 3
    partial = Path(container_path) / ".partial" / "job-7"
    assert partial.is_dir()  # the last attempt's files: nothing will ever resume from them

    def reply(body):
        answer = control_plane.publication_reply(body)
        reported = reported_partials(body)
        answer["finished_partial_jobs"] = [job for job in reported if job == "job-7"]  # failed: out of attempts
        return 200, answer

    control_plane.scripts["heartbeat"] = reply
    control_plane.scripts["claim"] = lambda body: (204, None)
    control_plane.jobs_waiting = 0
    running.maybe_claim()  # the runner has ended
    running.heartbeat()
    assert not partial.exists() and not (partial.parent / "job-7.json").exists()
