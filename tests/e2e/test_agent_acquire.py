"""artifact.acquire.v1 against a stand-in Hub over real loopback HTTP (J1, J3).

Nothing of the Hub is mocked: huggingface_hub and the agent's byte streaming talk to
tests/support/hub.py, which counts the bytes it serves and injects the faults. The job is run by
calling `acquire_artifact` directly with a progress callback and a JobControl, as the agent's
worker thread does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import modelforge_agent_acquire as acquire_job
import modelforge_node_agent as agent
from tests.support import PROJECT_ROOT
from tests.support.hub import HOSTILE_PATHS, STREAM_CHUNK, Generated, StandinHub

MiB = 1 << 20
TOKEN = "hf_" + "t0k3n" * 8
REPO = "org/model"
FILES = {
    "config.json": b'{"architectures": ["Llama"]}\n',
    "README.md": b"# a model\n",
    "tokenizer/vocab.txt": b"a\nb\nc\n",
    "weights/model.gguf": Generated(3 * MiB, seed=1),  # LFS by size and suffix
    "small.safetensors": b"\x00" * 1000,  # LFS by suffix only
    "notes/ignored.md": b"left out by ignore_patterns\n",
}


@pytest.fixture
def cdn():
    """A second host for LFS redirects that refuses any Authorization header, as S3 does."""
    with StandinHub(reject_authorization=True) as standin:
        yield standin


class Place:
    """The agent's directories in tmp_path: artifacts/registry is the storage root."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.artifacts = tmp_path / "artifacts"
        self.root = self.artifacts / "registry"
        self.quarantine = tmp_path / "quarantine"
        self.root.mkdir(parents=True)

    def final(self, commit: str, repo: str = REPO, kind: str = "models") -> Path:
        return self.root / kind / repo / commit

    def partial(self, job_id: str = "job-1") -> Path:
        return self.root / ".partial" / job_id

    def everything(self) -> set[str]:
        """Every path under tmp_path, to show nothing was written elsewhere."""
        return {str(path.relative_to(self.tmp)) for path in self.tmp.rglob("*")}


@pytest.fixture
def place(tmp_path) -> Place:
    return Place(tmp_path)


def acquire(
    hub_url: str,
    place: Place,
    *,
    job_id="job-1",
    attempt=1,
    token=None,
    stall=5.0,
    on_progress=None,
    control=None,
    root: Path | None = None,
    **params,
):
    """One attempt, as the worker runs it."""
    params = {"repo_id": REPO, "container_path": str(root or place.root), "min_free_bytes": 0, **params}
    return acquire_job.acquire_artifact(
        params,
        agent.HubSettings(endpoint=hub_url, token=token, stall_seconds=stall),
        artifact_dir=place.artifacts,
        quarantine_dir=place.quarantine,
        job_id=job_id,
        attempt=attempt,
        control=control,
        on_progress=on_progress,
    )


def failure_of(*args, **kwargs) -> agent.JobFailure:
    with pytest.raises(agent.JobFailure) as failed:
        acquire(*args, **kwargs)
    return failed.value


def content(hub: StandinHub, path: str, revision: str = "main") -> bytes:
    """The true bytes of a file, read back through the stand-in's own source."""
    hub_file = hub.file(REPO, path, revision)
    return b"".join(bytes(chunk) for chunk in hub_file.source.chunks(0, hub_file.size))


def file_requests(standin: StandinHub) -> list:
    return [record for record in standin.requests if "/resolve/" in record.path or "/cdn-lfs/" in record.path]


# --------------------------------------------------------------------------- the happy path


