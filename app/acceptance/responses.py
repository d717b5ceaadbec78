"""The two files the console and the API both hand out (V1): a screenshot and the evidence bundle.

One place builds each response, so both entry points serve them with the same type, disposition
and caching: never cached (evidence is an operator's), never sniffed as another type.
"""

from __future__ import annotations

import io

from flask import Response, send_file

from app.acceptance.export import export_bundle
from app.acceptance.uploads import screenshot_file


def _private(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def screenshot_response(node_id: str, screenshot_id: int) -> Response:
    """One stored screenshot, inline, as the image type it was checked to be."""
    path, content_type = screenshot_file(node_id, screenshot_id)
    response = send_file(path, mimetype=content_type, conditional=False, max_age=0)
    response.headers["Content-Disposition"] = "inline"
    return _private(response)


def bundle_response(node_id: str) -> Response:
    """The node's evidence zip (report.json, report.html, screenshots/) as a download."""
    filename, data = export_bundle(node_id)
    return _private(send_file(io.BytesIO(data), mimetype="application/zip", as_attachment=True, download_name=filename))
