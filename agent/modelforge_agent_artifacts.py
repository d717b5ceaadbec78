"""The artifact lifecycle on this node's disk (J5): artifact.delete.v1, quarantine past its
retention, the partial directories of finished jobs, and what each storage root holds.

artifact.delete.v1 removes one verified artifact's directory. The control plane queues it once
nothing uses the artifact (`DELETE /api/v1/admin/artifacts/{id}`).
Only a directory below the artifact directory that holds this agent's modelforge-manifest.json
is removed: every directory on the way is opened without following a symlink, and the removal
walks directory descriptors (shutil.rmtree with dir_fd), so a symlink planted inside is unlinked,
never followed, and nothing outside the artifact is touched. A directory already gone is success
(a retried job, or files removed by hand): the artifact is gone either way.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from modelforge_node_agent import (
    ARTIFACT_PATH_UNSAFE,
    DELETE_JOB_TYPE,
    JOB_ID_PATTERN,
    JOB_PARAMS_INVALID,
    MANIFEST_NAME,
    O_DIR_NOFOLLOW,
    Config,
    Job,
    JobControl,
    JobFailure,
    Progress,
    open_dir_chain,
    read_json_at,
    register_job_type,
)


@dataclass(frozen=True)
class DeleteRequest:
    """The params of a delete: which artifact, and where the control plane says it lies."""

    artifact_id: str
    container_path: str

    @classmethod
    def from_params(cls, params: dict[str, object]) -> DeleteRequest:
        artifact_id, container_path = params.get("artifact_id"), params.get("container_path")
        if not isinstance(artifact_id, str) or not 0 < len(artifact_id) <= 128 or not artifact_id.isprintable():
            raise JobFailure(JOB_PARAMS_INVALID, "params.artifact_id must be the artifact's id", retryable=False)
        if not isinstance(container_path, str) or not os.path.isabs(container_path):
            raise JobFailure(
                JOB_PARAMS_INVALID, "params.container_path must be the artifact's absolute path", retryable=False
            )
        return cls(artifact_id, container_path)


def _unsafe(why: str) -> JobFailure:
    return JobFailure(ARTIFACT_PATH_UNSAFE, why, retryable=False)


def _counted(artifact_fd: int) -> tuple[int, int]:
    """Files and bytes below an open directory, walked by descriptor without following a symlink."""
    files = size = 0
    for _, _, names, folder_fd in os.fwalk(dir_fd=artifact_fd, follow_symlinks=False):
        for name in names:
            info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            files += 1
            size += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return files, size


def delete_artifact(request: DeleteRequest, artifact_dir: Path, control: JobControl) -> dict[str, object]:
    """Remove the artifact's directory; what was removed."""
    base = os.path.abspath(artifact_dir)
    base_parts = [part for part in base.split("/") if part]
    parts = [part for part in request.container_path.split("/") if part not in ("", ".")]
    if ".." in parts or parts[: len(base_parts)] != base_parts or len(parts) <= len(base_parts) + 1:
        # Below a storage root at least: never the artifact directory or a root itself.
        raise _unsafe(f"{request.container_path} is not an artifact directory below {artifact_dir}")
    *folders, name = parts[len(base_parts) :]
    base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            parent_fd = open_dir_chain(base_fd, folders, create=False)
        except FileNotFoundError:
            return {"artifact_id": request.artifact_id, "removed_files": 0, "freed_bytes": 0}
    finally:
        os.close(base_fd)
    try:
        try:
            artifact_fd = os.open(name, O_DIR_NOFOLLOW, dir_fd=parent_fd)
        except FileNotFoundError:
            return {"artifact_id": request.artifact_id, "removed_files": 0, "freed_bytes": 0}
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _unsafe(f"{request.container_path} is a symlink or a file, not an artifact directory") from None
            raise
        try:
            if read_json_at(artifact_fd, MANIFEST_NAME) is None:
                raise _unsafe(f"{request.container_path} has no {MANIFEST_NAME}: not an artifact this agent verified")
            files, size = _counted(artifact_fd)
        finally:
            os.close(artifact_fd)
        control.check()  # a cancel before anything is removed leaves it whole
        shutil.rmtree(name, dir_fd=parent_fd)
    finally:
        os.close(parent_fd)
    return {"artifact_id": request.artifact_id, "removed_files": files, "freed_bytes": size}


def run_delete_job(
    job: Job, config: Config, control: JobControl, on_progress: Callable[[Progress], None]
) -> dict[str, object]:
    """The artifact.delete.v1 handler."""
    request = DeleteRequest.from_params(job.params)
    on_progress(Progress(phase="deleting"))
    return delete_artifact(request, config.data_dirs["artifacts"], control)


