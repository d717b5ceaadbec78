"""V1 export: one zip per node that a release note can cite — report.json, report.html, screenshots/."""

from __future__ import annotations

import html
import io
import json
import zipfile
from importlib import metadata

from app import nodes
from app.acceptance import checklist, secrets_scan, uploads
from app.timeutil import isoformat, utcnow

STATE_COLOURS = {checklist.OBSERVED: "#1a7f37", checklist.MISSING: "#9a6700", checklist.CONTRADICTED: "#cf222e"}


def control_plane_version() -> str:
    """The installed control plane's version, or 'unknown' when run from an uninstalled tree."""
    try:
        return metadata.version("modelforge")
    except metadata.PackageNotFoundError:
        return "unknown"


def report(node_id: str) -> tuple[dict[str, object], list[tuple[str, uploads.Screenshot]]]:
    """The JSON report and the screenshots (zip path, row) that go with it."""
    from app.config import current_settings

    result = checklist.evaluate(node_id)
    described = nodes.describe([node_id], current_settings())
    node, _ = secrets_scan.scrub_evidence(described[0] if described else {}, node_id)
    # P2: the items' evidence was scrubbed when stored; scrubbed again, a row kept before a shape
    # joined app.redaction's list cannot carry it into a bundle that leaves the control plane.
    items, _ = secrets_scan.scrub_evidence(result.to_dict(), node_id)
    shots = [(f"screenshots/{uploads.file_name(shot)}", shot) for shot in uploads.screenshots(node_id)]
    document = {
        "generated_at": isoformat(utcnow()),
        "control_plane_version": control_plane_version(),
        "node": node,
        "checklist": items,
        "screenshots": [{**shot.to_dict(), "file": path} for path, shot in shots],
    }
    return document, shots


def _html(document: dict[str, object]) -> str:
    """A self-contained page: inline style, no script, no external resource; screenshots linked relatively."""
    escape = html.escape
    result = document["checklist"]
    node = document["node"]
    rows = []
    for item in result["items"]:
        colour = STATE_COLOURS.get(item["state"], "#57606a")
        rows.append(
            "<tr>"
            f"<td>{escape(item['title'])}</td>"
            f'<td style="color:{colour};font-weight:bold">{escape(item["state"])}</td>'
            f"<td>{escape(item['observed_at'] or '—')}</td>"
            f"<td>{escape(item['source'])}</td>"
            f"<td>{escape(item['detail'])}"
            f"<details><summary>evidence</summary><pre>{escape(json.dumps(item['evidence'], indent=2))}</pre>"
            "</details></td></tr>"
        )
    images = "".join(
        f'<figure><a href="{escape(shot["file"])}"><img src="{escape(shot["file"])}" alt="{escape(shot["filename"])}" '
        f'style="max-width:100%"></a><figcaption>{escape(shot["filename"])} ({shot["width"]}×{shot["height"]}, '
        f"uploaded {escape(shot['uploaded_at'] or '')}, sha256 {escape(shot['sha256'])})</figcaption></figure>"
        for shot in document["screenshots"]
    )
    verdict = "validated" if result["validated"] else "not validated"
    title = f"Acceptance evidence — {node.get('display_name') or result['node_id']}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:75rem}}table{{border-collapse:collapse}}
td,th{{border:1px solid #d0d7de;padding:.4rem;vertical-align:top;text-align:left}}
pre{{white-space:pre-wrap;font-size:.8rem;max-height:30rem;overflow:auto}}</style></head>
<body><h1>{escape(title)}</h1>
<p>Node <code>{escape(result["node_id"])}</code> ({escape(str(node.get("hostname") or ""))}) is
<strong>{verdict}</strong>; production eligible: {"yes" if result["production_eligible"] else "no"}.</p>
<p>Generated {escape(document["generated_at"] or "")} by ModelForge {escape(document["control_plane_version"])}.
The same data is in report.json.</p>
<table><thead><tr><th>Item</th><th>State</th><th>Observed at</th><th>Source</th><th>Detail</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
<h2>Screenshots</h2>{images or "<p>None uploaded.</p>"}
</body></html>
"""


def export_bundle(node_id: str) -> tuple[str, bytes]:
    """The node's evidence bundle: a file name and a zip of report.json, report.html and screenshots/."""
    document, shots = report(node_id)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("report.json", json.dumps(document, indent=2, ensure_ascii=False))
        bundle.writestr("report.html", _html(document))
        for path, shot in shots:
            stored = uploads.directory(node_id) / uploads.file_name(shot)
            if stored.is_file():
                bundle.write(stored, path, compress_type=zipfile.ZIP_STORED)
    stamp = utcnow().strftime("%Y%m%dT%H%M%SZ")
    return f"modelforge-acceptance-{node_id}-{stamp}.zip", buffer.getvalue()
