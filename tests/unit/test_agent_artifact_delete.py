"""artifact.delete.v1 in the agent (J5): the artifact's directory is removed, inside the artifact
directory only, never through a symlink, and only when it is an artifact this agent verified."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import modelforge_agent_artifacts as delete_job
import modelforge_node_agent as agent

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
