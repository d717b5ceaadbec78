"""artifact.delete.v1: remove one verified artifact's directory from this node's disk (J5).

The control plane queues it once nothing uses the artifact (`DELETE /api/v1/admin/artifacts/{id}`).
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelforge_node_agent import (
    ARTIFACT_PATH_UNSAFE,
    DELETE_JOB_TYPE,
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