def test_a_branch_arrives_as_exactly_its_tree_verified_with_a_manifest_and_renamed_in_one_step(hub, place, caplog):
    commit = hub.add_repo(REPO, FILES)
    hub.commit(REPO, {"later.txt": b"not at this commit"}, branch="other")
    final = place.final(commit)
    seen = []

    def on_progress(progress):
        seen.append((progress, final.exists()))

    caplog.set_level(logging.INFO, logger="modelforge_node_agent")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent.log, "propagate", True)
        result = acquire(hub.url, place, on_progress=on_progress, ignore_patterns=["notes/*"])

    expected = sorted(path for path in FILES if not path.startswith("notes/"))
    total = sum(hub.file(REPO, path).size for path in expected)
    # S3: each .gguf's header as read on the node; this "model" is random bytes, so it says why not.
    not_gguf = {"problem": "the header cannot be read (GGUF magic invalid); the file may be cut short or not GGUF"}
    assert result == {
        "commit": commit,
        "container_path": str(final),
        "files": len(expected),
        "total_bytes": total,
        "models": {"weights/model.gguf": not_gguf},
    }
    on_disk = sorted(str(path.relative_to(final)) for path in final.rglob("*") if path.is_file())
    assert on_disk == sorted([*expected, agent.MANIFEST_NAME])
    for path in expected:
        assert (final / path).read_bytes() == content(hub, path), path
    manifest = json.loads((final / agent.MANIFEST_NAME).read_text())
    assert (manifest["repo_id"], manifest["repo_type"], manifest["revision"], manifest["commit"]) == (
        REPO,
        "model",
        "main",
        commit,
    )
    by_path = {item["path"]: item for item in manifest["files"]}
    assert sorted(by_path) == expected
    gguf, config = hub.file(REPO, "weights/model.gguf"), hub.file(REPO, "config.json")
    assert by_path["weights/model.gguf"] == {"path": "weights/model.gguf", "size": gguf.size, "sha256": gguf.sha256}
    assert by_path["config.json"] == {"path": "config.json", "size": config.size, "git_oid": config.blob_sha1}
    assert "sha256" in by_path["small.safetensors"]  # LFS by suffix: verified by its sha256
    assert not place.partial().exists() and not (place.root / ".partial" / "job-1.json").exists()
    # J3: nothing in the final place until every file is verified; the last report comes after the rename.
    assert [there for _, there in seen] == [False] * (len(seen) - 1) + [True]
    assert seen[-1][0] == agent.Progress(total, total, len(expected), len(expected))
    assert [p.bytes_done for p, _ in seen] == sorted(p.bytes_done for p, _ in seen)
    assert sum(f"{path} verified" in caplog.text for path in expected) == len(expected)  # a line per file
    # Every byte of every file at the commit, and nothing else.
    assert all(f"/resolve/{commit}/" in record.path for record in file_requests(hub))
    assert hub.bytes_served() - sum(r.bytes_sent for r in hub.requests if r.path.startswith("/api/")) == total


def test_a_dataset_goes_under_datasets(hub, place):
    commit = hub.add_repo("org/data", {"train.csv": b"a,b\n1,2\n"}, repo_type="dataset")
    result = acquire(hub.url, place, repo_id="org/data", repo_type="dataset")
    assert result["container_path"] == str(place.final(commit, "org/data", "datasets"))
    assert (place.final(commit, "org/data", "datasets") / "train.csv").read_bytes() == b"a,b\n1,2\n"


def test_moving_the_branch_mid_download_never_mixes_commits(hub, place):
    first = hub.add_repo(REPO, {"a.txt": b"first a", "weights/model.gguf": Generated(2 * MiB, seed=1)})
    moved = []

    def move_branch(progress):
        if progress.bytes_done and not moved:
            moved.append(hub.commit(REPO, {"a.txt": b"second a", "weights/model.gguf": Generated(2 * MiB, seed=2)}))

    result = acquire(hub.url, place, on_progress=move_branch)
    assert moved and hub.resolve(REPO) == moved[0] != first
    assert result["commit"] == first
    assert (place.final(first) / "a.txt").read_bytes() == b"first a"
    assert (place.final(first) / "weights/model.gguf").read_bytes() == content(hub, "weights/model.gguf", first)
    # A later job resolves the branch again and gets the new commit, beside the old one.
    assert acquire(hub.url, place, job_id="job-2")["commit"] == moved[0]
    assert (place.final(moved[0]) / "a.txt").read_bytes() == b"second a"


def test_an_artifact_already_in_place_succeeds_without_fetching_a_byte(hub, place):
    commit = hub.add_repo(REPO, FILES)
    first = acquire(hub.url, place)
    stamps = {path: path.stat().st_mtime_ns for path in place.final(commit).rglob("*")}
    hub.clear_requests()
    assert acquire(hub.url, place, job_id="job-2") == first
    assert file_requests(hub) == []  # only the revision and the tree were asked for
    assert {path: path.stat().st_mtime_ns for path in place.final(commit).rglob("*")} == stamps
    assert not place.partial("job-2").exists()


