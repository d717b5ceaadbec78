"""A stand-in Hugging Face Hub on loopback, with fault injection (J3).

It serves repositories built from in-memory bytes, files on disk or generated content through the
endpoints and headers huggingface.co uses, so both huggingface_hub (2.x, over httpx2) and a
downloader built on `requests` can run against it with `HF_ENDPOINT` (or `endpoint=`) set to
`hub.url`:

- `GET  /api/{models|datasets}/{repo}[/revision/{rev}]`  repo info: `sha`, `siblings` (`blobs=1`
  adds `size`, `blobId`, `lfs`), `gated`, `private`.
- `GET  /api/{models|datasets}/{repo}/tree/{rev}[/{path}]?recursive=&cursor=`  tree entries
  (`type`, `path`, `size`, `oid`, and `lfs: {oid, size, pointerSize}`), paged with a `Link` header.
- `POST /api/{models|datasets}/{repo}/paths-info/{rev}`  (form field `paths`, repeated).
- `HEAD|GET /[datasets/]{repo}/resolve/{rev}/{path}`  with `X-Repo-Commit`, a quoted `ETag` (git
  blob SHA-1, or the sha256 for LFS files, which also get `X-Linked-Etag`/`X-Linked-Size`),
  `Content-Length`, `Accept-Ranges: bytes`; `Range` gives 206 with `Content-Range`, or 416.
- Errors carry `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`, `GatedRepo`),
  `X-Error-Message` and a JSON `{"error": …}` body, with the real Hub's status codes: a missing or
  private repo is 401 to an anonymous caller and 404 to one that sent a token; a gated repo's
  files are 401 without a token and 403 with the wrong one (its info and tree stay public).

Nothing is sent about Xet (no `xetHash`, no `X-Xet-*`), so clients download over plain HTTP. The
tree `oid` of an LFS file is, as on the real Hub, the git blob SHA-1 of its *pointer*; its content
is identified by `lfs.oid` (sha256).

    with StandinHub() as hub:
        commit = hub.add_repo("org/model", {"config.json": b"{}", "model.gguf": Generated(1 << 30)})
        hub.drop("model.gguf", after_bytes=1 << 20)        # the next GET of it breaks after 1 MiB
        ...download from hub.url...
        assert hub.bytes_served("model.gguf") == ...

A hostile Hub is a few calls away; by default none of it happens:

    hub.fail_next(10**6, 429, path=tree_path, headers={"Retry-After": "100000"})  # a Retry-After bomb
    hub.drip(tree_path, seconds=1.5, times=None)   # every tree answer: one byte every 1.5 s
    hub.endless_tree(per_page=1)                   # every tree page links to one more, forever
    hub.link_tree_to(other.url)                    # the tree "continues" on another host, whose
    other.serve_any_tree([])                       # /tree answers this; other.requests shows its headers
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import socket
import struct
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_THRESHOLD = 1 << 20
LFS_SUFFIXES = (".bin", ".gguf", ".safetensors")
REPO_TYPES = ("model", "dataset")
LAST_MODIFIED = "2024-01-01T00:00:00.000Z"
# Tree entries a hostile Hub (or a man in the middle) could send: each must be refused before any byte
# is written. "escape" also appears as a directory, the name a symlink planted on disk would have.
HOSTILE_PATHS = (
    "../evil",
    "/etc/modelforge-evil",
    "nested/../../evil",
    "..\\evil",
    "escape/../../../evil",
    "./",
)
STREAM_CHUNK = 256 * 1024
EMPTY_BLOB_SHA1 = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git hash-object of no bytes

# --- content sources -----------------------------------------------------------------------------

_GENERATED_BLOCK = 1 << 20
_GENERATED_POOL_BLOCKS = 7
_STAMP = 16


@dataclass(frozen=True)
class Generated:
    """Deterministic pseudo-random content of `size` bytes, made on demand and never held whole.

    Every 1 MiB block starts with a stamp of (seed, block index), so bytes served from the wrong
    offset never match, while generating costs only slicing a small random pool."""

    size: int
    seed: int = 0


@functools.lru_cache(maxsize=4)
def _generated_pool(seed: int) -> bytes:
    """The random blocks that generated content of this seed is cut from."""
    return random.Random(seed).randbytes(_GENERATED_BLOCK * _GENERATED_POOL_BLOCKS)


class _Source:
    """Where a file's bytes come from; `chunks(start, end)` yields them without loading the file."""

    size: int
    cache_key: tuple | None = None

    def chunks(self, start: int, end: int) -> Iterator[bytes | memoryview]:
        raise NotImplementedError


class _BytesSource(_Source):
    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.size = len(self.data)

    def chunks(self, start: int, end: int) -> Iterator[bytes | memoryview]:
        view = memoryview(self.data)
        for offset in range(start, end, STREAM_CHUNK):
            yield view[offset : min(end, offset + STREAM_CHUNK)]


