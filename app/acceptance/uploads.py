"""V1 screenshots: uploaded PNG or JPEG files, checked to be images, kept as files beside the database.

A file is accepted by what it is — its magic bytes and a strict parse of its structure — never by
its name or the client's content type. It is stored once per node under
<instance>/acceptance/<node id>/<sha256>.<ext>; its row holds metadata only.

P5: the image must be decodable and small enough to decode, because the console and every export
hand it to a browser. No image library is a dependency, and none is added for this: zlib (the
standard library's, in C) inflates a PNG's pixel data — exactly the rows its header promises, each
with a valid filter byte, streamed so memory stays flat — and a JPEG's segments are walked from SOI
to EOI: quantisation and Huffman tables present for what the frame and scan use, and entropy-coded
data at least as long as its blocks can be coded in. Both are capped at MAX_DIMENSION a side and
MAX_PIXELS in all, before a byte of pixel data is read.
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
# A tall full-page capture is a few thousand pixels wide and up to this high; 8K UHD (7680×4320,
# 33 Mpx) fits the pixel cap. A 20000×20000 "screenshot" (400 Mpx, 1.6 GB to decode) does not.
MAX_DIMENSION = 16_384
MAX_PIXELS = 40_000_000
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


def _check_size(width: int, height: int) -> None:
    """P5: the caps, checked from the header before any pixel data is read."""
    if not (0 < width <= MAX_DIMENSION and 0 < height <= MAX_DIMENSION):
        raise NotAnImage(f"its dimensions {width}×{height} are outside 1–{MAX_DIMENSION} pixels")
    if width * height > MAX_PIXELS:
        raise NotAnImage(f"its {width * height:,} pixels are more than the {MAX_PIXELS:,} a screenshot may have")


# PNG colour types and the bit depths each allows (PNG §11.2.2), and the samples per pixel.
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Adam7: each pass's first column and row, and its steps.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_INFLATE_STEP = 2**20


def _png_rows(width: int, height: int, bits_per_pixel: int, interlaced: bool) -> list[tuple[int, int]]:
    """(bytes per scanline with its filter byte, scanlines) of each pass of the image data."""
    passes = _ADAM7 if interlaced else ((0, 0, 1, 1),)
    rows = []
    for x, y, dx, dy in passes:
        columns, lines = -(-(width - x) // dx), -(-(height - y) // dy)
        if columns > 0 and lines > 0:
            rows.append((1 + -(-(columns * bits_per_pixel) // 8), lines))
    return rows


def _png_pixels(idat: list[bytes], rows: list[tuple[int, int]]) -> None:
    """Inflate the image data a MiB at a time: exactly the promised scanlines, every filter byte 0–4."""
    inflater = zlib.decompressobj()
    layout = iter(rows)
    line, left = next(layout)
    position = 0  # within the current scanline
    pending = b"".join(idat)
    try:
        while True:
            piece = inflater.decompress(pending, _INFLATE_STEP)
            pending = inflater.unconsumed_tail
            offset = 0
            while offset < len(piece):
                if left == 0:
                    raise NotAnImage("the PNG holds more image data than its dimensions")
                if position == 0 and piece[offset] > 4:
                    raise NotAnImage(f"a PNG scanline has filter type {piece[offset]}, not 0–4")
                taken = min(line - position, len(piece) - offset)
                offset += taken
                position += taken
                if position == line:
                    position, left = 0, left - 1
                    if left == 0:
                        line, left = next(layout, (line, 0))
            if not piece and not pending:
                break
    except zlib.error:
        raise NotAnImage("the PNG's image data is not a zlib stream") from None
    if not inflater.eof or left or position:
        raise NotAnImage("the PNG's image data is cut short: it holds fewer rows than its dimensions")
    if inflater.unused_data:
        raise NotAnImage("the PNG holds more image data than its dimensions")


def _png(data: bytes) -> ImageFacts:
    """Walk every chunk (lengths and CRCs) from IHDR to IEND, then decode the image data's rows."""
    offset, header, idat, ended, palette = len(_PNG_SIGNATURE), None, [], False, False
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
        body = data[offset + 8 : body_end]
        offset = body_end + 4
        if header is None:
            if kind != b"IHDR" or length != 13:
                raise NotAnImage("the PNG does not start with its header")
            header = struct.unpack(">IIBBBBB", body)
            width, height, depth, colour, compression, filtering, interlace = header
            _check_size(width, height)
            if depth not in _PNG_DEPTHS.get(colour, ()):
                raise NotAnImage(f"the PNG's colour type {colour} with bit depth {depth} is not one PNG defines")
            if compression or filtering or interlace not in (0, 1):
                raise NotAnImage("the PNG's header names a compression, filter or interlace method PNG does not define")
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"PLTE":
            palette = True
        elif kind == b"IEND":
            ended = True
            break
        elif kind[0] & 0x20 == 0:  # a critical chunk this parser does not know cannot be skipped
            raise NotAnImage(f"the PNG has a critical chunk {kind.decode('latin-1')!r} no decoder knows")
    if not ended:
        raise NotAnImage("the PNG has no end")
    if offset != len(data):
        raise NotAnImage("the PNG has bytes after its end")
    if not idat:
        raise NotAnImage("the PNG has no image data")
    width, height, depth, colour, _, _, interlace = header
    if colour == 3 and not palette:
        raise NotAnImage("the PNG uses a palette it does not have")
    _png_pixels(idat, _png_rows(width, height, depth * _PNG_SAMPLES[colour], bool(interlace)))
    return ImageFacts(PNG, width, height)


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_ARITHMETIC = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
_DHT, _DQT, _SOS, _EOI, _DRI = 0xC4, 0xDB, 0xDA, 0xD9, 0xDD


