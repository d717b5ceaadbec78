"""V1 screenshots: uploaded PNG or JPEG files, checked to be images, kept as files beside the database.

A file is accepted by what it is — its magic bytes and a parse of its structure down to its
dimensions — never by its name or the client's content type. It is stored once per node under
<instance>/acceptance/<node id>/<sha256>.<ext>; its row holds metadata only.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from app import nodes
from app.errors import DomainError
from app.extensions import db
from app.models import AcceptanceScreenshot
from app.timeutil import utcnow

# One fact: the upload limit the domain checks, the API's request limit is derived from it
# (MAX_UPLOAD_REQUEST_BYTES, which deploy/nginx/nginx.conf's screenshot location repeats).
MAX_SCREENSHOT_BYTES = 5 * 2**20
# The multipart envelope around the file, rounded up to whole MiB as nginx writes sizes.
MAX_UPLOAD_REQUEST_BYTES = MAX_SCREENSHOT_BYTES + 2**20
MAX_DIMENSION = 32_768
MAX_FILENAME = 100
# The largest screenshot id (a 32-bit key): a larger one names no row, and is refused before the
# database sees it (an integer past 2**63 overflows SQLite's driver). OpenAPI states the same bound.
MAX_SCREENSHOT_ID = 2**31 - 1
PNG, JPEG = "image/png", "image/jpeg"
EXTENSIONS = {PNG: "png", JPEG: "jpg"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")
Screenshot = AcceptanceScreenshot


@dataclass(frozen=True)
class ImageFacts:
    """What the bytes are: content type and dimensions."""

    content_type: str
    width: int
    height: int


class NotAnImage(ValueError):
    """The bytes are not a whole PNG or JPEG."""


def _png(data: bytes) -> ImageFacts:
    """Walk every chunk (lengths and CRCs) from IHDR to IEND."""
    offset, width, height, ended = len(_PNG_SIGNATURE), None, None, False
    while offset < len(data):
        if offset + 12 > len(data):
            raise NotAnImage("a PNG chunk is cut short")
        length, kind = struct.unpack(">I4s", data[offset : offset + 8])
        body_end = offset + 8 + length
        if body_end + 4 > len(data):
            raise NotAnImage("a PNG chunk is cut short")
        (crc,) = struct.unpack(">I", data[body_end : body_end + 4])
        if zlib.crc32(data[offset + 4 : body_end]) != crc:
            raise NotAnImage("a PNG chunk's checksum is wrong")
        if width is None:
            if kind != b"IHDR" or length != 13:
                raise NotAnImage("the PNG does not start with its header")
            width, height = struct.unpack(">II", data[offset + 8 : offset + 16])
        if kind == b"IEND":
            ended = True
            break
        offset = body_end + 4
    if not ended:
        raise NotAnImage("the PNG has no end")
    return ImageFacts(PNG, width, height)


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> ImageFacts:
    """Walk the segments up to the frame header (SOFn), which holds the dimensions."""
    offset = 2
    while offset + 4 <= len(data):
        if data[offset] != 0xFF:
            raise NotAnImage("a JPEG segment does not start with a marker")
        marker = data[offset + 1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            offset += 2
            continue
        (length,) = struct.unpack(">H", data[offset + 2 : offset + 4])
        if length < 2 or offset + 2 + length > len(data):
            raise NotAnImage("a JPEG segment is cut short")
        if marker in _SOF:
            if length < 7:
                raise NotAnImage("the JPEG frame header is cut short")
            height, width = struct.unpack(">HH", data[offset + 5 : offset + 9])
            if b"\xff\xd9" not in data[offset:]:
                raise NotAnImage("the JPEG has no end")
            return ImageFacts(JPEG, width, height)
        if marker == 0xDA:
            break
        offset += 2 + length
    raise NotAnImage("the JPEG has no frame header")


def identify(data: bytes) -> ImageFacts:
    """The image's type and dimensions from its bytes alone; NotAnImage otherwise."""
    if data.startswith(_PNG_SIGNATURE):
        facts = _png(data)
    elif data.startswith(b"\xff\xd8\xff"):
        facts = _jpeg(data)
    else:
        raise NotAnImage("it is neither a PNG nor a JPEG")
    if not (0 < facts.width <= MAX_DIMENSION and 0 < facts.height <= MAX_DIMENSION):
        raise NotAnImage(f"its dimensions {facts.width}×{facts.height} are outside 1–{MAX_DIMENSION} pixels")
    return facts


def safe_filename(name: str | None, content_type: str) -> str:
    """The uploaded name for display only: its last path part, safe characters, at most MAX_FILENAME."""
    base = re.split(r"[/\\]", name or "")[-1]
    base = _SAFE_NAME.sub("_", base).strip(" ._")[:MAX_FILENAME]
    return base or f"screenshot.{EXTENSIONS[content_type]}"