def delete_summary(result: dict[str, object]) -> str:
    return f"removed {result.get('removed_files')} files, {result.get('freed_bytes')} bytes"


register_job_type(DELETE_JOB_TYPE, run_delete_job, delete_summary)


def prune_quarantine(quarantine_dir: Path, retention_seconds: float, now: float) -> list[str]:
    """J5: remove the quarantined attempts (`<quarantine>/<job id>-<attempt>/`) older than the
    retention, by when their reason.json was written; the names removed. Walked by descriptor
    like a delete: a symlink is never followed, and an entry that is not a directory is left."""
    try:
        top = os.open(quarantine_dir, O_DIR_NOFOLLOW)
    except FileNotFoundError:
        return []
    removed = []
    try:
        for entry in sorted(os.listdir(top)):
            try:
                entry_fd = os.open(entry, O_DIR_NOFOLLOW, dir_fd=top)
            except OSError:  # a file or a symlink: not an attempt this agent quarantined
                continue
            try:
                try:
                    written = os.stat("reason.json", dir_fd=entry_fd, follow_symlinks=False).st_mtime
                except FileNotFoundError:
                    written = os.fstat(entry_fd).st_mtime
            finally:
                os.close(entry_fd)
            if now - written > retention_seconds:
                shutil.rmtree(entry, dir_fd=top)
                removed.append(entry)
    finally:
        os.close(top)
    return removed


# --------------------------------------------------------------------------- storage use

# `<root>/.partial/<job_id>/` and `<root>/.partial/<job_id>.json` are an acquire's files until it
# ends (modelforge_agent_acquire.PartialDir); everything else below a root is artifacts. The
# quarantine is one directory for the whole node (MODELFORGE_AGENT_QUARANTINE_DIR), not per root.
PARTIAL_DIR = ".partial"
# J5: one measurement of every root and the quarantine looks at no more entries than this, and no
# deeper: what lies beyond is not counted, and the directories left unread say so (a lower bound).
MAX_USE_ENTRIES = 200_000
MAX_USE_DEPTH = 64
MAX_PARTIAL_JOBS = 64  # the control plane's bound on the job ids one root reports


@dataclass
class _Tally:
    """Bytes of regular files counted, and the directories that could not be read (or were not,
    the walk's bounds reached): a figure with unread directories is a lower bound."""

    bytes: int = 0
    unread_dirs: int = 0


@dataclass
class _Budget:
    entries: int = field(default_factory=lambda: MAX_USE_ENTRIES)


def _entries(dir_fd: int, tally: _Tally) -> Iterator[os.DirEntry]:
    """The entries of an open directory; one that cannot be listed is counted as unread."""
    try:
        with os.scandir(dir_fd) as listing:
            yield from listing
    except OSError:
        tally.unread_dirs += 1