@dataclass
class _Frame:
    width: int
    height: int
    components: dict[int, tuple[int, int, int]]  # id: (horizontal, vertical sampling, quantisation table)
    huffman: bool
    progressive: bool


def _jpeg_frame(marker: int, body: bytes) -> _Frame:
    if len(body) < 6:
        raise NotAnImage("the JPEG frame header is cut short")
    precision, height, width, count = struct.unpack(">BHHB", body[:6])
    if precision not in (8, 12, 16) or count not in (1, 3, 4) or len(body) != 6 + 3 * count:
        raise NotAnImage("the JPEG frame header is not one a decoder reads")
    _check_size(width, height)
    components = {}
    for index in range(count):
        ident, sampling, table = body[6 + 3 * index : 9 + 3 * index]
        horizontal, vertical = sampling >> 4, sampling & 0x0F
        if not (1 <= horizontal <= 4 and 1 <= vertical <= 4) or table > 3:
            raise NotAnImage("a JPEG component's sampling or table is out of range")
        components[ident] = (horizontal, vertical, table)
    return _Frame(width, height, components, marker not in _ARITHMETIC, marker in _PROGRESSIVE)


def _jpeg_tables(marker: int, body: bytes, quantisation: set[int], huffman: set[tuple[int, int]]) -> None:
    """Read a DQT or DHT segment's tables (it may hold several), checking each one's length."""
    position = 0
    while position < len(body):
        kind = body[position]
        if marker == _DQT:
            size = 1 + 64 * (2 if kind >> 4 else 1)
            if kind >> 4 > 1 or kind & 0x0F > 3:
                raise NotAnImage("a JPEG quantisation table is malformed")
            quantisation.add(kind & 0x0F)
        else:
            counts = body[position + 1 : position + 17]
            if len(counts) != 16 or kind >> 4 > 1 or kind & 0x0F > 3 or not 0 < sum(counts) <= 256:
                raise NotAnImage("a JPEG Huffman table is malformed")
            size = 17 + sum(counts)
            huffman.add((kind >> 4, kind & 0x0F))
        if position + size > len(body):
            raise NotAnImage("a JPEG table is cut short")
        position += size


def _entropy_end(data: bytes, start: int) -> tuple[int, int]:
    """Where a scan's entropy-coded data ends (the next marker that is not a stuffed 0xFF00 or a restart)
    and how many bytes of coded data it holds."""
    position, coded = start, 0
    while True:
        found = data.find(b"\xff", position)
        if found < 0 or found + 1 >= len(data):
            raise NotAnImage("the JPEG has no end")
        following = data[found + 1]
        coded += found - position
        if following == 0x00:
            coded += 1
            position = found + 2
        elif 0xD0 <= following <= 0xD7:
            position = found + 2
        elif following == 0xFF:
            position = found + 1
        else:
            return found, coded