class _PathSource(_Source):
    def __init__(self, path: Path) -> None:
        self.path = path.resolve()
        stat = self.path.stat()
        self.size = stat.st_size
        self.cache_key = ("path", str(self.path), stat.st_size, stat.st_mtime_ns)

    def chunks(self, start: int, end: int) -> Iterator[bytes | memoryview]:
        with self.path.open("rb") as handle:
            handle.seek(start)
            remaining = end - start
            while remaining > 0:
                data = handle.read(min(STREAM_CHUNK, remaining))
                if not data:
                    raise OSError(f"{self.path} shrank while being served")
                remaining -= len(data)
                yield data


class _GeneratedSource(_Source):
    def __init__(self, generated: Generated) -> None:
        if generated.size < 0:
            raise ValueError("Generated size must be >= 0")
        self.seed = generated.seed
        self.size = generated.size
        self.cache_key = ("generated", generated.size, generated.seed)

    def chunks(self, start: int, end: int) -> Iterator[bytes | memoryview]:
        pool = memoryview(_generated_pool(self.seed))
        offset = start
        while offset < end:
            block, within = divmod(offset, _GENERATED_BLOCK)
            block_start = block * _GENERATED_BLOCK
            stop = min(end, block_start + _GENERATED_BLOCK) - block_start
            if within < _STAMP:
                stamp = struct.pack("<QQ", self.seed % (1 << 64), block)
                yield stamp[within : min(stop, _STAMP)]
                within = min(stop, _STAMP)
            if within < stop:
                base = (block % _GENERATED_POOL_BLOCKS) * _GENERATED_BLOCK
                yield pool[base + within : base + stop]
            offset = block_start + stop


def _source_for(path: str, value: Any) -> _Source:
    """Turn one `files` value (bytes, a path on disk, Generated or (size, seed)) into a source."""
    if isinstance(value, bytes | bytearray | memoryview):
        return _BytesSource(bytes(value))
    if isinstance(value, os.PathLike):
        return _PathSource(Path(value))
    if isinstance(value, Generated):
        return _GeneratedSource(value)
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(part, int) for part in value):
        return _GeneratedSource(Generated(*value))
    raise TypeError(
        f"{path!r}: give bytes, a pathlib.Path, Generated(size, seed) or (size, seed), not {type(value).__name__}"
        " (a str is refused: text or a path would be a guess)"
    )


_DIGEST_CACHE: dict[tuple, tuple[str, str]] = {}
_DIGEST_LOCK = threading.Lock()


def git_blob_sha1(data: bytes) -> str:
    """The git blob SHA-1 of `data` (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _digests(source: _Source) -> tuple[str, str]:
    """(git blob SHA-1, sha256) of a source, computed once per on-disk file or generated content."""
    if source.cache_key is not None:
        with _DIGEST_LOCK:
            cached = _DIGEST_CACHE.get(source.cache_key)
        if cached is not None:
            return cached
    blob, sha256 = hashlib.sha1(b"blob %d\0" % source.size), hashlib.sha256()
    for chunk in source.chunks(0, source.size):
        blob.update(chunk)
        sha256.update(chunk)
    result = (blob.hexdigest(), sha256.hexdigest())
    if source.cache_key is not None:
        with _DIGEST_LOCK:
            _DIGEST_CACHE[source.cache_key] = result
    return result


# --- repositories --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubFile:
    """One file of a commit, with the hashes the Hub records for it."""

    path: str
    size: int
    blob_sha1: str
    sha256: str
    lfs: bool
    source: _Source = field(repr=False, compare=False)

    @property
    def pointer(self) -> bytes:
        """The git LFS pointer that git stores in place of an LFS file."""
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def oid(self) -> str:
        """The tree `oid`: the git blob SHA-1 of the content, or of the pointer for an LFS file."""
        return git_blob_sha1(self.pointer) if self.lfs else self.blob_sha1

    @property
    def etag(self) -> str:
        """The unquoted ETag of /resolve: sha256 for an LFS file, else the git blob SHA-1."""
        return self.sha256 if self.lfs else self.blob_sha1

    def tree_entry(self) -> dict:
        """This file as `/tree` and `/paths-info` list it."""
        entry: dict[str, Any] = {"type": "file", "oid": self.oid, "size": self.size, "path": self.path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(self.pointer)}
        return entry


@dataclass(frozen=True)
class _Commit:
    sha: str
    parent: str | None
    files: Mapping[str, HubFile]


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    lfs_rule: Callable[[str, int], bool]
    gated: bool
    private: bool
    token: str | None
    default_branch: str
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, _Commit] = field(default_factory=dict)
    hostile: list[dict] = field(default_factory=list)

    def resolve(self, revision: str) -> _Commit | None:
        """The commit a branch name or a full 40-hex sha names, if any."""
        sha = self.refs.get(revision, revision)
        return self.commits.get(sha)


def _default_lfs(path: str, size: int) -> bool:
    return size >= LFS_THRESHOLD or path.endswith(LFS_SUFFIXES)


def _check_repo_path(path: str) -> None:
    """Refuse a path a real repository could not hold (hostile ones go through `hostile_tree`)."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"not a repository path: {path!r} (use hostile_tree() for hostile entries)")


def _directories(paths: list[str]) -> set[str]:
    return {path.rsplit("/", 1)[0] for path in paths if "/" in path} | {
        "/".join(path.split("/")[:depth]) for path in paths for depth in range(1, path.count("/"))
    }