def too_large(size: int) -> DomainError:
    """413 SCREENSHOT_TOO_LARGE, with the limit said once."""
    return DomainError(
        "SCREENSHOT_TOO_LARGE",
        f"The upload is {size} bytes; a screenshot may be at most {MAX_SCREENSHOT_BYTES} bytes "
        f"({MAX_SCREENSHOT_BYTES // 2**20} MiB).",
        "Upload a smaller PNG or JPEG (crop it, or save it as JPEG).",
        limit_bytes=MAX_SCREENSHOT_BYTES,
    )


def directory(node_id: str) -> Path:
    """Where this node's screenshot files live."""
    from app.config import current_settings

    return Path(current_settings().instance_path) / "acceptance" / node_id


def _write_file(path: Path, data: bytes) -> bool:
    """Store the bytes at `path` atomically unless a file is already there; whether it was written."""
    if path.is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


def add_screenshot(node_id: str, filename: str, data: bytes, actor: str) -> Screenshot:
    """Keep an uploaded screenshot; 413 SCREENSHOT_TOO_LARGE or 400 SCREENSHOT_NOT_IMAGE store nothing.

    The same bytes uploaded twice for one node are kept once (the existing row is returned, its
    file written again if it went missing).
    """
    from app import audit
    from app.acceptance import checklist

    node = checklist.lock_node(node_id)
    if len(data) > MAX_SCREENSHOT_BYTES:
        raise too_large(len(data))
    try:
        facts = identify(data)
    except NotAnImage as error:
        raise DomainError(
            "SCREENSHOT_NOT_IMAGE",
            f"The upload is not a whole PNG or JPEG image: {error}.",
            "Upload a screenshot saved as PNG or JPEG.",
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    existing = db.session.scalar(
        sa.select(AcceptanceScreenshot).where(
            AcceptanceScreenshot.node_id == node_id, AcceptanceScreenshot.sha256 == digest
        )
    )
    path = directory(node_id) / f"{digest}.{EXTENSIONS[facts.content_type]}"
    if existing is not None:
        # The row is kept; its file may not be (a restore without the instance folder): write it again.
        _write_file(path, data)
        db.session.rollback()
        return existing
    created = _write_file(path, data)
    shot = AcceptanceScreenshot(
        node_id=node_id,
        filename=safe_filename(filename, facts.content_type),
        content_type=facts.content_type,
        size_bytes=len(data),
        sha256=digest,
        width=facts.width,
        height=facts.height,
        uploaded_at=utcnow(),
        uploaded_by=actor[:100],
    )
    try:
        db.session.add(shot)
        db.session.flush()
        audit.record(
            actor,
            checklist.EVIDENCE_RECORDED,
            node_id,
            item=checklist.SCREENSHOTS,
            state=checklist.OBSERVED,
            screenshot_id=shot.id,
            sha256=digest,
        )
        checklist.capture_node_api_output(node_id)
        checklist.recheck(node, actor)
        db.session.commit()
    except BaseException:
        db.session.rollback()
        if created:
            path.unlink(missing_ok=True)
        raise
    return shot


def screenshots(node_id: str) -> list[Screenshot]:
    """The node's screenshots, oldest first (metadata)."""
    nodes.get(node_id)
    return list(
        db.session.scalars(
            sa.select(AcceptanceScreenshot)
            .where(AcceptanceScreenshot.node_id == node_id)
            .order_by(AcceptanceScreenshot.id)
        )
    )


def _not_found(node_id: str, screenshot_id: int) -> DomainError:
    return DomainError(
        "SCREENSHOT_NOT_FOUND",
        f"Node {node_id} has no screenshot {screenshot_id}.",
        "List the node's screenshots with GET /api/v1/admin/nodes/{id}/acceptance.",
    )


def file_name(shot: Screenshot) -> str:
    """The stored file's name: its SHA-256 and extension."""
    return f"{shot.sha256}.{EXTENSIONS.get(shot.content_type, 'bin')}"


def screenshot_file(node_id: str, screenshot_id: int) -> tuple[Path, str]:
    """The stored file of one screenshot and its content type; 404 SCREENSHOT_NOT_FOUND otherwise."""
    if not 1 <= screenshot_id <= MAX_SCREENSHOT_ID:
        raise _not_found(node_id, screenshot_id)
    shot = db.session.get(AcceptanceScreenshot, screenshot_id)
    if shot is None or shot.node_id != node_id:
        raise _not_found(node_id, screenshot_id)
    path = directory(node_id) / file_name(shot)
    if not path.is_file():
        raise _not_found(node_id, screenshot_id)
    return path, shot.content_type
