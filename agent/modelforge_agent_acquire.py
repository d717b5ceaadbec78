"""artifact.acquire.v1, the node agent's job family that fetches a Hub repository (J1, J3).

One attempt resolves the revision to a commit, lists the tree at it, checks the storage root's
capacity, and fetches every file into `<root>/.partial/<job_id>/` (resuming with Range what an
earlier attempt wrote), hashing each byte as it is written against the hash the Hub recorded;
then renames the whole directory to `<root>/<repo_type>s/<owner>/<name>/<commit>/` in one step.
A file that does not match sends the attempt's files to quarantine, never deleted by the attempt
(the agent removes them after MODELFORGE_AGENT_QUARANTINE_RETENTION_DAYS: modelforge_agent_artifacts).

The core (modelforge_node_agent) imports this module only when it claims the first acquire job,
so huggingface_hub and its transport load with it; the module registers its handler at the bottom.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

import huggingface_hub
import requests
import requests.adapters
import urllib3
import urllib3.connection
from huggingface_hub import utils as hub_utils
from huggingface_hub.hf_api import RepoFile, RepoFolder

from modelforge_agent_gguf import describe_models
from modelforge_node_agent import (
    ACQUIRE_JOB_TYPE,
    AGENT_VERSION,
    ARTIFACT_PATH_UNSAFE,
    JOB_ID_PATTERN,
    JOB_PARAMS_INVALID,
    MANIFEST_NAME,
    O_DIR_NOFOLLOW,
    Config,
    HubSettings,
    Job,
    JobControl,
    JobFailure,
    Progress,
    is_safe_relative_path,
    log,
    open_dir_chain,
    read_json_at,
    register_job_type,
    rfc3339_now,
    root_problem,
    writable_dir,
)

# J2: the error codes of this job type.
STORAGE_CAPACITY_GUARD = "STORAGE_CAPACITY_GUARD"
STORAGE_ROOT_UNAVAILABLE = "STORAGE_ROOT_UNAVAILABLE"
HUB_REPO_NOT_FOUND = "HUB_REPO_NOT_FOUND"
HUB_REVISION_NOT_FOUND = "HUB_REVISION_NOT_FOUND"
HUB_AUTH_REQUIRED = "HUB_AUTH_REQUIRED"
HUB_UNAVAILABLE = "HUB_UNAVAILABLE"
HUB_TREE_INVALID = "HUB_TREE_INVALID"
ARTIFACT_VERIFICATION_FAILED = "ARTIFACT_VERIFICATION_FAILED"

DOWNLOAD_CHUNK_BYTES = 1 << 20
CAPACITY_CHECK_BYTES = 4 << 20  # J1: statvfs again after every 4 MiB written
TRANSFER_RETRIES = 3  # a transfer that broke after making progress resumes at once, this often per file

REPO_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
MAX_REDIRECTS = 10
TOKEN_HINT = "set MODELFORGE_HF_TOKEN to a token that has access"
CONNECT_TIMEOUT_SECONDS = 10.0

# J2, J3: what a slow, broken or hostile Hub can make an attempt do, and no more. Each API call
# (the revision lookup, or the whole tree listing with its pages and retries) ends by
# HubSettings.deadline_seconds (MODELFORGE_AGENT_HUB_DEADLINE_SECONDS; the core's
# HUB_DEADLINE_SECONDS by default); a Retry-After is slept for at most
# HUB_RETRY_AFTER_MAX_SECONDS and never past that deadline; a listing of more pages or entries
# than below is refused (HUB_TREE_INVALID, not retried), so memory stays bounded; and a cancel
# (or a lost lease) cuts any wait or read, file bytes included, within GUARD_POLL_SECONDS of the
# progress reporter hearing of it (HubGuard).
HUB_RETRY_AFTER_MAX_SECONDS = 60.0
HUB_API_RETRIES = 4  # a tree page that timed out or got 408/429/5xx is asked again at most this often
HUB_RETRY_BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0)  # between those, when the Hub names no Retry-After
MAX_TREE_PAGES = 1000  # the Hub pages at 1000 entries
MAX_TREE_ENTRIES = 100_000  # files and folders of one listing, before the patterns filter it
MAX_API_ANSWER_BYTES = 16 << 20  # one API answer (the revision's info or a tree page), decoded
API_READ_BYTES = 64 << 10
GUARD_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class AcquireRequest:
    """The params of an artifact.acquire.v1 job (J3), each checked before anything is fetched."""

    repo_id: str
    revision: str
    repo_type: str
    container_path: str
    min_free_bytes: int
    storage_root_id: str | None = None
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None

    @classmethod
    def from_params(cls, params: dict[str, object]) -> AcquireRequest:
        """Check the params; a bad one fails the job (not retryable) naming the field."""

        def bad(name: str, rule: str) -> JobFailure:
            return JobFailure(JOB_PARAMS_INVALID, f"params.{name} {rule}", retryable=False)

        repo_id = params.get("repo_id")
        if not isinstance(repo_id, str) or not REPO_ID_PATTERN.fullmatch(repo_id) or ".." in repo_id:
            raise bad("repo_id", "must be owner/name (letters, digits, '.', '_', '-')")
        revision = params.get("revision") if params.get("revision") is not None else "main"
        if not isinstance(revision, str) or not 0 < len(revision) <= 255 or not revision.isprintable():
            raise bad("revision", "must be a branch, tag or commit")
        repo_type = params.get("repo_type") if params.get("repo_type") is not None else "model"
        if repo_type not in ("model", "dataset"):
            raise bad("repo_type", "must be model or dataset")
        container_path = params.get("container_path")
        if not isinstance(container_path, str) or not os.path.isabs(container_path):
            raise bad("container_path", "must be the storage root's absolute path in the agent's container")
        minimum = params.get("min_free_bytes", 0)
        if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 0:
            raise bad("min_free_bytes", "must be a whole number of bytes")
        root_id = params.get("storage_root_id")
        patterns = {}
        for name in ("allow_patterns", "ignore_patterns"):
            value = params.get(name)
            if isinstance(value, str):
                value = [value]
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(item, str) and item for item in value)
            ):
                raise bad(name, "must be a list of glob patterns or null")
            patterns[name] = value
        return cls(
            repo_id=repo_id,
            revision=revision,
            repo_type=repo_type,
            container_path=container_path,
            min_free_bytes=minimum,
            storage_root_id=str(root_id) if root_id is not None else None,
            **patterns,
        )

    def final_parts(self, commit: str) -> list[str]:
        """`<repo_type>s/<owner>/<name>/<commit>`, the artifact's place below the root."""
        return [f"{self.repo_type}s", *self.repo_id.split("/"), commit]