def test_a_directory_in_the_final_place_that_does_not_match_is_quarantined_and_replaced(hub, place):
    commit = hub.add_repo(REPO, {"a.txt": b"true bytes"})
    stray = place.final(commit)
    stray.mkdir(parents=True)
    (stray / "a.txt").write_bytes(b"someone else's")
    acquire(hub.url, place)
    assert (stray / "a.txt").read_bytes() == b"true bytes"
    (kept,) = place.quarantine.iterdir()
    assert (kept / "a.txt").read_bytes() == b"someone else's" and (kept / "reason.json").exists()


def test_cancel_stops_the_job_and_removes_its_partial_files(hub, place):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(4 * MiB)})
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=0.3)
    control = agent.JobControl()
    threading.Timer(0.1, control.cancel).start()
    failure = failure_of(hub.url, place, control=control)
    assert (failure.code, failure.retryable) == (agent.JOB_CANCELLED, False)
    assert not place.partial().exists() and not (place.root / ".partial" / "job-1.json").exists()
    assert not (place.root / "models").exists()


# --------------------------------------------------------------------------- verification and quarantine


@pytest.mark.parametrize("path", ["weights/model.gguf", "config.json"], ids=["lfs-sha256", "git-blob-sha1"])
def test_one_corrupted_byte_quarantines_the_attempt_with_its_evidence(hub, place, path):
    commit = hub.add_repo(REPO, FILES)
    true = hub.file(REPO, path)
    hub.corrupt(REPO, path, offset=true.size // 2)
    failure = failure_of(hub.url, place, attempt=2)
    assert (failure.code, failure.retryable) == (acquire_job.ARTIFACT_VERIFICATION_FAILED, True)
    assert not place.final(commit).exists() and not place.partial().exists()
    evidence = place.quarantine / "job-1-2"
    reason = json.loads((evidence / "reason.json").read_text())
    bad = bytearray(content(hub, path))
    bad[true.size // 2] ^= 0xFF
    if true.lfs:
        name, expected, actual = "sha256", true.sha256, hashlib.sha256(bad).hexdigest()
    else:
        name, expected, actual = "git_oid", true.blob_sha1, hashlib.sha1(b"blob %d\0" % len(bad) + bad).hexdigest()
    assert reason["file"] == path and reason["commit"] == commit and reason["at"].endswith("Z")
    assert (reason[f"expected_{name}"], reason[f"actual_{name}"]) == (expected, actual)
    assert reason["expected_size"] == reason["actual_size"] == true.size
    assert (evidence / path).read_bytes() == bytes(bad)  # never deleted
    # The next attempt starts clean and succeeds once the Hub serves the true bytes.
    hub.reset_faults()
    assert acquire(hub.url, place, attempt=3)["commit"] == commit
    assert (place.final(commit) / path).read_bytes() == content(hub, path)


def test_a_quarantine_that_cannot_move_keeps_the_evidence_and_closes_nothing_twice(hub, place, monkeypatch):
    commit = hub.add_repo(REPO, {"a.txt": b"true bytes", "b.txt": b"other bytes"})
    hub.corrupt(REPO, "a.txt", offset=3)
    closed, twice, real_open, real_dup, real_close = set(), [], agent.os.open, agent.os.dup, agent.os.close

    def recording_open(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        closed.discard(fd)
        return fd

    def recording_dup(fd):
        copy = real_dup(fd)
        closed.discard(copy)
        return copy

    def recording_close(fd):
        if fd in closed:
            twice.append(fd)
        closed.add(fd)
        real_close(fd)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(agent.os, "open", recording_open)
    monkeypatch.setattr(agent.os, "dup", recording_dup)
    monkeypatch.setattr(agent.os, "close", recording_close)
    monkeypatch.setattr(agent.shutil, "move", full_disk)
    failure = failure_of(hub.url, place, attempt=2)
    assert (failure.code, failure.retryable) == (acquire_job.STORAGE_CAPACITY_GUARD, False)
    assert "a.txt" in failure.message and str(place.partial()) in failure.message
    assert twice == []
    # The evidence stays where it was: nothing deleted, nothing in place, nothing half-quarantined.
    assert (place.partial() / "a.txt").exists() and (place.root / ".partial" / "job-1.json").exists()
    assert not place.final(commit).exists() and not list(place.quarantine.iterdir())


def test_a_closed_partial_directory_refuses_every_later_use(place):
    partial = acquire_job.PartialDir(str(place.root), "job-1")
    partial.create({"commit": "c"})
    partial.close()
    partial.close()  # a second close does nothing
    assert partial.closed and partial.fd is None
    for use in (partial.remove, partial.read_state, lambda: partial.write_manifest({}), lambda: partial.open_file("x")):
        with pytest.raises(ValueError):
            use()
    assert place.partial().is_dir()  # nothing was removed through it


# --------------------------------------------------------------------------- resume


def test_a_broken_transfer_resumes_with_range_and_the_next_attempt_fetches_only_the_rest(hub, place):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(6 * MiB, seed=3)})
    size = 6 * MiB
    # Every GET of the file breaks after 512 KiB: the attempt resumes at once three times, then
    # fails (retryable) with 2 MiB on disk.
    hub.drop("weights/model.gguf", after_bytes=512 * 1024, times=None)
    failure = failure_of(hub.url, place)
    assert (failure.code, failure.retryable) == (acquire_job.HUB_UNAVAILABLE, True)
    partial = place.partial() / "weights/model.gguf"
    assert partial.stat().st_size == 2 * MiB
    ranges = [record.headers.get("range") for record in file_requests(hub)]
    assert ranges == [None, "bytes=524288-", "bytes=1048576-", "bytes=1572864-"]
    first_run = hub.bytes_served("weights/model.gguf")

    hub.reset_faults()
    hub.clear_requests()
    acquire(hub.url, place, attempt=2)
    (resumed,) = file_requests(hub)
    assert resumed.headers["range"] == f"bytes={2 * MiB}-" and resumed.status == 206
    assert size <= first_run + hub.bytes_served("weights/model.gguf") <= size + STREAM_CHUNK


def test_a_resumed_attempt_keeps_the_commit_its_first_bytes_came_from(hub, place):
    first = hub.add_repo(REPO, {"weights/model.gguf": Generated(4 * MiB, seed=1)})
    hub.drop("weights/model.gguf", after_bytes=MiB // 2, times=None)
    assert failure_of(hub.url, place).retryable
    hub.reset_faults()
    hub.commit(REPO, {"weights/model.gguf": Generated(4 * MiB, seed=2)})
    assert acquire(hub.url, place, attempt=2)["commit"] == first
    assert (place.final(first) / "weights/model.gguf").read_bytes() == content(hub, "weights/model.gguf", first)


def test_a_sigkilled_agent_resumes_from_what_it_had_written(hub, place):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(8 * MiB, seed=4)})
    size = 8 * MiB
    hub.stall("weights/model.gguf", after_bytes=3 * MiB, seconds=60)  # holds the child mid-file
    script = (
        "import json, sys, pathlib, modelforge_node_agent as a, modelforge_agent_acquire as q\n"
        "args = json.loads(sys.argv[1])\n"
        "q.acquire_artifact(args['params'], a.HubSettings(endpoint=args['url'], stall_seconds=120),"
        " artifact_dir=pathlib.Path(args['artifacts']), quarantine_dir=pathlib.Path(args['quarantine']),"
        " job_id='job-1', attempt=1)\n"
    )
    args = {
        "url": hub.url,
        "params": {"repo_id": REPO, "container_path": str(place.root), "min_free_bytes": 0},
        "artifacts": str(place.artifacts),
        "quarantine": str(place.quarantine),
    }
    child = subprocess.Popen([sys.executable, "-c", script, json.dumps(args)], cwd=PROJECT_ROOT)
    partial = place.partial() / "weights/model.gguf"
    deadline = time.monotonic() + 20
    while not (partial.exists() and partial.stat().st_size >= 3 * MiB):
        assert time.monotonic() < deadline and child.poll() is None, "the child never wrote 3 MiB"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=5)
    written = partial.stat().st_size
    assert written == 3 * MiB

    hub.reset_faults()
    hub.clear_requests()
    result = acquire(hub.url, place, attempt=2)
    assert result["total_bytes"] == size
    assert hub.bytes_served("weights/model.gguf") == size - written  # only the unwritten tail
    assert (place.final(result["commit"]) / "weights/model.gguf").read_bytes() == content(hub, "weights/model.gguf")


