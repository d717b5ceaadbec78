"""artifact.delete.v1 in the agent (J5): the artifact's directory is removed, inside the artifact
directory only, never through a symlink, and only when it is an artifact this agent verified."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

import modelforge_agent_artifacts as delete_job
import modelforge_node_agent as agent
from tests.support.agent import make_agent, make_config

COMMIT = "c" * 40


@pytest.fixture
def base(tmp_path) -> Path:
    """The agent's artifact directory, one root `registry` in it, and a file outside both."""
    (tmp_path / "artifacts" / "registry").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.gguf").write_bytes(b"GGUF" + b"k" * 96)
    return tmp_path / "artifacts"


def verified(base: Path, name: str = "tiny") -> Path:
    """An artifact as an acquire leaves it: its files and the manifest that lists them."""
    directory = base / "registry" / "models" / "owner" / name / COMMIT
    (directory / "sub").mkdir(parents=True)
    (directory / "tiny.gguf").write_bytes(b"GGUF" + b"x" * 1000)
    (directory / "sub" / "README.md").write_bytes(b"# tiny\n")
    files = [{"path": "tiny.gguf", "size": 1004}, {"path": "sub/README.md", "size": 7}]
    (directory / agent.MANIFEST_NAME).write_text(json.dumps({"commit": COMMIT, "files": files}))
    return directory


def delete(base: Path, container_path: Path | str) -> dict:
    request = delete_job.DeleteRequest("a-1", str(container_path))
    return delete_job.delete_artifact(request, base, agent.JobControl())


def test_the_directory_goes_and_symlinks_planted_in_it_are_removed_never_followed(base):
    directory = verified(base)
    outside = base.parent / "outside"
    os.symlink(outside / "keep.gguf", directory / "planted.gguf")
    os.symlink(outside, directory / "sub" / "planted-dir")
    manifest_bytes = (directory / agent.MANIFEST_NAME).stat().st_size
    result = delete(base, directory)
    assert not directory.exists()
    assert (outside / "keep.gguf").read_bytes() == b"GGUF" + b"k" * 96  # untouched
    assert sorted(os.listdir(outside)) == ["keep.gguf"]
    # The two files, the manifest and the link to a file; a link's target is never counted.
    assert result["removed_files"] == 4
    assert result["freed_bytes"] == 1004 + 7 + manifest_bytes
    assert (base / "registry" / "models" / "owner" / "tiny").is_dir()  # only the artifact itself goes


def test_what_is_refused_is_left_whole(base):
    directory = verified(base)
    unverified = base / "registry" / "loose"
    unverified.mkdir()
    (unverified / "file.bin").write_bytes(b"x")
    os.symlink(base.parent / "outside", base / "registry" / "models" / "owner" / "linked")
    for path, why in [
        (base / "registry", "not an artifact directory"),  # a root itself
        (base, "not an artifact directory"),
        (base.parent / "outside", "not an artifact directory"),  # outside the artifact directory
        (f"{base}/registry/models/../../../outside", "not an artifact directory"),
        (unverified, "not an artifact this agent verified"),  # no manifest
        (base / "registry" / "models" / "owner" / "linked", "symlink"),  # the artifact is a link
        (base / "registry" / "models" / "owner" / "linked" / "deeper", "symlink"),  # a link on the way
    ]:
        with pytest.raises(agent.JobFailure) as refused:
            delete(base, path)
        assert refused.value.code == "ARTIFACT_PATH_UNSAFE" and not refused.value.retryable, path
        assert why in refused.value.message, (path, refused.value.message)
    assert (unverified / "file.bin").exists() and (directory / "tiny.gguf").exists()
    assert (base.parent / "outside" / "keep.gguf").exists()


def test_an_artifact_already_gone_is_deleted_all_the_same(base):
    gone = base / "registry" / "models" / "owner" / "never" / COMMIT
    assert delete(base, gone) == {"artifact_id": "a-1", "removed_files": 0, "freed_bytes": 0}


def test_a_cancel_before_the_removal_leaves_the_artifact_whole(base):
    directory = verified(base)
    control = agent.JobControl()
    control.cancel()
    with pytest.raises(agent.JobFailure) as cancelled:
        delete_job.delete_artifact(delete_job.DeleteRequest("a-1", str(directory)), base, control)
    assert cancelled.value.code == "JOB_CANCELLED" and (directory / "tiny.gguf").exists()


def test_the_agent_advertises_it_without_any_library():
    assert "artifact.delete.v1" in agent.advertised_capabilities()
    assert agent.job_handler("artifact.delete.v1") is delete_job.run_delete_job


DAY = 86400.0


def quarantined(directory: Path, name: str, days_ago: float, now: float) -> Path:
    """An attempt's files as the acquire quarantines them, its reason.json written `days_ago`."""
    entry = directory / name
    (entry / "weights").mkdir(parents=True)
    (entry / "weights" / "model.gguf").write_bytes(b"GGUF bad bytes")
    (entry / "reason.json").write_text('{"code": "ARTIFACT_VERIFICATION_FAILED"}')
    os.utime(entry / "reason.json", (now - days_ago * DAY, now - days_ago * DAY))
    return entry


def test_quarantine_past_its_retention_is_removed_and_newer_evidence_kept(tmp_path):
    now = 2_000_000_000.0
    directory = tmp_path / "quarantine"
    old = quarantined(directory, "job-1-1", 15, now)
    fresh = quarantined(directory, "job-2-1", 13, now)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_bytes(b"k")
    os.symlink(tmp_path / "elsewhere", directory / "a-link")  # never followed, never removed
    os.symlink(tmp_path / "elsewhere" / "keep", old / "weights" / "planted")
    (directory / "stray.txt").write_text("not an attempt")
    assert delete_job.prune_quarantine(directory, 14 * DAY, now) == ["job-1-1"]
    assert not old.exists() and (fresh / "weights" / "model.gguf").exists()
    assert (directory / "a-link").is_symlink() and (directory / "stray.txt").exists()
    assert (tmp_path / "elsewhere" / "keep").read_bytes() == b"k"
    assert delete_job.prune_quarantine(tmp_path / "missing", 14 * DAY, now) == []


def test_the_agent_prunes_at_start_then_hourly_and_never_with_retention_zero(tmp_path, caplog):
    now = time.time()
    (tmp_path / "zero").mkdir()
    (tmp_path / "fortnight").mkdir()
    kept = make_agent(
        make_config(tmp_path / "zero", "http://127.0.0.1:9", MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS="0")
    )
    zero_entry = quarantined(kept.config.data_dirs["quarantine"], "job-z-1", 400, now)
    kept.maybe_prune_quarantine(time.monotonic())
    assert zero_entry.exists()

    running = make_agent(make_config(tmp_path / "fortnight", "http://127.0.0.1:9"))
    directory = running.config.data_dirs["quarantine"]
    quarantined(directory, "job-a-1", 20, now)
    with caplog.at_level(logging.INFO, logger=agent.log.name):
        running.maybe_prune_quarantine(time.monotonic())
    assert not (directory / "job-a-1").exists()
    assert "quarantine: removed job-a-1, kept 14 days" in caplog.text
    quarantined(directory, "job-b-1", 20, now)
    running.maybe_prune_quarantine(time.monotonic() + 60)  # within the hour: not looked at again
    assert (directory / "job-b-1").exists()
    running.maybe_prune_quarantine(time.monotonic() + agent.QUARANTINE_PRUNE_EVERY_SECONDS + 1)
    assert not (directory / "job-b-1").exists()