# --- faults --------------------------------------------------------------------------------------


@dataclass
class _Failure:
    remaining: int
    status: int
    path: str | None
    method: str | None
    headers: dict[str, str]


@dataclass
class _BodyFault:
    kind: str  # "stall", "drop" or "drip" (seconds: between two bytes)
    path: str
    repo_id: str | None
    after_bytes: int
    seconds: float
    remaining: int | None  # None: every matching response


@dataclass
class RecordedRequest:
    """One request the stand-in answered; `headers` has lower-case names, `client_port` tells
    connections apart (one port for many requests: keep-alive worked)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    request_id: str
    client_port: int
    status: int | None = None
    bytes_sent: int = 0
    repo_id: str | None = None
    file_path: str | None = None

    def matches(self, path: str | None) -> bool:
        """True when `path` is None, this URL path, or the repository file this request served."""
        return path is None or path in (self.path, self.file_path)


# --- HTTP ----------------------------------------------------------------------------------------

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_UNSATISFIABLE = "unsatisfiable"


def _parse_range(value: str, size: int) -> tuple[int, int] | str | None:
    """(first, last) byte of a single `Range`, `_UNSATISFIABLE`, or None to ignore it (RFC 9110)."""
    match = _RANGE.fullmatch(value.replace(" ", ""))
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first, last = match.groups()
    if first == "":
        suffix = int(last)
        if suffix == 0 or size == 0:
            return _UNSATISFIABLE
        return max(0, size - suffix), size - 1
    start = int(first)
    if start >= size:
        return _UNSATISFIABLE
    end = int(last) if last else size - 1
    if end < start:
        return None
    return start, min(end, size - 1)


class _ConnectionDropped(Exception):
    """The stand-in closed the connection on purpose (drop) or is stopping."""


class _Handler(BaseHTTPRequestHandler):
    """Routes one request to the hub; HTTP/1.1 with Content-Length everywhere, so keep-alive works."""

    # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed
    # ACK, about 40 ms per response (bench/acquire.py found it), which would swamp small files.
    disable_nagle_algorithm = True

    protocol_version = "HTTP/1.1"
    server_version = "StandinHub/1"
    timeout = 60
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `hub.requests` instead of a log."""

    def setup(self) -> None:
        super().setup()
        self.server.hub._connections.add(self.connection)

    def finish(self) -> None:
        self.server.hub._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    # -- plumbing --

    def _dispatch(self) -> None:
        hub = self.server.hub
        self.drip_seconds: float | None = None  # set by a drip fault: the rest of the body goes byte by byte
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        self.segments = [unquote(part) for part in split.path.split("/")[1:]]
        self.record = hub._record(
            RecordedRequest(
                method=self.command,
                path=unquote(split.path),
                query=parse_qs(split.query),
                headers={name.lower(): value for name, value in self.headers.items()},
                request_id=uuid.uuid4().hex,
                client_port=self.client_address[1],
            )
        )
        try:
            failure = hub._take_failure(self.record)
            if failure is not None:
                message = f"stand-in: injected HTTP {failure.status}"
                self._send_error(failure.status, None, message, failure.headers)
            else:
                self._route()
        except (_ConnectionDropped, ConnectionError, TimeoutError):
            self.close_connection = True

    def _route(self) -> None:
        segments = self.segments
        if len(segments) >= 4 and segments[0] == "api" and segments[1] in ("models", "datasets"):
            self._api(segments[1][:-1], f"{segments[2]}/{segments[3]}", segments[4:])
        elif len(segments) == 3 and segments[0] == "cdn-lfs" and self.command in ("GET", "HEAD"):
            self._cdn(segments[1])
        elif self.command in ("GET", "HEAD") and len(segments) >= 5:
            repo_type = "dataset" if segments[0] == "datasets" else "model"
            rest = segments[1:] if repo_type == "dataset" else segments
            if len(rest) >= 5 and rest[2] == "resolve":
                self._resolve(repo_type, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]))
                return
            self._send_error(404, None, "Not Found")
        else:
            self._send_error(404, None, "Not Found")

    def _bearer(self) -> str | None:
        value = self.headers.get("Authorization", "")
        return value[len("Bearer ") :] if value.startswith("Bearer ") else None

    def _send_head(self, status: int, headers: Mapping[str, str]) -> None:
        self.record.status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("X-Request-Id", self.record.request_id)
        self.end_headers()

    def _send_bytes(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self._send_head(status, {**headers, "Content-Length": str(len(body))})
        if self.command != "HEAD" and body:
            if self.record.path.startswith("/api/"):
                # An API answer stalls or drops between its headers and its body (its URL path as
                # the fault's path); a file's body does so mid-stream (_stream).
                self.wfile.flush()
                for fault in self.server.hub._body_faults_for(self.record):
                    self._fire(fault)
            if self.drip_seconds is not None:
                self._drip(body)
                return
            self.record.bytes_sent += len(body)  # counted first: a client that has the bytes sees them counted
            self.wfile.write(body)

    def _drip(self, data: bytes | memoryview) -> None:
        """Send `data` one byte at a time, `drip_seconds` apart; stop() cuts it short."""
        for index in range(len(data)):
            self.record.bytes_sent += 1
            self.wfile.write(data[index : index + 1])
            if self.server.hub._stopping.wait(self.drip_seconds):
                raise _ConnectionDropped

    def _send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self._send_bytes(status, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})

    def _send_error(
        self, status: int, code: str | None, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        extra = {"X-Error-Message": message, **(headers or {})}
        if code is not None:
            extra["X-Error-Code"] = code
        self._send_json(status, {"error": message}, extra)

    # -- repositories and errors --

    def _repo(self, repo_type: str, repo_id: str) -> _Repo | None:
        """The repo if this caller may see it; otherwise answers RepoNotFound as the Hub does."""
        repo = self.server.hub._repos.get((repo_type, repo_id))
        token = self._bearer()
        if repo is None or (repo.private and token != repo.token):
            # The real Hub answers 401 to anonymous callers and 404 to authenticated ones, so the
            # status alone never tells a private repo from a missing one: read X-Error-Code.
            status, message = (404, "Repository not found") if token else (401, "Invalid username or password.")
            self._send_error(status, "RepoNotFound", message)
            return None
        return repo

    def _commit(self, repo: _Repo, revision: str) -> _Commit | None:
        with self.server.hub._lock:
            commit = repo.resolve(revision)
        if commit is None:
            self._send_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # -- /api --

    def _api(self, repo_type: str, repo_id: str, rest: list[str]) -> None:
        self.record.repo_id = repo_id
        with self.server.hub._lock:
            any_tree = self.server.hub._any_tree
        if any_tree is not None and rest[:1] == ["tree"] and self.command == "GET":
            self._send_json(200, any_tree)  # a host that answers every tree listing, repo or not
            return
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            return
        if not rest and self.command == "GET":
            self._info(repo, repo.default_branch)
        elif len(rest) == 2 and rest[0] == "revision" and self.command == "GET":
            self._info(repo, rest[1])
        elif len(rest) >= 2 and rest[0] == "tree" and self.command == "GET":
            self._tree(repo, rest[1], "/".join(rest[2:]).strip("/"))
        elif len(rest) == 2 and rest[0] == "paths-info" and self.command == "POST":
            self._paths_info(repo, rest[1])
        else:
            self._send_error(404, None, "Not Found")

    def _info(self, repo: _Repo, revision: str) -> None:
        commit = self._commit(repo, revision)
        if commit is None:
            return
        with_blobs = self.record.query.get("blobs", [""])[0].lower() in ("1", "true")
        siblings = []
        for hub_file in commit.files.values():
            sibling: dict[str, Any] = {"rfilename": hub_file.path}
            if with_blobs:
                sibling.update(size=hub_file.size, blobId=hub_file.oid)
                if hub_file.lfs:
                    sibling["lfs"] = {
                        "sha256": hub_file.sha256,
                        "size": hub_file.size,
                        "pointerSize": len(hub_file.pointer),
                    }
            siblings.append(sibling)
        siblings += [{"rfilename": entry["path"]} for entry in repo.hostile if entry.get("type") == "file"]
        author = repo.repo_id.split("/")[0]
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": author,
            "sha": commit.sha,
            "lastModified": LAST_MODIFIED,
            "createdAt": LAST_MODIFIED,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(hub_file.size for hub_file in commit.files.values()),
        }
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        self._send_json(200, info)

    def _entries(self, repo: _Repo, commit: _Commit) -> dict[str, dict]:
        """Every tree entry of a commit by path: files, their directories, then hostile extras."""
        entries = {path: hub_file.tree_entry() for path, hub_file in commit.files.items()}
        for directory in _directories(list(commit.files)):
            inside = sorted(
                f"{path}\0{hub_file.oid}" for path, hub_file in commit.files.items() if path.startswith(directory + "/")
            )
            oid = hashlib.sha1("\n".join(inside).encode()).hexdigest()
            entries[directory] = {"type": "directory", "oid": oid, "size": 0, "path": directory}
        for entry in repo.hostile:
            entries[entry["path"]] = {key: value for key, value in entry.items() if key != "content"}
        return entries

    def _tree(self, repo: _Repo, revision: str, under: str) -> None:
        commit = self._commit(repo, revision)
        if commit is None:
            return
        entries = self._entries(repo, commit)
        if under and entries.get(under, {}).get("type") != "directory":
            self._send_error(
                404, "EntryNotFound", f"{under} does not exist on {revision}", {"X-Repo-Commit": commit.sha}
            )
            return
        recursive = self.record.query.get("recursive", [""])[0].lower() in ("1", "true")
        hostile = {entry["path"] for entry in repo.hostile}
        prefix = f"{under}/" if under else ""
        listed = []
        # Directories first, then files, each by path, as the Hub lists them.
        for path in sorted(entries, key=lambda p: (entries[p]["type"] != "directory", p)):
            if path in hostile:
                if not under:  # hostile entries show at the root, recursive or not
                    listed.append(entries[path])
            elif path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :]):
                listed.append(entries[path])
        self._send_page(repo, listed)

    def _send_page(self, repo: _Repo, listed: list[dict]) -> None:
        hub = self.server.hub
        with hub._lock:
            endless, link_base = hub._endless_page_size, hub._tree_link_base
            if hub._endless_repo_id not in (None, repo.repo_id):
                endless = None
        start = int(self.record.query.get("cursor", ["0"])[0] or 0)
        if endless is not None:
            # Fresh, valid empty files on every page, and always one page more.
            page_size = endless
            page = [
                {"type": "file", "oid": EMPTY_BLOB_SHA1, "size": 0, "path": f"endless/{start + index:010d}.txt"}
                for index in range(endless)
            ]
            more = True
        else:
            page_size = hub.tree_page_size
            page = listed[start : start + page_size]
            more = start + page_size < len(listed) or link_base is not None
        headers = {}
        if more:
            query = "&".join(
                f"{quote(name)}={quote(values[0])}" for name, values in self.record.query.items() if name != "cursor"
            )
            base = link_base or f"http://{self.headers.get('Host') or hub.url.split('//', 1)[1]}"
            link = f"{base}{quote(self.record.path)}?{query}&cursor={start + page_size}".replace("?&", "?")
            headers["Link"] = f'<{link}>; rel="next"'
        self._send_json(200, page, headers)

    def _paths_info(self, repo: _Repo, revision: str) -> None:
        commit = self._commit(repo, revision)
        if commit is None:
            return
        if self.headers.get("Content-Type", "").startswith("application/json"):
            wanted = json.loads(self.body or b"{}").get("paths", [])
        else:
            wanted = parse_qs(self.body.decode()).get("paths", [])
        entries = self._entries(repo, commit)
        self._send_json(200, [entries[path] for path in wanted if path in entries])

    # -- /resolve and the CDN --

    def _resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        self.record.repo_id, self.record.file_path = repo_id, path
        hub = self.server.hub
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            return
        commit = self._commit(repo, revision)
        if commit is None:
            return
        token = self._bearer()
        if repo.gated and token != repo.token:
            if token is None:
                status = 401
                message = (
                    f"Access to {repo_type} {repo_id} is restricted. You must have access to it and be"
                    " authenticated to access it. Please log in."
                )
            else:
                status = 403
                message = f"Access to {repo_type} {repo_id} is restricted and you are not in the authorized list."
            self._send_error(status, "GatedRepo", message)
            return
        hub_file = commit.files.get(path) or hub._hostile_file(repo, path)
        if hub_file is None:
            self._send_error(
                404, "EntryNotFound", f"{path} does not exist on {revision}", {"X-Repo-Commit": commit.sha}
            )
            return
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{hub_file.etag}"',
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}",
        }
        if hub_file.lfs:
            headers.update({"X-Linked-Etag": f'"{hub_file.sha256}"', "X-Linked-Size": str(hub_file.size)})
            location = hub._lfs_location(repo, hub_file)
            if location is not None:
                self._send_bytes(302, f"Found. Redirecting to {location}".encode(), {**headers, "Location": location})
                return
        self._send_content(hub_file, headers, hub._corruptions_for(repo.repo_type, repo.repo_id, path))

    def _cdn(self, key: str) -> None:
        hub = self.server.hub
        with hub._lock:
            found = hub._cdn_objects.get(key)
        if found is None:
            self._send_bytes(404, b"NoSuchKey", {"Content-Type": "text/plain"})
            return
        origin, repo_type, repo_id, hub_file = found
        self.record.repo_id, self.record.file_path = repo_id, hub_file.path
        if hub.reject_authorization and "Authorization" in self.headers:
            # S3 refuses a presigned URL that also carries an Authorization header.
            self._send_bytes(400, b"Only one auth mechanism allowed", {"Content-Type": "text/plain"})
            return
        headers = {
            "ETag": f'"cdn-{hashlib.sha1(hub_file.sha256.encode()).hexdigest()}"',
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(hub_file.path.rsplit('/', 1)[-1])}",
        }
        self._send_content(hub_file, headers, origin._corruptions_for(repo_type, repo_id, hub_file.path))

    def _send_content(self, hub_file: HubFile, headers: dict[str, str], corrupt: frozenset[int]) -> None:
        """The file, or the one range asked for, with faults applied as the body goes out."""
        size = hub_file.size
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        status, first, last = 200, 0, size - 1
        wanted = _parse_range(self.headers["Range"], size) if self.headers.get("Range") else None
        if wanted == _UNSATISFIABLE:
            self._send_bytes(416, b"", {**headers, "Content-Range": f"bytes */{size}"})
            return
        if isinstance(wanted, tuple):
            status, (first, last) = 206, wanted
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        self._send_head(status, {**headers, "Content-Length": str(last - first + 1)})
        if self.command == "HEAD":
            return
        self._stream(hub_file, first, last + 1, corrupt)

    def _stream(self, hub_file: HubFile, start: int, end: int, corrupt: frozenset[int]) -> None:
        hub = self.server.hub
        faults = sorted(hub._body_faults_for(self.record), key=lambda fault: fault.after_bytes)
        sent, offset = 0, start
        for chunk in hub_file.source.chunks(start, end):
            flips = [position - offset for position in corrupt if offset <= position < offset + len(chunk)]
            if flips:
                chunk = bytearray(chunk)
                for index in flips:
                    chunk[index] ^= 0xFF
            offset += len(chunk)
            view = memoryview(chunk)
            while len(view):
                while faults and faults[0].after_bytes <= sent:
                    self._fire(faults.pop(0))
                part = view[: faults[0].after_bytes - sent] if faults else view
                if self.drip_seconds is not None:
                    part = part[:1]
                    self._drip(part)
                else:
                    self.record.bytes_sent += len(part)
                    self.wfile.write(part)
                sent += len(part)
                view = view[len(part) :]

    def _fire(self, fault: _BodyFault) -> None:
        hub = self.server.hub
        if not hub._consume(fault):
            return
        if fault.kind == "stall":
            if hub._stopping.wait(fault.seconds):
                raise _ConnectionDropped
            return
        if fault.kind == "drip":
            self.drip_seconds = fault.seconds
            return
        self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        raise _ConnectionDropped


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    hub: StandinHub

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-body is normal here; anything else still prints."""
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


# --- the hub -------------------------------------------------------------------------------------


class StandinHub:
    """A threaded Hugging Face Hub stand-in on 127.0.0.1 (random port); see the module docstring.

    `tree_page_size` pages `/tree` (the Hub pages at 1000); `reject_authorization=True` makes this
    hub, used as a CDN, refuse requests that carry `Authorization` as S3 does (400)."""

    def __init__(self, *, tree_page_size: int = 1000, reject_authorization: bool = False) -> None:
        self.tree_page_size = tree_page_size
        self.reject_authorization = reject_authorization
        self._lock = threading.Lock()
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._requests: list[RecordedRequest] = []
        self._failures: list[_Failure] = []
        self._body_faults: list[_BodyFault] = []
        self._corruptions: dict[tuple[str, str, str], set[int]] = {}
        self._lfs_target: StandinHub | str | None = None
        self._tree_link_base: str | None = None
        self._any_tree: list[dict] | None = None
        self._endless_page_size: int | None = None
        self._endless_repo_id: str | None = None
        self._cdn_objects: dict[str, tuple[StandinHub, str, str, HubFile]] = {}
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --

    def start(self) -> StandinHub:
        """Listen on a free loopback port and serve in a background thread."""
        self._stopping.clear()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hub = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="standin-hub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every open connection (stalled ones included)."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> StandinHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The endpoint, e.g. http://127.0.0.1:40123 (set HF_ENDPOINT to it)."""
        if self._server is None:
            raise RuntimeError("StandinHub is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- repositories --

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, Any],
        *,
        lfs: set[str] | Callable[[str, int], bool] | None = None,
        branch: str = "main",
        repo_type: str = "model",
        gated: bool = False,
        private: bool = False,
        token: str | None = None,
    ) -> str:
        """Create `repo_id` ("owner/name") with one commit on `branch`; returns its 40-hex sha.

        `files` maps repository paths to bytes, a `pathlib.Path` on disk, `Generated(size, seed)` or
        a `(size, seed)` tuple. `lfs` is the set of LFS paths or `lfs(path, size) -> bool`; by default
        files of 1 MiB or more and *.bin/*.gguf/*.safetensors are LFS. A gated or private repo needs
        `token`: its files (every endpoint, if private) answer only to `Authorization: Bearer <token>`."""
        if repo_type not in REPO_TYPES:
            raise ValueError(f"repo_type must be one of {REPO_TYPES}")
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"repo_id must be owner/name, not {repo_id!r}")
        if (gated or private) and not token:
            raise ValueError("a gated or private repo needs a token")
        if lfs is None:
            rule = _default_lfs
        elif callable(lfs):
            rule = lfs
        else:
            paths = frozenset(lfs)
            rule = lambda path, size: path in paths  # noqa: E731 - one-line rule
        repo = _Repo(repo_type, repo_id, rule, gated, private, token, default_branch=branch)
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                raise ValueError(f"{repo_type} {repo_id} exists; use commit()")
            self._repos[(repo_type, repo_id)] = repo
        return self.commit(repo_id, files, branch=branch, repo_type=repo_type)

    def commit(self, repo_id: str, files: Mapping[str, Any], *, branch: str = "main", repo_type: str = "model") -> str:
        """Commit `files` over the branch's files (None deletes a path) and move the branch there.

        Earlier commits stay resolvable by sha. A new branch starts from the default branch (the one
        add_repo made). Returns the new sha."""
        repo = self._repo(repo_type, repo_id)
        built = {}
        for path, value in files.items():
            _check_repo_path(path)
            if value is not None:
                source = _source_for(path, value)
                blob_sha1, sha256 = _digests(source)
                built[path] = HubFile(
                    path, source.size, blob_sha1, sha256, bool(repo.lfs_rule(path, source.size)), source
                )
        with self._lock:
            parent = repo.refs.get(branch) or repo.refs.get(repo.default_branch)
            merged = dict(repo.commits[parent].files) if parent else {}
            merged.update(built)
            for path, value in files.items():
                if value is None:
                    merged.pop(path, None)
            listing = "".join(f"{path}\0{merged[path].oid}\n" for path in sorted(merged))
            sha = hashlib.sha1(f"{repo_type}s/{repo_id}\n{parent or ''}\n{listing}".encode()).hexdigest()
            repo.commits.setdefault(sha, _Commit(sha, parent, dict(merged)))
            repo.refs[branch] = sha
        return sha

    def resolve(self, repo_id: str, revision: str = "main", *, repo_type: str = "model") -> str:
        """The commit sha a branch (or sha) names now."""
        repo = self._repo(repo_type, repo_id)
        with self._lock:
            commit = repo.resolve(revision)
        if commit is None:
            raise KeyError(f"{repo_id}: no revision {revision!r}")
        return commit.sha

    def file(self, repo_id: str, path: str, revision: str = "main", *, repo_type: str = "model") -> HubFile:
        """A file as the Hub records it (size, blob_sha1, sha256, lfs, oid, etag) at a revision."""
        repo = self._repo(repo_type, repo_id)
        sha = self.resolve(repo_id, revision, repo_type=repo_type)
        with self._lock:
            return repo.commits[sha].files[path]

    def _repo(self, repo_type: str, repo_id: str) -> _Repo:
        with self._lock:
            try:
                return self._repos[(repo_type, repo_id)]
            except KeyError:
                raise KeyError(f"no {repo_type} {repo_id}; add_repo() it first") from None

    # -- what was asked --

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    def bytes_served(self, path: str | None = None) -> int:
        """Response body bytes handed to the socket, in all or for one URL path or repository file path.

        A body is counted as it is written, so once a client holds the bytes they are counted; a
        client that hangs up mid-body may leave up to one chunk counted that it never read."""
        return sum(record.bytes_sent for record in self.requests if record.matches(path))

    def clear_requests(self) -> None:
        """Forget the recorded requests (bytes_served starts again from 0)."""
        with self._lock:
            self._requests.clear()

    def _record(self, record: RecordedRequest) -> RecordedRequest:
        with self._lock:
            self._requests.append(record)
        return record

    # -- faults --

    def corrupt(self, repo_id: str, path: str, offset: int, *, repo_type: str = "model") -> None:
        """Flip one byte (XOR 0xFF) at `offset` of `path` wherever it is served, CDN included.

        Size and headers (ETag, X-Linked-Etag) stay those of the true content."""
        repo = self._repo(repo_type, repo_id)
        with self._lock:
            sizes = [commit.files[path].size for commit in repo.commits.values() if path in commit.files]
            if not sizes or not 0 <= offset < max(sizes):
                raise ValueError(f"{path!r} has no byte at offset {offset} in {repo_id}")
            self._corruptions.setdefault((repo_type, repo_id, path), set()).add(offset)

    def fail_next(
        self,
        n: int = 1,
        status: int = 503,
        *,
        path: str | None = None,
        method: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer the next `n` requests (for `path`, a URL or repository file path; for `method`) with
        `status`, an `X-Error-Message` and a JSON error body; `headers` adds e.g. Retry-After."""
        with self._lock:
            self._failures.append(_Failure(n, status, path, method, dict(headers or {})))

    def stall(
        self, path: str, after_bytes: int, seconds: float, *, repo_id: str | None = None, times: int | None = 1
    ) -> None:
        """Pause the body of the next `times` GETs of `path` (None: all) for `seconds` after
        `after_bytes` bytes of that response; stop() cuts the pause short. An /api URL path as
        `path` pauses that answer after its headers, before any of its body."""
        with self._lock:
            self._body_faults.append(_BodyFault("stall", path, repo_id, after_bytes, seconds, times))

    def drop(self, path: str, after_bytes: int, *, repo_id: str | None = None, times: int | None = 1) -> None:
        """Close the connection of the next `times` GETs of `path` (None: all) after `after_bytes`
        bytes of that response: the client sees a body shorter than its Content-Length."""
        with self._lock:
            self._body_faults.append(_BodyFault("drop", path, repo_id, after_bytes, 0.0, times))

    def drip(
        self,
        path: str,
        seconds: float,
        *,
        after_bytes: int = 0,
        repo_id: str | None = None,
        times: int | None = 1,
    ) -> None:
        """Send the body of the next `times` GETs of `path` (None: all) one byte every `seconds`
        after `after_bytes` bytes: never a stall of a whole read, never done. An /api URL path
        drips that answer from its first byte; stop() cuts it short."""
        with self._lock:
            self._body_faults.append(_BodyFault("drip", path, repo_id, after_bytes, seconds, times))

    def link_tree_to(self, base_url: str | None) -> None:
        """Give every tree page a `Link: <base_url/same path?same query&cursor=…>; rel="next"`, even
        the last one: the listing "continues" on another host (e.g. a second StandinHub's url that
        serve_any_tree()s). None stops it."""
        with self._lock:
            self._tree_link_base = base_url.rstrip("/") if base_url else None

    def serve_any_tree(self, entries: list[dict] | None) -> None:
        """Answer every tree listing, of any repository and revision, with `entries` (200, no
        Link): what a host that should never be asked would hand back. None stops it."""
        with self._lock:
            self._any_tree = list(entries) if entries is not None else None

    def endless_tree(self, per_page: int | None = 1, *, repo_id: str | None = None) -> None:
        """Page every tree listing (of `repo_id` only, if given) forever: each page holds `per_page`
        fresh, valid empty files and a Link to the next cursor. None stops it."""
        with self._lock:
            self._endless_page_size, self._endless_repo_id = per_page, repo_id

    def redirect_lfs_to(self, target: StandinHub | str | None) -> None:
        """Answer /resolve of LFS files with 302 to a second host (a "CDN") that serves the same bytes.

        `target` is another started StandinHub (its `requests` then show what reached the CDN), or a
        URL that reaches this same hub under another origin, e.g. `hub.url.replace("127.0.0.1",
        "localhost")`. The 302 carries X-Repo-Commit, X-Linked-Etag and X-Linked-Size. None stops it."""
        with self._lock:
            self._lfs_target = target

    def hostile_tree(
        self,
        repo_id: str,
        extra_entries: list[dict] | None = None,
        *,
        repo_type: str = "model",
        content: bytes = b"evil\n",
    ) -> list[dict]:
        """Add raw entries to every tree listing, paths-info and siblings of the repo; returns them.

        Missing keys are filled in (`type` file, `size`, `oid` of `content`); a file entry whose
        exact path is asked for at /resolve serves `content`, so a client that follows it writes
        it. Without `extra_entries`, adds one file per `HOSTILE_PATHS` entry and a directory
        "escape"."""
        repo = self._repo(repo_type, repo_id)
        if extra_entries is None:
            extra_entries = [{"path": path} for path in HOSTILE_PATHS] + [{"type": "directory", "path": "escape"}]
        filled = []
        for entry in extra_entries:
            entry = dict(entry)
            entry.setdefault("type", "file")
            entry.setdefault("oid", git_blob_sha1(content))
            entry.setdefault("size", len(content) if entry["type"] == "file" else 0)
            entry.setdefault("content", content)
            filled.append(entry)
        with self._lock:
            repo.hostile.extend(filled)
        return [{key: value for key, value in entry.items() if key != "content"} for entry in filled]

    def reset_faults(self) -> None:
        """Clear every fault: failures, stalls, drops, drips, corruptions, hostile entries, the LFS
        redirect, the tree's foreign Link, endless pages and serve_any_tree."""
        with self._lock:
            self._failures.clear()
            self._body_faults.clear()
            self._corruptions.clear()
            self._lfs_target = None
            self._tree_link_base = self._any_tree = self._endless_page_size = self._endless_repo_id = None
            for repo in self._repos.values():
                repo.hostile.clear()

    # -- faults, as the handler sees them --

    def _take_failure(self, record: RecordedRequest) -> _Failure | None:
        with self._lock:
            for failure in self._failures:
                if (
                    failure.remaining > 0
                    and record.matches(failure.path)
                    or (failure.remaining > 0 and failure.path is not None and record.path.endswith("/" + failure.path))
                ):
                    if failure.method is not None and failure.method != record.method:
                        continue
                    failure.remaining -= 1
                    return failure
        return None

    def _body_faults_for(self, record: RecordedRequest) -> list[_BodyFault]:
        with self._lock:
            return [
                fault
                for fault in self._body_faults
                if fault.remaining != 0
                and record.matches(fault.path)
                and (fault.repo_id is None or fault.repo_id == record.repo_id)
            ]

    def _consume(self, fault: _BodyFault) -> bool:
        """Use one firing of a fault; False when another response used the last one."""
        with self._lock:
            if fault.remaining is None:
                return True
            if fault.remaining <= 0:
                return False
            fault.remaining -= 1
            return True

    def _corruptions_for(self, repo_type: str, repo_id: str, path: str) -> frozenset[int]:
        with self._lock:
            return frozenset(self._corruptions.get((repo_type, repo_id, path), ()))

    def _hostile_file(self, repo: _Repo, path: str) -> HubFile | None:
        with self._lock:
            for entry in repo.hostile:
                if entry["path"] == path and entry["type"] == "file":
                    source = _BytesSource(entry["content"])
                    blob_sha1, sha256 = _digests(source)
                    return HubFile(path, source.size, blob_sha1, sha256, False, source)
        return None

    def _lfs_location(self, repo: _Repo, hub_file: HubFile) -> str | None:
        with self._lock:
            target = self._lfs_target
        if target is None:
            return None
        cdn = target if isinstance(target, StandinHub) else self
        base = target.url if isinstance(target, StandinHub) else target.rstrip("/")
        key = hashlib.sha1(f"{id(self)}:{repo.repo_type}:{repo.repo_id}:{hub_file.path}:{hub_file.sha256}".encode())
        with cdn._lock:
            cdn._cdn_objects[key.hexdigest()] = (self, repo.repo_type, repo.repo_id, hub_file)
        return f"{base}/cdn-lfs/{key.hexdigest()}/{hub_file.sha256}"