# --------------------------------------------------------------------------- Hub failures


@pytest.mark.parametrize(
    "target",
    ["/api/models/org/model/revision/main", "weights/model.gguf"],
    ids=["revision-api", "file"],
)
def test_a_hub_5xx_is_retryable_hub_unavailable(hub, place, target):
    hub.add_repo(REPO, FILES)
    hub.fail_next(1, 503, path=target)
    failure = failure_of(hub.url, place)
    assert (failure.code, failure.retryable) == (acquire_job.HUB_UNAVAILABLE, True)
    assert "HTTP 503" in failure.message


def test_a_stall_with_no_byte_fails_the_attempt_retryable_and_one_after_progress_resumes(hub, place):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(2 * MiB)})
    hub.stall("weights/model.gguf", after_bytes=0, seconds=3)
    started = time.monotonic()
    failure = failure_of(hub.url, place, stall=0.4)
    assert time.monotonic() - started < 2.5
    assert (failure.code, failure.retryable) == (acquire_job.HUB_UNAVAILABLE, True)
    assert "stalled: no byte for 0.4s" in failure.message
    assert place.partial().exists()  # retryable: kept for the next attempt

    hub.reset_faults()
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=3)
    assert acquire(hub.url, place, attempt=2, stall=0.4)["files"] == 1


