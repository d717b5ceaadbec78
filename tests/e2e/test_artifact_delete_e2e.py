"""Deleting an artifact end to end (J5): the real gunicorn and the real agent process remove the
directory of an artifact acquired through the stand-in Hub, and nothing outside it."""

from __future__ import annotations

import os

from tests.support.acquire import acquire, api, online_agent_with_root, wait_job

FILES = {"tiny.gguf": b"GGUF" + b"\x00" * 4092, "README.md": b"# tiny\n"}


def test_a_deleted_artifact_leaves_the_disk_and_the_list_and_a_planted_symlink_is_not_followed(
    tmp_path, jobs_server, hub
):
    commit = hub.add_repo("org/tiny", FILES)
    agent, node_id, root_dir, root = online_agent_with_root(tmp_path, jobs_server, hub)
    done = wait_job(jobs_server, acquire(jobs_server, node_id, root["id"])["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    final = root_dir / "models" / "org" / "tiny" / commit
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.gguf").write_bytes(b"keep me")
    os.symlink(outside / "precious.gguf", final / "planted.gguf")
    os.symlink(outside, final / "planted-dir")

    asked = api(jobs_server, "DELETE", f"/api/v1/admin/artifacts/{done['result']['artifact_id']}")
    assert asked.status_code == 202, asked.text
    deleted = wait_job(jobs_server, asked.json()["id"], {"succeeded", "failed"})
    assert deleted["state"] == "succeeded", deleted
    assert deleted["result"]["removed_files"] == 4  # two files, the manifest, the link to a file
    assert deleted["result"]["freed_bytes"] >= sum(map(len, FILES.values()))
    assert not final.exists() and root_dir.is_dir()
    assert (outside / "precious.gguf").read_bytes() == b"keep me" and sorted(os.listdir(outside)) == ["precious.gguf"]
    assert api(jobs_server, "GET", f"/api/v1/admin/nodes/{node_id}/artifacts").json()["artifacts"] == []
    assert "artifact.delete.v1" in agent.log() and "removed 4 files" in agent.log()
    agent.stop()