@dataclass(frozen=True)
class RemoteFile:
    """One file of the tree at the commit and the hash the Hub recorded for it: sha256 for LFS
    files, the git blob id (sha1 of `blob <size>\\0` + content) for the rest (J3)."""

    path: str
    size: int
    algorithm: str  # "sha256" or "git-sha1"
    digest: str

    def new_hash(self):
        """A hasher that yields `digest` once fed exactly this file's bytes."""
        if self.algorithm == "sha256":
            return hashlib.sha256()
        return hashlib.sha1(b"blob %d\0" % self.size, usedforsecurity=False)

    @property
    def hash_name(self) -> str:
        """What the manifest and reason.json call the hash: `sha256` or `git_oid`."""
        return "sha256" if self.algorithm == "sha256" else "git_oid"

    def manifest_entry(self) -> dict[str, object]:
        """How modelforge-manifest.json lists the file."""
        return {"path": self.path, "size": self.size, self.hash_name: self.digest}


def safe_repo_path(path: object) -> str:
    """A path from the Hub, checked before any use (J3): a safe relative path (the core's
    is_safe_relative_path), not the manifest's own name."""
    if not isinstance(path, str) or not path:
        raise JobFailure(ARTIFACT_PATH_UNSAFE, "the Hub listed a file without a path", retryable=False)
    shown = ascii(path)[:300]
    if not is_safe_relative_path(path):
        raise JobFailure(
            ARTIFACT_PATH_UNSAFE,
            f"the Hub listed the unsafe path {shown}; nothing was written for it",
            retryable=False,
        )
    if path == MANIFEST_NAME:
        raise JobFailure(
            ARTIFACT_PATH_UNSAFE, f"the repository holds {MANIFEST_NAME}, a name the agent keeps", retryable=False
        )
    return path


def remote_file(entry) -> RemoteFile:
    """A huggingface_hub RepoFile as a RemoteFile, or HUB_TREE_INVALID when it has no usable size or hash."""
    path = safe_repo_path(entry.path)
    size, lfs, blob_id = entry.size, entry.lfs, entry.blob_id
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise JobFailure(HUB_TREE_INVALID, f"the Hub recorded no size for {path}", retryable=False)
    if lfs is not None:
        digest = lfs.get("sha256") if isinstance(lfs, dict) else None
        if not isinstance(digest, str) or not SHA256_PATTERN.fullmatch(digest) or lfs.get("size") != size:
            raise JobFailure(HUB_TREE_INVALID, f"the Hub recorded no usable sha256 for {path}", retryable=False)
        return RemoteFile(path, size, "sha256", digest)
    if not isinstance(blob_id, str) or not COMMIT_PATTERN.fullmatch(blob_id):
        raise JobFailure(HUB_TREE_INVALID, f"the Hub recorded no usable git blob id for {path}", retryable=False)
    return RemoteFile(path, size, "git-sha1", blob_id)


def tree_page_files(page: list[object], what: str) -> list[RemoteFile]:
    """The files of one tree page, every entry checked (folders too: never created from the
    listing, but a hostile one is refused)."""
    try:
        entries = [RepoFile(**item) if item["type"] == "file" else RepoFolder(**item) for item in page]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        message = f"{what}: an entry lacks a field huggingface_hub needs ({type(error).__name__})"
        raise JobFailure(HUB_TREE_INVALID, message, retryable=False) from None
    for entry in entries:
        if not isinstance(entry, RepoFile):
            safe_repo_path(entry.path)
    return [remote_file(entry) for entry in entries if isinstance(entry, RepoFile)]


def refuse_conflicts(files: list[RemoteFile]) -> None:
    """Two entries for one path, or a file where another needs a directory, is a hostile tree."""
    paths = [remote.path for remote in files]
    if len(set(paths)) != len(paths):
        raise JobFailure(ARTIFACT_PATH_UNSAFE, "the Hub listed one path twice", retryable=False)
    taken = set(paths)
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in taken:
                message = f"the Hub listed {ascii(path)[:300]} below the file {ascii('/'.join(parts[:depth]))[:300]}"
                raise JobFailure(ARTIFACT_PATH_UNSAFE, message, retryable=False)


def origin_of(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port: the token goes only where these equal the Hub endpoint's."""
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # not a port: no origin of ours
        port = -1
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def shown_origin(url: str) -> str:
    """`scheme://host:port` of a URL for an error: never its user, path or query."""
    scheme, host, port = origin_of(url)
    return f"{scheme}://{host}:{port}"


def describe_url(method: str, url: str) -> str:
    """`GET host/path` for logs and errors: never the query (signed CDN URLs carry credentials there)."""
    parts = urlsplit(url)
    return f"{method} {parts.hostname}{parts.path}"


# What reading from the Hub may raise when the connection breaks, stalls or is cut by the guard;
# and which of those are a stall.
BODY_ERRORS = (urllib3.exceptions.HTTPError, requests.exceptions.RequestException, OSError)
STALL_ERRORS = (requests.exceptions.Timeout, urllib3.exceptions.ReadTimeoutError)


def retry_after(response) -> float | None:
    """An answer's Retry-After in seconds (infinite for an absurdly long number), or None when
    absent or not a number of seconds (then the agent's own backoff applies)."""
    value = response.headers.get("Retry-After", "").strip()
    if not re.fullmatch(r"[0-9]+", value):
        return None
    return float(value) if len(value) <= 12 else float("inf")


class HubGuard:
    """Cuts the Hub client's connections when the job must stop (cancel, lost lease, agent
    stopping: the JobControl the progress reporter sets) or the API call under way passes its
    deadline. A read blocked on a silent or dripping Hub then ends at once instead of after the
    stall limit, so a cancel lands within one progress interval (J2). One daemon thread per
    client, looking every GUARD_POLL_SECONDS, until close()."""

    def __init__(self, control: JobControl) -> None:
        self.control = control
        self.deadline: float | None = None  # time.monotonic() by which the API call under way ends
        self._sockets: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="hub-guard", daemon=True).start()

    def track(self, sock: socket.socket) -> None:
        """A connection's socket, once connected; cut at once if the job already must stop."""
        with self._lock:
            self._sockets.add(sock)
        if self.control.stopped.is_set():
            self.cut()

    def start_call(self, seconds: float) -> float:
        """An API call begins: its deadline (time.monotonic()), enforced until end_call()."""
        self.deadline = time.monotonic() + seconds
        return self.deadline

    def end_call(self) -> None:
        self.deadline = None

    def cut(self) -> None:
        """Shut every socket down: a read blocked on it returns, the connection is not reused."""
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        while not self._closed.wait(GUARD_POLL_SECONDS):
            if self.control.stopped.is_set():
                self.cut()
                return  # track() cuts any later socket itself
            deadline = self.deadline
            if deadline is not None and time.monotonic() >= deadline:
                self.cut()