def test_the_stall_limit_holds_for_the_hubs_api_too(hub, place):
    # huggingface_hub's shared client waits forever; each of the agent's calls carries the limit.
    commit = hub.add_repo(REPO, FILES)
    hub.stall(f"/api/models/{REPO}/revision/main", after_bytes=0, seconds=30)
    started = time.monotonic()
    failure = failure_of(hub.url, place, stall=0.4)
    assert time.monotonic() - started < 5
    assert (failure.code, failure.retryable) == (acquire_job.HUB_UNAVAILABLE, True)
    assert "did not answer within 0.4s" in failure.message

    # A tree listing that stalls is cut off too, and asked again (huggingface_hub's retry).
    hub.reset_faults()
    hub.stall(f"/api/models/{REPO}/tree/{commit}", after_bytes=0, seconds=30)
    started = time.monotonic()
    assert acquire(hub.url, place, attempt=2, stall=0.4)["commit"] == commit
    assert time.monotonic() - started < 15  # not the stall's 30 s
    assert len([record for record in hub.requests if record.path == f"/api/models/{REPO}/tree/{commit}"]) == 2


def test_an_unreachable_hub_is_retryable(place):
    with StandinHub() as gone:
        url = gone.url
    failure = failure_of(url, place)
    assert (failure.code, failure.retryable) == (acquire_job.HUB_UNAVAILABLE, True)


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("missing-anonymous", acquire_job.HUB_REPO_NOT_FOUND),
        ("missing-with-token", acquire_job.HUB_REPO_NOT_FOUND),
        ("private-anonymous", acquire_job.HUB_REPO_NOT_FOUND),
        ("bad-revision", acquire_job.HUB_REVISION_NOT_FOUND),
        ("gated-anonymous", acquire_job.HUB_AUTH_REQUIRED),
        ("gated-wrong-token", acquire_job.HUB_AUTH_REQUIRED),
    ],
)
def test_hub_refusals_have_their_codes_and_are_not_retried(hub, place, case, code):
    hub.add_repo(
        REPO,
        FILES,
        gated=case.startswith("gated"),
        private=case.startswith("private"),
        token=TOKEN if case.startswith(("gated", "private")) else None,
    )
    repo_id = "org/nothing" if case.startswith("missing") else REPO
    token = "hf_wrong" if case.endswith("token") else None
    revision = "no-such-branch" if case == "bad-revision" else "main"
    failure = failure_of(hub.url, place, repo_id=repo_id, revision=revision, token=token)
    assert (failure.code, failure.retryable) == (code, False)
    assert not place.partial().exists() and not (place.root / "models").exists()
    assert "hf_wrong" not in failure.message


# --------------------------------------------------------------------------- the token