def _jpeg(data: bytes) -> ImageFacts:
    """Walk the segments from SOI to EOI: the frame, the tables its scans use, and data in each scan.

    Every 8×8 block of a scan is coded in at least one bit (a Huffman code is one bit or more: two,
    a DC code and end-of-block, in a baseline scan), so a scan shorter than that cannot hold the
    image its frame header describes.
    """
    offset, frame, scans = 2, None, 0
    quantisation: set[int] = set()
    huffman: set[tuple[int, int]] = set()
    while True:
        while offset < len(data) and data[offset] == 0xFF and offset + 1 < len(data) and data[offset + 1] == 0xFF:
            offset += 1  # fill bytes
        if offset + 2 > len(data):
            raise NotAnImage("the JPEG has no end" if frame else "the JPEG has no frame header")
        if data[offset] != 0xFF:
            raise NotAnImage("a JPEG segment does not start with a marker")
        marker = data[offset + 1]
        if marker == _EOI:
            offset += 2
            break
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            raise NotAnImage("the JPEG has a marker out of place")
        if offset + 4 > len(data):
            raise NotAnImage("a JPEG segment is cut short")
        (length,) = struct.unpack(">H", data[offset + 2 : offset + 4])
        if length < 2 or offset + 2 + length > len(data):
            raise NotAnImage("a JPEG segment is cut short")
        body = data[offset + 4 : offset + 2 + length]
        offset += 2 + length
        if marker in _SOF:
            if frame is not None:
                raise NotAnImage("the JPEG has two frame headers")
            frame = _jpeg_frame(marker, body)
        elif marker in (_DQT, _DHT):
            _jpeg_tables(marker, body, quantisation, huffman)
        elif marker == _SOS:
            if frame is None:
                raise NotAnImage("the JPEG has a scan before its frame header")
            count = body[0] if body else 0
            if not 1 <= count <= 4 or len(body) != 4 + 2 * count:
                raise NotAnImage("a JPEG scan header is malformed")
            for index in range(count):
                ident, tables = body[1 + 2 * index], body[2 + 2 * index]
                if ident not in frame.components:
                    raise NotAnImage("a JPEG scan names a component its frame does not have")
                if frame.components[ident][2] not in quantisation:
                    raise NotAnImage("the JPEG has no quantisation table for a component it codes")
                start, end = body[1 + 2 * count], body[2 + 2 * count]
                needed = ([(0, tables >> 4)] if start == 0 else []) + ([(1, tables & 0x0F)] if end > 0 else [])
                if frame.huffman and not set(needed) <= huffman:
                    raise NotAnImage("the JPEG has no Huffman table for what a scan codes")
            offset, coded = _entropy_end(data, offset)
            blocks = _luma_blocks(frame, body[1])
            bits_per_block = 1 if frame.progressive or not frame.huffman else 2
            if coded * 8 < blocks * bits_per_block:
                raise NotAnImage(
                    f"the JPEG's scan holds {coded} bytes of image data, too few for {frame.width}×{frame.height}"
                )
            scans += 1
    if frame is None:
        raise NotAnImage("the JPEG has no frame header")
    if not scans:
        raise NotAnImage("the JPEG has no image data")
    if offset != len(data):
        raise NotAnImage("the JPEG has bytes after its end")
    return ImageFacts(JPEG, frame.width, frame.height)


def _luma_blocks(frame: _Frame, component: int) -> int:
    """The 8×8 blocks of one component at its sampling (the fewest any scan of it codes)."""
    horizontal, vertical, _ = frame.components[component]
    widest = max(h for h, _, _ in frame.components.values())
    tallest = max(v for _, v, _ in frame.components.values())
    columns = -(-frame.width * horizontal // widest)
    lines = -(-frame.height * vertical // tallest)
    return -(-columns // 8) * -(-lines // 8)


def identify(data: bytes) -> ImageFacts:
    """The image's type and dimensions from its bytes alone, checked to be decodable; NotAnImage otherwise."""
    if data.startswith(_PNG_SIGNATURE):
        return _png(data)
    if data.startswith(b"\xff\xd8\xff"):
        return _jpeg(data)
    raise NotAnImage("it is neither a PNG nor a JPEG")


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