class _GuardedConnection:
    """Mixed into urllib3's connections: the socket goes to the HubGuard once connected."""

    def __init__(self, *args, modelforge_guard: HubGuard, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.modelforge_guard = modelforge_guard

    def connect(self) -> None:
        super().connect()
        self.modelforge_guard.track(self.sock)


class _GuardedHTTPConnection(_GuardedConnection, urllib3.connection.HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnection, urllib3.connection.HTTPSConnection):
    pass


class _GuardedAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter whose connection pools (direct or through a proxy) make guarded connections."""

    def __init__(self, guard: HubGuard) -> None:
        self.guard = guard
        super().__init__()

    def guarded(self, pool):
        """The pool, its connections from now on guarded ones."""
        if pool.conn_kw.get("modelforge_guard") is not self.guard:
            https = isinstance(pool, urllib3.HTTPSConnectionPool)
            pool.ConnectionCls = _GuardedHTTPSConnection if https else _GuardedHTTPConnection
            pool.conn_kw["modelforge_guard"] = self.guard
        return pool

    def get_connection_with_tls_context(self, *args, **kwargs):  # requests >= 2.32.2
        return self.guarded(super().get_connection_with_tls_context(*args, **kwargs))

    def get_connection(self, *args, **kwargs):  # requests 2.31
        return self.guarded(super().get_connection(*args, **kwargs))


class HubClient:
    """The Hugging Face Hub over requests (J3): the revision lookup, the tree listing and the
    files' bytes, so each file is hashed as it is written and resumed with Range. huggingface_hub
    only builds the headers and URLs, reads the tree entries and filters them.

    Every call is bounded (J2): a read waits at most the stall limit, an API call (the revision
    lookup, or the whole listing) ends by the deadline, and the guard cuts any of them when the
    job must stop. The token goes only to the Hub endpoint's own origin: redirects are followed by
    hand, and an API answer or tree page from another origin is refused before anything is sent."""

    def __init__(self, hub: HubSettings, control: JobControl | None = None) -> None:
        self.hub = hub
        self.control = control or JobControl()
        self.headers = hub_utils.build_hf_headers(
            token=hub.token or False,  # False: never a token from ~/.cache or HF_TOKEN, only ours
            library_name="modelforge-node-agent",
            library_version=AGENT_VERSION,
        )
        self.origin = origin_of(hub.endpoint)
        self.guard = HubGuard(self.control)
        self.session = requests.Session()
        adapter = _GuardedAdapter(self.guard)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def close(self) -> None:
        """Stop the guard and release the session's connections."""
        self.guard.close()
        self.session.close()

    def open(self, url: str, *, params=None, headers=None, read_timeout: float, foreign=None):
        """GET `url` (streamed), following redirects by hand so the token goes only to the Hub
        endpoint's own origin (J3). `foreign(url)` is the failure for a URL off that origin when
        the answer must be the Hub's own (the API); without it, one is fetched without the token
        (a file's LFS CDN)."""
        headers = dict(self.headers if headers is None else headers)
        token = {name: value for name, value in headers.items() if name.lower() == "authorization"}
        plain = {name: value for name, value in headers.items() if name.lower() != "authorization"}
        for _ in range(MAX_REDIRECTS):
            own = origin_of(url) == self.origin
            if not own and foreign is not None:
                raise foreign(url)
            response = self.session.get(
                url,
                params=params,
                headers={**plain, **(token if own else {})},
                stream=True,
                allow_redirects=False,
                timeout=(CONNECT_TIMEOUT_SECONDS, read_timeout),
            )
            location = response.headers.get("Location")
            if response.status_code not in (301, 302, 303, 307, 308) or not location:
                return response
            response.close()
            url, params = urljoin(response.url, location), None
        message = f"more than {MAX_REDIRECTS} redirects for {describe_url('GET', url)}"
        raise JobFailure(HUB_UNAVAILABLE, message, retryable=True)

    def api_get(
        self,
        url: str,
        what: str,
        *,
        deadline: float,
        retries: int,
        invalid: Callable[[str], JobFailure],
        params: dict[str, str] | None = None,
    ) -> tuple[requests.Response, bytes]:
        """One Hub API answer (200) and its body, before `deadline` (time.monotonic()).

        A 408, 429 or 5xx answer and a broken or stalled read are asked again up to `retries`
        times, after what Retry-After says (at most HUB_RETRY_AFTER_MAX_SECONDS) or the backoff,
        and never past the deadline; the job's cancel is checked before each request and wait.
        `invalid(message)` is the failure for an answer that is not the Hub's (another origin,
        too large)."""
        tries = 0
        while True:
            self.control.check()
            wanted: float | None = None
            try:
                response, body = self._api_answer(url, what, params, deadline, invalid)
            except BODY_ERRORS as error:
                self.control.check()  # a cut connection is the job stopping, when it is
                failure = self.transport_failure(error, what, deadline)
            else:
                if response.status_code == 200:
                    return response, body
                failure, wanted = self.refusal(response, what), retry_after(response)
            if not failure.retryable or tries >= retries or time.monotonic() >= deadline:
                raise failure
            wait = HUB_RETRY_BACKOFF_SECONDS[min(tries, len(HUB_RETRY_BACKOFF_SECONDS) - 1)]
            said = ""
            if wanted is not None:
                wait = min(wanted, HUB_RETRY_AFTER_MAX_SECONDS)
                said = f"; the Hub asked to wait {wanted:g}s (Retry-After)"
            left = deadline - time.monotonic()
            if wait >= left:
                limit = self.hub.deadline_seconds
                message = f"{failure.message}{said}, more than the {limit:g}s deadline leaves ({left:.1f}s)"
                raise JobFailure(failure.code, message, retryable=True)
            tries += 1
            log.warning("%s%s; waiting %gs, then asking again (%d of %d)", failure.message, said, wait, tries, retries)
            self.control.wait(wait)

    def _api_answer(self, url, what, params, deadline, invalid) -> tuple[requests.Response, bytes]:
        """GET one answer; the body of a 200, read to at most MAX_API_ANSWER_BYTES."""
        read_timeout = max(0.05, min(self.hub.stall_seconds, deadline - time.monotonic()))

        def foreign(where: str) -> JobFailure:
            return invalid(f"{what}: the Hub redirected to {shown_origin(where)}, another origin; refused")

        response = self.open(url, params=params, read_timeout=read_timeout, foreign=foreign)
        with response:
            if response.status_code != 200:
                return response, b""
            length = response.headers.get("Content-Length", "").strip()
            if length.isdigit() and (len(length) > 12 or int(length) > MAX_API_ANSWER_BYTES):
                raise invalid(f"{what}: the Hub's answer is larger than {MAX_API_ANSWER_BYTES} bytes")
            body = bytearray()
            read = getattr(response.raw, "read1", None) or response.raw.read
            while chunk := read(API_READ_BYTES, decode_content=True):
                body += chunk
                if len(body) > MAX_API_ANSWER_BYTES:
                    raise invalid(f"{what}: the Hub's answer is larger than {MAX_API_ANSWER_BYTES} bytes")
        # A body that merely ended (no length to check it by) when the guard cut it is no answer.
        self.control.check()
        if time.monotonic() >= deadline:
            raise requests.exceptions.ConnectionError("cut at the deadline")
        return response, bytes(body)

    def transport_failure(self, error: Exception, what: str, deadline: float) -> JobFailure:
        """A broken, stalled or cut API request as HUB_UNAVAILABLE (retryable), saying which."""
        if time.monotonic() >= deadline - 0.05:
            message = f"{what}: took longer than {self.hub.deadline_seconds:g}s (MODELFORGE_AGENT_HUB_DEADLINE_SECONDS)"
        elif self.is_stall(error):
            message = f"{what}: the Hub did not answer within {self.hub.stall_seconds:g}s"
        else:
            message = f"{what}: {type(error).__name__}"
        return JobFailure(HUB_UNAVAILABLE, message, retryable=True)

    def refusal(self, response: requests.Response, what: str) -> JobFailure:
        """A Hub API error answer as one of our codes (J2 classes), told apart by X-Error-Code as
        huggingface_hub does; never with the token."""
        status = response.status_code
        code = response.headers.get("X-Error-Code")
        if code == "GatedRepo":
            message = f"{what}: the repository is gated (HTTP {status}); {TOKEN_HINT}"
            return JobFailure(HUB_AUTH_REQUIRED, message, retryable=False)
        if code == "RevisionNotFound":
            return JobFailure(HUB_REVISION_NOT_FOUND, f"{what}: no such revision (HTTP {status})", retryable=False)
        disabled = response.headers.get("X-Error-Message") == "Access to this resource is disabled."
        if code == "RepoNotFound" or disabled or status == 404:
            # The Hub answers a private repository exactly like a missing one (401 without a token).
            hint = "" if self.hub.token else "; if it is private, set MODELFORGE_HF_TOKEN"
            message = f"{what}: no such repository (HTTP {status}){hint}"
            return JobFailure(HUB_REPO_NOT_FOUND, message, retryable=False)
        if status in (401, 403):
            who = "the Hub refused MODELFORGE_HF_TOKEN" if self.hub.token else "no MODELFORGE_HF_TOKEN is set"
            return JobFailure(HUB_AUTH_REQUIRED, f"{what}: HTTP {status} ({who}); {TOKEN_HINT}", retryable=False)
        retryable = status >= 500 or status in (408, 429)
        return JobFailure(HUB_UNAVAILABLE, f"{what}: HTTP {status} from the Hub", retryable=retryable)

    def resolve_commit(self, request: AcquireRequest, revision: str) -> str:
        """J3: the revision as a 40-hex commit, before the first byte."""
        what = f"resolving {request.repo_type} {request.repo_id}@{revision}"
        url = f"{self.hub.endpoint}/api/{request.repo_type}s/{request.repo_id}/revision/{quote(revision, safe='')}"

        def invalid(message: str) -> JobFailure:
            return JobFailure(HUB_UNAVAILABLE, message, retryable=False)

        deadline = self.guard.start_call(self.hub.deadline_seconds)
        try:
            _, body = self.api_get(url, what, deadline=deadline, retries=0, invalid=invalid)
        finally:
            self.guard.end_call()
        try:
            info = json.loads(body)
        except (ValueError, RecursionError):
            info = None
        commit = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(commit, str) or not COMMIT_PATTERN.fullmatch(commit):
            raise JobFailure(HUB_UNAVAILABLE, f"{what}: the Hub named no 40-hex commit", retryable=True)
        return commit

    def list_files(self, request: AcquireRequest, commit: str) -> list[RemoteFile]:
        """The tree at the commit, recursively, every path checked, then filtered by the patterns.

        The pages are fetched here, not by huggingface_hub's paginate(): that follows a page's
        `Link: <…>; rel="next"` to any URL with the same headers, the token included, and sleeps
        whatever Retry-After says. Here each next link must be on the Hub endpoint's origin and
        the listing's own path before anything is sent to it (a page from elsewhere is refused,
        J3), and the listing has one deadline and caps on pages, entries and answer size."""
        what = f"listing {request.repo_id}@{commit}"
        url: str | None = f"{self.hub.endpoint}/api/{request.repo_type}s/{request.repo_id}/tree/{commit}"
        own_path = urlsplit(url).path
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}

        def invalid(message: str) -> JobFailure:
            return JobFailure(HUB_TREE_INVALID, message, retryable=False)

        files: list[RemoteFile] = []
        entries = pages = 0
        deadline = self.guard.start_call(self.hub.deadline_seconds)
        try:
            while url is not None:
                pages += 1
                if pages > MAX_TREE_PAGES:
                    raise invalid(f"{what}: the Hub's listing runs to more than {MAX_TREE_PAGES} pages")
                response, body = self.api_get(
                    url, what, deadline=deadline, retries=HUB_API_RETRIES, invalid=invalid, params=params
                )
                try:
                    page = json.loads(body)
                except (ValueError, RecursionError):
                    raise invalid(f"{what}: a page of the Hub's listing is not JSON") from None
                if not isinstance(page, list):
                    raise invalid(f"{what}: a page of the Hub's listing is not a list")
                entries += len(page)
                if entries > MAX_TREE_ENTRIES:
                    raise invalid(f"{what}: the Hub's listing holds more than {MAX_TREE_ENTRIES} entries")
                files.extend(tree_page_files(page, what))
                url, params = self.next_page(response, own_path, what), None
        finally:
            self.guard.end_call()
        refuse_conflicts(files)
        kept = hub_utils.filter_repo_objects(
            files,
            allow_patterns=request.allow_patterns,
            ignore_patterns=request.ignore_patterns,
            key=lambda remote: remote.path,
        )
        return sorted(kept, key=lambda remote: remote.path)

    def next_page(self, response: requests.Response, own_path: str, what: str) -> str | None:
        """The page after this one, or None; one on another origin or path is refused before any
        request goes there (J3: the token never does, and its answer never becomes the tree)."""
        link = response.links.get("next", {}).get("url")
        if not link:
            return None
        url = urljoin(response.url, link)
        if origin_of(url) != self.origin:
            raise JobFailure(
                HUB_TREE_INVALID,
                f"{what}: the Hub's listing continues at {shown_origin(url)}, another origin; refused, "
                "and nothing was sent there",
                retryable=False,
            )
        if urlsplit(url).path != own_path:
            message = f"{what}: the Hub's next page is another listing; refused"
            raise JobFailure(HUB_TREE_INVALID, message, retryable=False)
        return url

    def open_file(self, request: AcquireRequest, commit: str, path: str, offset: int):
        """GET the file at the commit from `offset` (Range); the token goes only to the Hub
        endpoint's own origin, never to the LFS CDN (J3)."""
        url = huggingface_hub.hf_hub_url(
            request.repo_id, path, repo_type=request.repo_type, revision=commit, endpoint=self.hub.endpoint
        )
        headers = dict(self.headers)
        headers["Accept-Encoding"] = "identity"  # byte offsets must mean the file's bytes
        if offset:
            headers["Range"] = f"bytes={offset}-"
        return self.open(url, headers=headers, read_timeout=self.hub.stall_seconds)

    @staticmethod
    def file_failure(response, path: str) -> JobFailure | None:
        """A refused file GET as one of our codes, or None for 200/206."""
        status = response.status_code
        if status in (200, 206):
            return None
        what = f"{describe_url('GET', response.url)} for {path}: HTTP {status}"
        code = response.headers.get("X-Error-Code")
        if code == "RepoNotFound":
            return JobFailure(HUB_REPO_NOT_FOUND, what, retryable=False)
        if code == "RevisionNotFound":
            return JobFailure(HUB_REVISION_NOT_FOUND, what, retryable=False)
        if status in (401, 403):
            return JobFailure(HUB_AUTH_REQUIRED, f"{what} ({code or 'refused'}); {TOKEN_HINT}", retryable=False)
        # The tree at this very commit listed the file: a 404 now is the Hub's hiccup, worth a retry.
        return JobFailure(HUB_UNAVAILABLE, what, retryable=status >= 500 or status in (404, 408, 429))

    def is_stall(self, error: Exception) -> bool:
        """Whether a transfer error is a read that waited stall_seconds for a byte."""
        return isinstance(error, STALL_ERRORS) or any(isinstance(arg, STALL_ERRORS) for arg in error.args)