def test_the_token_goes_to_the_hub_only_never_to_the_cdn_a_log_or_the_result(hub, cdn, place, caplog):
    commit = hub.add_repo(REPO, FILES, gated=True, token=TOKEN)
    caplog.set_level(logging.DEBUG)  # every logger: ours, huggingface_hub, httpx2, urllib3
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent.log, "propagate", True)
        hub.corrupt(REPO, "config.json", offset=0)
        failure = failure_of(hub.url, place, token=TOKEN)
        hub.reset_faults()
        hub.redirect_lfs_to(cdn)
        result = acquire(hub.url, place, token=TOKEN, attempt=2)
    assert failure.code == acquire_job.ARTIFACT_VERIFICATION_FAILED
    assert [record.headers.get("authorization") for record in hub.requests] == [f"Bearer {TOKEN}"] * len(hub.requests)
    lfs = [record for record in cdn.requests if "/cdn-lfs/" in record.path]
    assert len(lfs) == 2 and all(record.status == 200 for record in lfs)  # the gguf and the safetensors
    assert all("authorization" not in record.headers for record in cdn.requests)
    assert TOKEN not in caplog.text and "t0k3n" not in caplog.text
    assert TOKEN not in json.dumps(result) + failure.message
    assert TOKEN not in repr(agent.HubSettings(token=TOKEN))
    written = [path.read_bytes() for path in place.tmp.rglob("*") if path.is_file()]
    assert len(written) > len(FILES) and not any(TOKEN.encode() in data for data in written)  # reason.json too
    assert (place.final(commit) / "weights/model.gguf").read_bytes() == content(hub, "weights/model.gguf")


# --------------------------------------------------------------------------- capacity (J1)


def test_the_capacity_guard_refuses_before_the_first_byte(hub, place):
    hub.add_repo(REPO, FILES)
    free = os.statvfs(place.root).f_bavail * os.statvfs(place.root).f_frsize
    failure = failure_of(hub.url, place, min_free_bytes=free + 10**12)
    assert (failure.code, failure.retryable) == (acquire_job.STORAGE_CAPACITY_GUARD, False)
    assert "min_free_bytes" in failure.message
    assert file_requests(hub) == [] and list(place.root.iterdir()) == []