def _count_entry(
    parent_fd: int, entry: os.DirEntry, tally: _Tally, skip: frozenset, budget: _Budget, depth: int
) -> None:
    """Add one entry: a regular file's size by lstat, a directory walked by descriptor (opened with
    O_NOFOLLOW below its parent, so a link swapped in is refused), a symlink neither followed nor counted."""
    budget.entries -= 1
    try:
        info = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return  # removed while we looked: nothing to count
    except OSError:
        tally.unread_dirs += 1
        return
    if stat.S_ISREG(info.st_mode):
        tally.bytes += info.st_size
        return
    if not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) in skip:
        return  # a link, device or pipe; or another root, or the quarantine, counted on its own
    if depth >= MAX_USE_DEPTH or budget.entries <= 0:
        tally.unread_dirs += 1
        return
    try:
        child = os.open(entry.name, O_DIR_NOFOLLOW, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    except OSError:  # unreadable, or a link put in its place since the listing
        tally.unread_dirs += 1
        return
    try:
        _count_dir(child, tally, skip, budget, depth + 1)
    finally:
        os.close(child)


def _count_dir(dir_fd: int, tally: _Tally, skip: frozenset, budget: _Budget, depth: int) -> None:
    for entry in _entries(dir_fd, tally):
        if budget.entries <= 0:
            tally.unread_dirs += 1  # this directory is left part read
            return
        _count_entry(dir_fd, entry, tally, skip, budget, depth)


def _identity(path: str | Path) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


def _root_use(root: str, skip: frozenset, budget: _Budget) -> dict[str, object]:
    """One root's `usage` for the heartbeat: artifacts and partials apart, and the job ids that
    have a partial directory or state file (J5: the control plane says which have ended)."""
    artifacts, partials, jobs = _Tally(), _Tally(), set()
    try:
        root_fd = os.open(root, O_DIR_NOFOLLOW)
    except OSError:  # gone or unreadable since it was observed: nothing is known of it
        return {
            "artifacts_bytes": None,
            "artifacts_unread_dirs": 0,
            "partials_bytes": None,
            "partials_unread_dirs": 0,
            "partial_jobs": [],
        }
    try:
        for entry in _entries(root_fd, artifacts):
            if entry.name != PARTIAL_DIR or not entry.is_dir(follow_symlinks=False):
                _count_entry(root_fd, entry, artifacts, skip, budget, 1)
                continue
            try:
                partials_fd = os.open(PARTIAL_DIR, O_DIR_NOFOLLOW, dir_fd=root_fd)
            except OSError:
                partials.unread_dirs += 1
                continue
            try:
                for item in _entries(partials_fd, partials):
                    job_id = item.name.removesuffix(".json")
                    if JOB_ID_PATTERN.fullmatch(job_id):
                        jobs.add(job_id)
                    _count_entry(partials_fd, item, partials, skip, budget, 2)
            finally:
                os.close(partials_fd)
    finally:
        os.close(root_fd)
    return {
        "artifacts_bytes": artifacts.bytes,
        "artifacts_unread_dirs": artifacts.unread_dirs,
        "partials_bytes": partials.bytes,
        "partials_unread_dirs": partials.unread_dirs,
        "partial_jobs": sorted(jobs)[:MAX_PARTIAL_JOBS],  # more go in a later report, once these are gone
    }


def _quarantine_use(quarantine_dir: Path, skip: frozenset, budget: _Budget) -> dict[str, object]:
    """The heartbeat's `quarantine_usage`: none yet is 0 (nothing ever failed verification), a
    directory that cannot be opened is unknown (None), never 0."""
    tally = _Tally()
    try:
        top = os.open(quarantine_dir, O_DIR_NOFOLLOW)
    except FileNotFoundError:
        return {"quarantine_bytes": 0, "quarantine_unread_dirs": 0}
    except OSError:
        return {"quarantine_bytes": None, "quarantine_unread_dirs": 0}
    try:
        _count_dir(top, tally, skip, budget, 1)
    finally:
        os.close(top)
    return {"quarantine_bytes": tally.bytes, "quarantine_unread_dirs": tally.unread_dirs}


@dataclass(frozen=True)
class StorageUse:
    """One measurement (J5): each root's `usage` by root id, the real path measured, and the quarantine's."""

    roots: dict[str, dict[str, object]]
    places: dict[str, str]
    quarantine: dict[str, object]


def measure_storage_use(roots: dict[str, str], quarantine_dir: Path) -> StorageUse:
    """Walk each root (id → its real path, already checked to lie below the artifact directory)
    and the quarantine with os.scandir on directory descriptors, never following a symlink, sizes
    by lstat. A root inside another, or the quarantine inside a root, is counted once, as itself."""
    identities = {root_id: _identity(path) for root_id, path in roots.items()}
    quarantine = _identity(quarantine_dir)
    budget = _Budget()
    measured = {}
    for root_id, path in roots.items():
        others = {identity for other, identity in identities.items() if other != root_id} | {quarantine}
        measured[root_id] = _root_use(path, frozenset(others - {None}), budget)
    return StorageUse(measured, dict(roots), _quarantine_use(quarantine_dir, frozenset(), budget))


def remove_partial(root: str, job_id: str) -> int:
    """J5: remove `<root>/.partial/<job_id>/` and its state file, of a job the control plane says
    has ended; the bytes freed. Reached through descriptors opened with O_NOFOLLOW: a `.partial`
    that is a link is never entered, a link in the job's place is unlinked, never followed, and
    nothing outside the root is touched."""
    if not JOB_ID_PATTERN.fullmatch(job_id):
        return 0
    root_fd = os.open(root, O_DIR_NOFOLLOW)
    try:
        try:
            partials_fd = os.open(PARTIAL_DIR, O_DIR_NOFOLLOW, dir_fd=root_fd)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return 0  # none, or a link where the directory belongs: nothing is removed through it
            raise
    finally:
        os.close(root_fd)
    freed = 0
    try:
        for name in (job_id, f"{job_id}.json"):
            try:
                info = os.stat(name, dir_fd=partials_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                job_fd = os.open(name, O_DIR_NOFOLLOW, dir_fd=partials_fd)
                try:
                    freed += _counted(job_fd)[1]
                finally:
                    os.close(job_fd)
                shutil.rmtree(name, dir_fd=partials_fd)
            else:
                freed += info.st_size if stat.S_ISREG(info.st_mode) else 0
                os.unlink(name, dir_fd=partials_fd)
    finally:
        os.close(partials_fd)
    return freed