def with_missing_ok(function: Callable, *args, **kwargs) -> None:
    """Call `function`, ignoring only a path that is already gone."""
    try:
        function(*args, **kwargs)
    except FileNotFoundError:
        pass


def write_json_at(dir_fd: int, name: str, data: dict[str, object]) -> None:
    """Write JSON atomically (temp file, fsync, rename) in the directory `dir_fd`."""
    temp = f".{name}.{uuid.uuid4().hex}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with_missing_ok(os.unlink, temp, dir_fd=dir_fd)
        raise


class PartialDir:
    """`<root>/.partial/<job_id>/`, where one job's files grow on the root's own filesystem (J3).
    Everything in it is reached through directory descriptors opened with O_NOFOLLOW: a symlink
    planted there is refused, never followed. `<job_id>.json` beside it records the commit."""

    def __init__(self, root: str, job_id: str) -> None:
        self.root = root  # realpath of the storage root
        self.job_id = job_id
        self.path = os.path.join(root, ".partial", job_id)
        self._root_fd: int | None = os.open(root, O_DIR_NOFOLLOW)
        self.fd: int | None = None

    @property
    def closed(self) -> bool:
        return self._root_fd is None

    @property
    def root_fd(self) -> int:
        """The storage root's descriptor; a closed PartialDir refuses every use (its number may by
        now belong to another thread's file)."""
        if self._root_fd is None:
            raise ValueError(f"the partial directory of job {self.job_id} is closed")
        return self._root_fd

    def _dir_fd(self) -> int:
        """The partial directory's descriptor; refused when closed or not created yet."""
        if self._root_fd is None or self.fd is None:
            raise ValueError(f"the partial directory of job {self.job_id} is closed or not created")
        return self.fd

    def close(self) -> None:
        """Close the directory descriptors; a second call does nothing (never a double close)."""
        fds, self.fd, self._root_fd = (self.fd, self._root_fd), None, None
        for fd in fds:
            if fd is not None:
                os.close(fd)

    def _partials_fd(self, create: bool) -> int | None:
        try:
            return open_dir_chain(self.root_fd, [".partial"], create=create)
        except FileNotFoundError:
            return None

    def read_state(self) -> dict[str, object]:
        """What an earlier attempt of this job recorded (repo, revision, commit), or {}."""
        fd = self._partials_fd(create=False)
        if fd is None:
            return {}
        try:
            return read_json_at(fd, f"{self.job_id}.json") or {}
        finally:
            os.close(fd)

    def refuse_links(self) -> None:
        """A symlink, device or pipe anywhere in the partial directory fails the job (J3)."""
        if not os.path.lexists(self.path):
            return
        os.close(open_dir_chain(self.root_fd, [".partial", self.job_id], create=False))  # no link on the way
        for directory, dirs, files in os.walk(self.path):
            for name in dirs + files:
                mode = os.lstat(os.path.join(directory, name)).st_mode
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    relative = os.path.relpath(os.path.join(directory, name), self.path)
                    raise JobFailure(
                        ARTIFACT_PATH_UNSAFE,
                        f"{ascii(relative)[:300]} in the partial directory is not a regular file; it is never followed",
                        retryable=False,
                    )

    def existing_sizes(self, files: list[RemoteFile]) -> dict[str, int]:
        """How many bytes of each file an earlier attempt left (0 if none, or too many)."""
        sizes = {}
        for remote in files:
            try:
                info = os.lstat(os.path.join(self.path, remote.path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size <= remote.size:
                sizes[remote.path] = info.st_size
        return sizes

    def create(self, state: dict[str, object]) -> None:
        """Create the directory (and record the state) before the first byte."""
        partials = open_dir_chain(self.root_fd, [".partial"], create=True)
        try:
            write_json_at(partials, f"{self.job_id}.json", state)
            self.fd = open_dir_chain(partials, [self.job_id], create=True)
        finally:
            os.close(partials)

    def open_file(self, path: str) -> int:
        """Open (or create) one file for writing, never through a symlink, and only below the partial dir."""
        joined = os.path.realpath(os.path.join(self.path, path))
        if not joined.startswith(self.path + os.sep):
            raise JobFailure(ARTIFACT_PATH_UNSAFE, f"{ascii(path)[:300]} leaves the partial directory", retryable=False)
        *parents, name = path.split("/")
        directory = open_dir_chain(self._dir_fd(), parents, create=True)
        try:
            try:
                fd = os.open(
                    name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644, dir_fd=directory
                )
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise JobFailure(
                        ARTIFACT_PATH_UNSAFE, f"{ascii(path)[:300]} is a symlink; never followed", retryable=False
                    ) from None
                raise
        finally:
            os.close(directory)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise JobFailure(ARTIFACT_PATH_UNSAFE, f"{ascii(path)[:300]} is not a regular file", retryable=False)
        return fd

    def prune(self, keep: set[str]) -> None:
        """Remove files no longer part of the tree (and empty directories), so the set is exact."""
        for directory, dirs, files in os.walk(self.path, topdown=False):
            for name in files:
                full = os.path.join(directory, name)
                if os.path.relpath(full, self.path).replace(os.sep, "/") not in keep:
                    os.unlink(full)
            for name in dirs:
                full = os.path.join(directory, name)
                if not os.listdir(full):
                    os.rmdir(full)

    def write_manifest(self, manifest: dict[str, object]) -> None:
        """modelforge-manifest.json inside, the last file before the rename."""
        write_json_at(self._dir_fd(), MANIFEST_NAME, manifest)

    def move_into_place(self, final_parts: list[str]) -> bool:
        """Rename the whole directory to its final place in one step; False if one is already there."""
        parent = open_dir_chain(self.root_fd, final_parts[:-1], create=True)
        partials = open_dir_chain(self.root_fd, [".partial"], create=False)
        try:
            os.fsync(self._dir_fd())
            os.rename(self.job_id, final_parts[-1], src_dir_fd=partials, dst_dir_fd=parent)
            os.fsync(parent)
            with_missing_ok(os.unlink, f"{self.job_id}.json", dir_fd=partials)
            return True
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
        finally:
            os.close(parent)
            os.close(partials)

    def remove(self) -> None:
        """Delete the partial directory and its state (a terminal state that is not success)."""
        try:
            partials = self._partials_fd(create=False)
        except JobFailure:
            return  # .partial itself is a symlink: nothing is deleted through it
        if partials is None:
            return
        try:
            try:
                shutil.rmtree(self.job_id, dir_fd=partials)
            except FileNotFoundError:
                pass
            except OSError:
                # rmtree refuses a symlink planted in the directory's place: remove the link itself.
                if stat.S_ISLNK(os.lstat(self.job_id, dir_fd=partials).st_mode):
                    os.unlink(self.job_id, dir_fd=partials)
                else:
                    raise
            with_missing_ok(os.unlink, f"{self.job_id}.json", dir_fd=partials)
        finally:
            os.close(partials)


def quarantine(source: str, quarantine_dir: Path, name: str, reason: dict[str, object]) -> str:
    """Move the directory `source` to `<quarantine>/<name>/` with a reason.json: evidence is
    never deleted (J3). Across filesystems this is a copy then a delete."""
    quarantine_dir.mkdir(parents=True, exist_ok=True)
    destination = os.path.join(quarantine_dir, name)
    suffix = 1
    while os.path.lexists(destination):
        suffix += 1
        destination = os.path.join(quarantine_dir, f"{name}.{suffix}")
    shutil.move(source, destination)
    fd = os.open(destination, O_DIR_NOFOLLOW)
    try:
        taken = os.path.lexists(os.path.join(destination, "reason.json"))  # a repo file of that name stays
        write_json_at(fd, "modelforge-reason.json" if taken else "reason.json", reason)
    finally:
        os.close(fd)
    return destination


def storage_failure(error: OSError, container_path: str) -> JobFailure:
    """A filesystem error while writing, as J1's codes (never a fall back to another path)."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return JobFailure(STORAGE_CAPACITY_GUARD, f"{container_path} ran out of space", retryable=False)
    reason = error.strerror or type(error).__name__
    return JobFailure(STORAGE_ROOT_UNAVAILABLE, f"{container_path}: {reason}", retryable=False)


class _VerificationFailed(Exception):
    """A fetched file whose hash or size is not what the Hub recorded."""

    def __init__(self, remote: RemoteFile, actual_digest: str, actual_size: int) -> None:
        super().__init__(remote.path)
        self.remote, self.actual_digest, self.actual_size = remote, actual_digest, actual_size


class _TransferBroken(Exception):
    """A GET that broke off; `progressed` says whether it wrote a byte first (then it resumes at once)."""

    def __init__(self, failure: JobFailure, progressed: bool) -> None:
        super().__init__(failure.message)
        self.failure, self.progressed = failure, progressed


@dataclass
class _FileState:
    """One file being fetched: its running hash and how many bytes are on disk."""

    hasher: object
    have: int = 0
    restarts: int = 0


class Acquisition:
    """One attempt of an artifact.acquire.v1 job, step by step (J1, J3)."""

    def __init__(
        self,
        request: AcquireRequest,
        hub: HubClient,
        root: str,
        quarantine_dir: Path,
        *,
        job_id: str,
        attempt: int,
        control: JobControl,
        on_progress: Callable[[Progress], None],
    ) -> None:
        self.request, self.hub, self.root, self.quarantine_dir = request, hub, root, quarantine_dir
        self.job_id, self.attempt, self.control, self.on_progress = job_id, attempt, control, on_progress
        self.partial = PartialDir(root, job_id)
        self.commit = ""
        self.progress = Progress()
        self.written_since_check = 0

    def run(self) -> dict[str, object]:
        """Resolve, list, check capacity, fetch and verify every file, then rename into place."""
        request = self.request
        self.partial.refuse_links()
        state = self.partial.read_state()
        same_job = all(state.get(key) == getattr(request, key) for key in ("repo_id", "repo_type", "revision"))
        recorded = state.get("commit") if same_job else None
        # A resumed attempt keeps the commit its first byte was fetched at (J3: never mixed).
        revision = recorded if isinstance(recorded, str) and COMMIT_PATTERN.fullmatch(recorded) else request.revision
        self.commit = self.hub.resolve_commit(request, revision)
        files = self.hub.list_files(request, self.commit)
        total = sum(remote.size for remote in files)
        self.report(Progress(0, total, 0, len(files)))
        final_parts = request.final_parts(self.commit)
        if self.already_present(final_parts, files):
            self.partial.remove()
            return self.result(files)
        have = self.partial.existing_sizes(files)
        self.check_capacity(total - sum(have.values()))
        self.partial.create(
            {
                "repo_id": request.repo_id,
                "repo_type": request.repo_type,
                "revision": request.revision,
                "commit": self.commit,
                "attempt": self.attempt,
            }
        )
        for remote in files:
            self.control.check()
            self.fetch(remote)
            self.report(replace(self.progress, files_done=self.progress.files_done + 1))
            log.info(
                "job %s: %s verified (%d bytes, %d/%d)",
                self.job_id,
                remote.path,
                remote.size,
                self.progress.files_done,
                len(files),
            )
        self.control.check()
        self.partial.prune({remote.path for remote in files})
        self.partial.write_manifest(self.manifest(files))
        if not self.partial.move_into_place(final_parts) and not self.already_present(final_parts, files):
            raise JobFailure(STORAGE_ROOT_UNAVAILABLE, "another directory took the artifact's place", retryable=True)
        self.partial.remove()  # only left when another attempt won the rename
        return self.result(files)

    def report(self, progress: Progress) -> None:
        """Keep the progress and pass every change on: the caller decides how often to send it."""
        self.progress = progress
        self.on_progress(progress)

    def free_bytes(self) -> int:
        """Free bytes on the root's filesystem for an unprivileged writer."""
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def check_capacity(self, still_to_write: int) -> None:
        """J1: fail before (and while) writing if the root would be left with less than min_free_bytes."""
        free = self.free_bytes()
        if free - still_to_write < self.request.min_free_bytes:
            raise JobFailure(
                STORAGE_CAPACITY_GUARD,
                f"{self.request.container_path} has {free} bytes free; writing {still_to_write} more would leave "
                f"less than min_free_bytes={self.request.min_free_bytes}. Free space or pick another root",
                retryable=False,
            )

    def already_present(self, final_parts: list[str], files: list[RemoteFile]) -> bool:
        """J3: a verified artifact at this commit (its manifest lists exactly these files and sizes)."""
        final = os.path.join(self.root, *final_parts)
        if not os.path.lexists(final):
            return False
        fd = open_dir_chain(self.partial.root_fd, final_parts, create=False)
        try:
            manifest = read_json_at(fd, MANIFEST_NAME) or {}
        finally:
            os.close(fd)
        listed = {item.get("path"): item.get("size") for item in manifest.get("files", []) if isinstance(item, dict)}
        expected = {remote.path: remote.size for remote in files}
        if manifest.get("commit") == self.commit and listed == expected and self.sizes_on_disk(final, expected):
            log.info(
                "job %s: %s is already here, verified at %s; nothing to fetch",
                self.job_id,
                self.request.repo_id,
                self.commit,
            )
            return True
        moved = quarantine(
            final,
            self.quarantine_dir,
            f"{self.job_id}-{self.attempt}-existing",
            {**self.reason_base(), "reason": "a directory at the artifact's place did not match the tree"},
        )
        log.warning("job %s: %s did not match the tree at %s; moved to %s", self.job_id, final, self.commit, moved)
        return False

    @staticmethod
    def sizes_on_disk(final: str, expected: dict[str, int]) -> bool:
        """Every listed file is a regular file of the listed size (no symlink)."""
        for path, size in expected.items():
            try:
                info = os.lstat(os.path.join(final, path))
            except OSError:
                return False
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                return False
        return True

    def fetch(self, remote: RemoteFile) -> None:
        """One file: hash what an earlier attempt wrote, fetch the rest with Range, verify."""
        fd = self.partial.open_file(remote.path)
        try:
            state = _FileState(remote.new_hash(), 0)
            self.hash_existing(fd, remote, state)
            retries = 0
            while state.have < remote.size:
                self.control.check()
                try:
                    self.transfer(fd, remote, state)
                except _TransferBroken as broken:
                    if not broken.progressed or retries >= TRANSFER_RETRIES:
                        raise broken.failure from None
                    retries += 1
                    log.warning("job %s: %s; resuming at byte %d", self.job_id, broken.failure.message, state.have)
                if state.have > remote.size:
                    break
            digest = state.hasher.hexdigest()
            if state.have != remote.size or digest != remote.digest:
                if state.have != remote.size and remote.algorithm == "git-sha1":
                    digest = self.git_blob_id(fd, state.have)
                raise _VerificationFailed(remote, digest, state.have)
            os.fsync(fd)
        except _VerificationFailed as failed:
            os.close(fd)
            fd = -1
            raise self.quarantine_attempt(failed) from None
        finally:
            if fd >= 0:
                os.close(fd)

    def hash_existing(self, fd: int, remote: RemoteFile, state: _FileState) -> None:
        """Hash the bytes an earlier attempt wrote, so only the rest is fetched (J3 resume)."""
        size = os.fstat(fd).st_size
        if size > remote.size:
            os.ftruncate(fd, 0)
            size = 0
        while state.have < size:
            self.control.check()
            chunk = os.pread(fd, min(DOWNLOAD_CHUNK_BYTES, size - state.have), state.have)
            if not chunk:
                break
            state.hasher.update(chunk)
            state.have += len(chunk)
        self.report(replace(self.progress, bytes_done=self.progress.bytes_done + state.have))

    @staticmethod
    def git_blob_id(fd: int, size: int) -> str:
        """The git blob id of what is really on disk (for reason.json when the size is wrong)."""
        hasher = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
        offset = 0
        while offset < size:
            chunk = os.pread(fd, min(DOWNLOAD_CHUNK_BYTES, size - offset), offset)
            if not chunk:
                break
            hasher.update(chunk)
            offset += len(chunk)
        return hasher.hexdigest()

    def restart(self, fd: int, remote: RemoteFile, state: _FileState) -> None:
        """Throw the file's bytes away and start it again (the server ignored or refused the Range)."""
        state.restarts += 1
        if state.restarts > 2:
            raise JobFailure(HUB_UNAVAILABLE, f"the Hub kept refusing a resume of {remote.path}", retryable=True)
        self.report(replace(self.progress, bytes_done=self.progress.bytes_done - state.have))
        os.ftruncate(fd, 0)
        state.hasher, state.have = remote.new_hash(), 0

    def transfer(self, fd: int, remote: RemoteFile, state: _FileState) -> None:
        """One GET from `state.have` on, written and hashed chunk by chunk."""
        started_at = state.have
        try:
            response = self.hub.open_file(self.request, self.commit, remote.path, state.have)
        except requests.exceptions.RequestException as error:
            raise _TransferBroken(self.network_failure(error, remote, "GET"), progressed=False) from None
        with response:
            if response.status_code == 416 and state.have:
                self.restart(fd, remote, state)
                return
            failure = self.hub.file_failure(response, remote.path)
            if failure is not None:
                raise failure
            if state.have and (response.status_code == 200 or not self.range_starts_at(response, state.have)):
                self.restart(fd, remote, state)
                if response.status_code != 200:
                    return
            while state.have <= remote.size:
                chunk = self.next_chunk(response, remote, state, started_at)
                if not chunk:
                    break
                self.control.check()
                self.write(fd, chunk, state)
        if state.have < remote.size:
            message = f"{describe_url('GET', response.url)} ended after {state.have} of {remote.size} bytes"
            raise _TransferBroken(
                JobFailure(HUB_UNAVAILABLE, message, retryable=True), progressed=state.have > started_at
            )

    def next_chunk(self, response, remote: RemoteFile, state: _FileState, started_at: int) -> bytes:
        """Whatever bytes have arrived (read1): a connection that drops loses none it delivered."""
        raw = response.raw
        read = getattr(raw, "read1", None) or raw.read  # urllib3 < 2 has no read1
        try:
            return read(DOWNLOAD_CHUNK_BYTES, decode_content=False)
        except BODY_ERRORS as error:
            failure = self.network_failure(error, remote, describe_url("GET", response.url))
            raise _TransferBroken(failure, progressed=state.have > started_at) from None

    @staticmethod
    def range_starts_at(response, offset: int) -> bool:
        """Whether a 206 answers the Range we asked for."""
        match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", "").strip())
        return match is not None and int(match.group(1)) == offset

    def network_failure(self, error: Exception, remote: RemoteFile, where: str) -> JobFailure:
        """A broken transfer as HUB_UNAVAILABLE, naming a stall apart from a dropped connection;
        a connection the guard cut because the job must stop is that stop instead."""
        self.control.check()
        if self.hub.is_stall(error):
            message = f"{where} for {remote.path} stalled: no byte for {self.hub.hub.stall_seconds:g}s"
        else:
            message = f"{type(error).__name__} on {where} for {remote.path}"
        return JobFailure(HUB_UNAVAILABLE, message, retryable=True)

    def write(self, fd: int, chunk: bytes, state: _FileState) -> None:
        """Write, hash and count one chunk; re-check capacity every few MiB (J1)."""
        view = memoryview(chunk)
        while view:
            try:
                written = os.pwrite(fd, view, state.have)
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise JobFailure(
                        STORAGE_CAPACITY_GUARD,
                        f"{self.request.container_path} ran out of space while writing",
                        retryable=False,
                    ) from None
                raise
            state.hasher.update(view[:written])
            state.have += written
            view = view[written:]
            self.written_since_check += written
            self.report(replace(self.progress, bytes_done=self.progress.bytes_done + written))
        if self.written_since_check >= CAPACITY_CHECK_BYTES:
            self.written_since_check = 0
            self.check_capacity(self.progress.bytes_total - self.progress.bytes_done)

    def reason_base(self) -> dict[str, object]:
        """What every reason.json says about the job."""
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "repo_id": self.request.repo_id,
            "repo_type": self.request.repo_type,
            "revision": self.request.revision,
            "commit": self.commit,
            "at": rfc3339_now(),
        }

    def quarantine_attempt(self, failed: _VerificationFailed) -> JobFailure:
        """J3: the attempt's files go to quarantine with the evidence; the next attempt starts clean."""
        remote = failed.remote
        reason = {
            **self.reason_base(),
            "reason": "a file did not match the hash or size the Hub recorded",
            "file": remote.path,
            f"expected_{remote.hash_name}": remote.digest,
            f"actual_{remote.hash_name}": failed.actual_digest,
            "expected_size": remote.size,
            "actual_size": failed.actual_size,
        }
        self.partial.close()
        try:
            moved = quarantine(self.partial.path, self.quarantine_dir, f"{self.job_id}-{self.attempt}", reason)
        except OSError as error:
            # The evidence is never deleted (J3): the files stay where they are, the partial stays
            # closed (acquire_artifact removes nothing through a closed one), and the job fails for
            # good, so no later attempt resumes from a file known to be corrupt.
            failure = storage_failure(error, self.request.container_path)
            kept = self.partial.path if os.path.lexists(self.partial.path) else str(self.quarantine_dir)
            raise JobFailure(
                failure.code,
                f"{remote.path} did not match the hash or size the Hub recorded, and moving the attempt's "
                f"files to quarantine failed ({failure.message}); they are kept in {kept}",
                retryable=False,
            ) from None
        self.partial = PartialDir(self.root, self.job_id)
        self.partial.remove()  # the state file: the next attempt resolves the revision afresh
        return JobFailure(
            ARTIFACT_VERIFICATION_FAILED,
            f"{remote.path}: expected {remote.algorithm} {remote.digest} and {remote.size} bytes, got "
            f"{failed.actual_digest} and {failed.actual_size} bytes; the attempt's files are in {moved}",
            retryable=True,
        )

    def manifest(self, files: list[RemoteFile]) -> dict[str, object]:
        """modelforge-manifest.json: what was fetched, at which commit, with the hashes it matched."""
        return {
            "manifest_version": 1,
            "repo_id": self.request.repo_id,
            "repo_type": self.request.repo_type,
            "revision": self.request.revision,
            "commit": self.commit,
            "files": [remote.manifest_entry() for remote in files],
            "total_bytes": sum(remote.size for remote in files),
            "job_id": self.job_id,
            "acquired_at": rfc3339_now(),
        }

    def result(self, files: list[RemoteFile]) -> dict[str, object]:
        """The job's result (the control plane adds artifact_id and host_path)."""
        total = sum(remote.size for remote in files)
        self.report(Progress(total, total, len(files), len(files)))
        fd = open_dir_chain(self.partial.root_fd, self.request.final_parts(self.commit), create=False)
        try:
            models = describe_models(fd, [remote.path for remote in files])  # S3: what each header says
        finally:
            os.close(fd)
        return {
            "commit": self.commit,
            "container_path": os.path.join(self.request.container_path, *self.request.final_parts(self.commit)),
            "files": len(files),
            "total_bytes": total,
            "models": models,
        }


def acquire_artifact(
    params: dict[str, object],
    hub: HubSettings,
    *,
    artifact_dir: Path,
    quarantine_dir: Path,
    job_id: str,
    attempt: int,
    control: JobControl | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> dict[str, object]:
    """Run one attempt of an artifact.acquire.v1 job (J3) and return its result
    (`commit`, `container_path`, `files`, `total_bytes`).

    Raises JobFailure (code, message, retryable) or JobAbandoned. A failure that will not be
    retried (cancel included) deletes the partial directory; a retryable one keeps it, so the
    next attempt resumes.
    """
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise JobFailure(JOB_PARAMS_INVALID, "the job id cannot name a directory", retryable=False)
    request = AcquireRequest.from_params(params)
    # J1: a root queued before the agent's first look at it is made here as at a heartbeat.
    problem = root_problem(request.container_path, artifact_dir, create=True)
    if problem is not None:
        raise JobFailure(STORAGE_ROOT_UNAVAILABLE, f"storage root {problem}", retryable=False)
    root = os.path.realpath(request.container_path)
    if not writable_dir(root):
        raise JobFailure(STORAGE_ROOT_UNAVAILABLE, f"{request.container_path} is not writable", retryable=False)
    control = control or JobControl()
    client = HubClient(hub, control)
    try:
        acquisition = Acquisition(
            request,
            client,
            root,
            quarantine_dir,
            job_id=job_id,
            attempt=attempt,
            control=control,
            on_progress=on_progress or (lambda progress: None),
        )
    except OSError as error:  # the root vanished since it was checked
        client.close()
        raise storage_failure(error, request.container_path) from None
    try:
        return acquisition.run()
    except JobFailure as failure:
        # A closed partial was handed to quarantine: whatever is left of it is evidence, never deleted.
        if not failure.retryable and not acquisition.partial.closed:
            acquisition.partial.remove()
        raise
    except OSError as error:
        failure = storage_failure(error, request.container_path)
        if not acquisition.partial.closed:
            acquisition.partial.remove()
        raise failure from None
    finally:
        acquisition.partial.close()
        client.close()


def run_acquire_job(
    job: Job, config: Config, control: JobControl, on_progress: Callable[[Progress], None]
) -> dict[str, object]:
    """The artifact.acquire.v1 handler: the job's params with this agent's Hub settings and directories."""
    return acquire_artifact(
        job.params,
        config.hub,
        artifact_dir=config.data_dirs["artifacts"],
        quarantine_dir=config.data_dirs["quarantine"],
        job_id=job.id,
        attempt=job.attempt,
        control=control,
        on_progress=on_progress,
    )


def acquire_summary(result: dict[str, object]) -> str:
    """`3 files, 1234 bytes at /data/artifacts/…` for the success log line."""
    return f"{result.get('files')} files, {result.get('total_bytes')} bytes at {result.get('container_path')}"


register_job_type(ACQUIRE_JOB_TYPE, run_acquire_job, acquire_summary)