@pytest.fixture
def small_filesystem(tmp_path):
    """An 8 MiB tmpfs inside the artifact directory; None where mounting is impossible."""
    mount = tmp_path / "artifacts" / "small"
    mount.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_the_capacity_guard_stops_a_download_when_the_root_fills_up_while_it_writes(
    hub, place, small_filesystem, monkeypatch
):
    hub.add_repo(REPO, {"weights/model.gguf": Generated(5 * MiB)})
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=0.5)
    if small_filesystem is not None:
        root = small_filesystem / "registry"
        root.mkdir()
        filler = small_filesystem / "filler"
    else:
        # Fallback where tmpfs cannot be mounted (not root): the same story told by statvfs.
        root, filler = place.root, None
        real_statvfs, lost = os.statvfs, []

        def statvfs(path):
            stats = real_statvfs(path)
            fake = [0] * 10
            fake[0] = fake[1] = 4096
            fake[2] = (8 * MiB) // 4096
            fake[4] = (8 * MiB - sum(lost) - sum(p.stat().st_size for p in root.rglob("*") if p.is_file())) // 4096
            return type(stats)(fake)

        monkeypatch.setattr(agent.os, "statvfs", statvfs)
    partial = root / ".partial" / "job-1" / "weights" / "model.gguf"

    def fill_up_mid_download():
        while not (partial.exists() and partial.stat().st_size >= MiB):
            time.sleep(0.01)
        if filler is not None:
            filler.write_bytes(b"\0" * (5 * MiB // 2))
        else:
            lost.append(5 * MiB // 2)

    filling = threading.Thread(target=fill_up_mid_download, daemon=True)
    filling.start()
    before = place.everything() - {str(p.relative_to(place.tmp)) for p in root.rglob("*")}
    failure = failure_of(hub.url, place, root=root, min_free_bytes=MiB)
    filling.join(timeout=5)
    assert (failure.code, failure.retryable) == (acquire_job.STORAGE_CAPACITY_GUARD, False)
    assert not (root / ".partial" / "job-1").exists() and not (root / "models").exists()
    outside = place.everything() - {str(p.relative_to(place.tmp)) for p in root.rglob("*")}
    assert outside - before <= ({"artifacts/small/filler"} if filler else set())  # nothing else, nowhere else


def test_a_root_outside_the_artifact_directory_or_missing_is_unavailable(hub, place, tmp_path):
    hub.add_repo(REPO, FILES)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (place.artifacts / "sneaky").symlink_to(outside)
    for root, reason in [
        (place.artifacts / "sneaky", "is a symlink"),
        (place.artifacts / "missing" / "deeper", "parent missing"),
        (outside, "outside the artifact directory"),
    ]:
        failure = failure_of(hub.url, place, root=root)
        assert (failure.code, failure.retryable) == (acquire_job.STORAGE_ROOT_UNAVAILABLE, False)
        assert failure.message.startswith(f"storage root {reason}")
    assert list(outside.iterdir()) == [] and hub.requests == [] and not (place.artifacts / "missing").exists()


def test_a_missing_root_below_a_writable_parent_is_made_and_the_model_lands_in_it(hub, place):
    """J1: a job queued before the agent's first look at its root makes the root, as a heartbeat would."""
    commit = hub.add_repo(REPO, FILES)
    root = place.artifacts / "fresh"
    result = acquire(hub.url, place, root=root)
    assert result["commit"] == commit and (root / "models" / REPO / commit / "config.json").is_file()


# --------------------------------------------------------------------------- hostile trees and links


@pytest.mark.parametrize("hostile", [*HOSTILE_PATHS, "nul\0byte", "a//b", "bad\nline", agent.MANIFEST_NAME])
def test_a_hostile_tree_entry_is_refused_before_anything_is_written(hub, place, hostile):
    hub.add_repo(REPO, FILES)
    hub.hostile_tree(REPO, [{"path": hostile}])
    before = place.everything()
    failure = failure_of(hub.url, place)
    assert (failure.code, failure.retryable) == (agent.ARTIFACT_PATH_UNSAFE, False)
    assert file_requests(hub) == []
    assert place.everything() == before and not (place.tmp.parent / "evil").exists()


def test_the_default_hostile_tree_and_a_file_where_a_directory_belongs_are_refused(hub, place):
    hub.add_repo(REPO, FILES)
    hub.hostile_tree(REPO)
    assert failure_of(hub.url, place).code == agent.ARTIFACT_PATH_UNSAFE
    hub.reset_faults()
    hub.hostile_tree(REPO, [{"path": "config.json/inner"}])
    assert failure_of(hub.url, place).code == agent.ARTIFACT_PATH_UNSAFE
    assert file_requests(hub) == []


@pytest.mark.parametrize(
    "entry",
    [
        {"path": "w.bin", "lfs": {"oid": "not-a-sha256", "size": 5, "pointerSize": 130}},
        {"path": "w.bin", "size": 5, "lfs": {"oid": "a" * 64, "size": 6, "pointerSize": 130}},
        {"path": "plain.txt", "oid": "not-a-blob-id"},
        {"path": "plain.txt", "size": -1},
    ],
    ids=["bad-sha256", "lfs-size-disagrees", "bad-blob-id", "negative-size"],
)
def test_a_tree_entry_without_a_usable_hash_or_size_is_refused(hub, place, entry):
    hub.add_repo(REPO, FILES)
    hub.hostile_tree(REPO, [entry])
    failure = failure_of(hub.url, place)
    assert (failure.code, failure.retryable) == (acquire_job.HUB_TREE_INVALID, False)
    assert file_requests(hub) == [] and list(place.root.iterdir()) == []


@pytest.mark.parametrize("where", ["file", "directory", "partial-dir", "dot-partial", "final-parent"])
def test_a_planted_symlink_is_refused_never_followed(hub, place, tmp_path, where):
    hub.add_repo(REPO, FILES)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("keep me")
    (outside / "weights").mkdir()
    partial = place.partial()
    if where == "file":
        partial.mkdir(parents=True)
        (partial / "config.json").symlink_to(outside / "config.json")
    elif where == "directory":
        partial.mkdir(parents=True)
        (partial / "weights").symlink_to(outside / "weights")
    elif where == "partial-dir":
        partial.parent.mkdir()
        partial.symlink_to(outside)
    elif where == "dot-partial":
        (place.root / ".partial").symlink_to(outside)
        (outside / "job-1").mkdir()
    else:
        (place.root / "models").symlink_to(outside)
    failure = failure_of(hub.url, place)
    assert (failure.code, failure.retryable) == (agent.ARTIFACT_PATH_UNSAFE, False)
    assert (outside / "config.json").read_text() == "keep me"
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == sorted(
        ["config.json", "weights", *(["job-1"] if where == "dot-partial" else [])]
    )
