"""Acceptance evidence in the console, through Flask's test client (V1, C1, P2, P5).

A node's acceptance page shows each item's state in words, when and by what it was observed, and
its evidence; the pasted `docker inspect` and the screenshot upload refuse bad input inline with
the reason, keeping what was typed and storing nothing; production eligibility is refused (409,
the missing items named) until the node is validated; screenshots and the bundle reach a signed-in
operator only; no secret reaches a page. Everything runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import sqlite3
import zipfile
from datetime import timedelta
from html import unescape
from pathlib import Path

import pytest
import sqlalchemy as sa
from werkzeug.datastructures import FileStorage
from werkzeug.test import encode_multipart

from app.acceptance import ITEMS, MAX_SCREENSHOT_BYTES
from app.config import current_settings
from app.extensions import db
from app.models import AcceptanceEvidence, AcceptanceScreenshot, AuditEvent, Node, NodeLease
from app.nodes import liveness
from tests.support import ADMIN, assert_no_secrets, factories
from tests.support.acceptance import ENV_SECRET, GPU_UUID, SMI_OUTPUT, inspect_text, png, publish, smoke_test
from tests.support.console import HTMX, htmx_post
from tests.support.nodes import beat

ITEM_NAMES = [name for name, _ in ITEMS]


@pytest.fixture
def node(console):
    """An enrolled node that has sent nothing yet: every item is missing."""
    enrolled = factories.enrolled_node(console)
    return {"id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"]), **enrolled}


def page(console, node_id: str, status: int = 200) -> str:
    response = console.get(f"/hardware/nodes/{node_id}/acceptance")
    assert response.status_code == status, response.get_data(as_text=True)[:2000]
    return unescape(response.get_data(as_text=True))


def states(html: str) -> dict[str, str]:
    """Each item's state as the page shows it (data-state on its <li>)."""
    return dict(
        re.findall(r'<li class="mf-acceptance-item" id="acceptance-\w+" data-item="(\w+)" data-state="(\w+)"', html)
    )


def verdict(html: str) -> str:
    """The verdict block's text, tags stripped and spaces collapsed."""
    block = re.search(r'<div class="mf-verdict" data-testid="verdict".*?</div>', html, re.S)[0]
    return " ".join(re.sub(r"<[^>]+>", " ", block).split()).replace(" .", ".")


def textarea(html: str) -> str:
    """What the inspect textarea holds (WTForms starts it with a line break, which browsers drop)."""
    return re.search(r'<textarea[^>]*name="inspect"[^>]*>\r?\n?(.*?)</textarea>', html, re.S)[1]


def post_inspect(console, node_id: str, text: str, htmx: bool = True):
    data = {"inspect": text, "csrf_token": console.csrf}
    path = f"/hardware/nodes/{node_id}/acceptance/container-status"
    if htmx:
        return htmx_post(console, path, data=data, content_type="multipart/form-data")
    return console.post(path, data=data, content_type="multipart/form-data")


def image_file(data: bytes, filename: str) -> FileStorage:
    return FileStorage(io.BytesIO(data), filename=filename, content_type="image/png")


def upload(console, node_id: str, data: bytes, filename: str = "node-page.png", htmx: bool = True, **extra):
    """A multipart POST of one file, as the upload form sends it (encoded in memory, however large)."""
    boundary, body = encode_multipart({"screenshot": image_file(data, filename), **extra})
    path = f"/hardware/nodes/{node_id}/acceptance/screenshots"
    headers = {**HTMX, "X-CSRFToken": console.csrf} if htmx else {}
    return console.post(path, data=body, headers=headers, content_type=f"multipart/form-data; boundary={boundary}")


def stored(app) -> tuple[list[tuple[str, str]], int]:
    """The stored evidence rows (item, state) and the number of screenshot rows."""
    with app.app_context():
        rows = db.session.execute(sa.select(AcceptanceEvidence.item, AcceptanceEvidence.state)).all()
        shots = db.session.scalar(sa.select(sa.func.count()).select_from(AcceptanceScreenshot))
    return sorted(tuple(row) for row in rows), shots


def stored_files(app) -> list[Path]:
    """The screenshot files under the instance path (app.acceptance keeps them beside the database)."""
    with app.app_context():
        return sorted((Path(current_settings().instance_path) / "acceptance").glob("**/*.*"))


def eligible(app, node_id: str) -> bool:
    with app.app_context():
        return db.session.scalar(sa.select(Node.production_eligible).where(Node.id == node_id))


def go_stale_offline_and_return(app, client, node) -> None:
    """L1 for real: the liveness sweep at later moments marks the node stale then offline; a heartbeat returns it."""
    with app.app_context():
        settings = current_settings()
        last = db.session.scalar(sa.select(NodeLease.last_heartbeat_at).where(NodeLease.node_id == node["id"]))
        liveness.sweep(settings, now=last + timedelta(seconds=settings.node_stale_after_seconds + 1))
        liveness.sweep(settings, now=last + timedelta(seconds=settings.node_offline_after_seconds + 1))
    beat(client, node)


def all_but_the_operators_items(app, console, node) -> None:
    """Everything the control plane gathers itself: GPU facts, read-back, restart, recovery, smoke test."""
    publish(console, node, "a" * 32)
    beat(console, node)
    publish(console, node, "b" * 32)  # the agent restarted: a new start id, the same node and GPUs
    go_stale_offline_and_return(app, console, node)
    smoke_test(console, node)


# --------------------------------------------------------------------------- the page


def test_a_fresh_node_shows_every_item_missing_with_how_to_get_it(console, node):
    html = page(console, node["id"])
    assert states(html) == dict.fromkeys(ITEM_NAMES, "missing")
    for _, title in ITEMS:
        assert title in html
    assert html.count("Not observed yet") == len(ITEMS)
    # The verdict in words and colour, naming every missing item; the action is offered disabled.
    verdict = re.search(r'<div class="mf-verdict" data-testid="verdict" data-validated="false">(.*?)</div>', html, re.S)
    assert verdict and "not validated" in verdict[1] and "mf-state-contradicted" in verdict[1]
    assert all(title in verdict[1] for _, title in ITEMS)
    assert re.search(r'value="true" data-testid="mark-eligible"\s+disabled', html)
    # The operator's two items: the exact command, and the forms with their limits.
    assert (
        'docker inspect "$(docker compose --env-file .env -f docker-compose.node-agent.yml ps -q node-agent)"' in html
    )
    assert 'accept="image/png,image/jpeg"' in html and "at most 5.0 MiB" in html
    assert 'enctype="multipart/form-data"' in html and 'name="csrf_token"' in html
    assert node["credential"] not in html


def test_the_checklist_refreshes_as_a_partial(console, node):
    response = console.get(f"/hardware/nodes/{node['id']}/acceptance", headers=HTMX)
    html = response.get_data(as_text=True)
    assert response.status_code == 200 and "<html" not in html and html.lstrip().startswith("<section")
    assert 'id="acceptance-checklist"' in html and "acceptance-changed from:body" in html
    assert "HX-Request" in response.headers["Vary"]


def test_an_unknown_node_is_not_found(console):
    assert console.get("/hardware/nodes/00000000-0000-4000-8000-000000000000/acceptance").status_code == 404


def test_the_node_page_and_the_node_list_show_the_verdict(console, node):
    html = unescape(console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True))
    section = re.search(r'<section id="node-acceptance".*?</section>', html, re.S)[0]
    assert "not validated" in section and f"/hardware/nodes/{node['id']}/acceptance" in section
    assert re.findall(r'data-item="(\w+)" data-state="missing"', section) == ITEM_NAMES
    summary = console.get(f"/hardware/nodes/{node['id']}/acceptance?panel=summary", headers=HTMX)
    assert summary.get_data(as_text=True).lstrip().startswith('<section id="node-acceptance"')
    listing = unescape(console.get("/hardware/nodes").get_data(as_text=True))
    row = re.search(rf'<tr data-node-id="{node["id"]}">.*?</tr>', listing, re.S)[0]
    assert '<td class="mf-muted">not validated</td>' in row


def test_gpu_facts_are_compared_in_a_table_and_a_disagreement_is_contradicted(console, node):
    publish(console, node, "a" * 32)
    html = page(console, node["id"])
    assert states(html)["gpu_facts"] == "observed"
    table = re.search(r'<table class="mf-table mf-gpu-compare".*?</table>', html, re.S)[0]
    assert GPU_UUID in table and table.count("NVIDIA GeForce RTX 4080") == 2 and "16376 MiB" in table
    assert "✓</span> yes" in table
    publish(console, node, "a" * 32, smi_output=SMI_OUTPUT.replace("550.54.14", "535.00.01"))
    html = page(console, node["id"])
    assert states(html)["gpu_facts"] == "contradicted"
    table = re.search(r'<table class="mf-table mf-gpu-compare".*?</table>', html, re.S)[0]
    assert "✗</span> no" in table and "driver '535.00.01' in nvidia-smi, '550.54.14' in NVML" in table
    # The raw evidence is there too, collapsed.
    assert '<details class="mf-evidence" id="evidence-gpu_facts">' in html


def test_a_memory_field_past_int_limits_leaves_every_page_answering_and_the_item_contradicted(console, node):
    """P5: one node printing 4,301 digits of memory.total cannot take its pages, the list or the bundle down."""
    huge = "9" * 4301
    publish(console, node, "a" * 32, smi_output=SMI_OUTPUT.replace("16376 MiB", f"{huge} MiB"))
    html = page(console, node["id"])
    assert states(html)["gpu_facts"] == "contradicted"
    for url in (f"/hardware/nodes/{node['id']}", "/hardware/nodes", f"/hardware/nodes/{node['id']}/acceptance/bundle"):
        response = console.get(url)
        assert response.status_code == 200, (url, response.status_code)


# --------------------------------------------------------------------------- the pasted inspect


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Paste the output of the command above."),
        ("[{not json", "it is not valid JSON"),
        ("[]", "it lists 0 containers, not one"),
        ('[{"Id": "x", "Architecture": "amd64"}]', "it has no State"),
    ],
)
def test_a_bad_paste_is_refused_inline_keeping_the_text_and_storing_nothing(app, console, node, text, message):
    response = post_inspect(console, node["id"], text)
    html = unescape(response.get_data(as_text=True))
    assert response.status_code == 422
    assert html.lstrip().startswith("{#") is False and 'id="acceptance-inspect-form"' in html
    assert re.search(
        rf'<p class="mf-field-error" role="alert" data-testid="inspect-error">[^<]*{re.escape(message)}', html
    )
    assert textarea(html) == text  # nothing lost
    assert 'aria-invalid="true"' in html
    assert "HX-Trigger" not in response.headers  # the checklist has nothing new to show
    assert stored(app) == ([], 0)


def test_outside_htmx_a_refused_paste_comes_back_on_the_whole_page_with_its_text(app, console, node):
    response = post_inspect(console, node["id"], "[{not json", htmx=False)
    html = unescape(response.get_data(as_text=True))
    assert response.status_code == 422 and "<html" in html and "it is not valid JSON" in html
    assert textarea(html) == "[{not json"
    assert stored(app) == ([], 0)


def test_a_paste_over_the_limit_is_refused_with_the_limit(app, console, node):
    from app.acceptance.container import MAX_INSPECT_CHARS

    text = "x" * (MAX_INSPECT_CHARS + 1)
    response = post_inspect(console, node["id"], text)
    assert response.status_code == 413
    assert f"at most {MAX_INSPECT_CHARS} are accepted" in response.get_data(as_text=True)
    assert stored(app) == ([], 0)


def test_a_hardened_paste_is_observed_and_its_secret_env_value_is_never_kept_or_shown(app, console, node):
    response = post_inspect(console, node["id"], inspect_text())
    html = unescape(response.get_data(as_text=True))
    assert response.status_code == 200 and response.headers["HX-Trigger"] == "acceptance-changed"
    assert "Container status recorded: observed." in html
    assert textarea(html) == "" and ENV_SECRET not in html  # the form comes back empty
    page_html = page(console, node["id"])
    assert states(page_html)["container_status"] == "observed"
    checks = re.search(r'<ul class="mf-checks" data-testid="container-checks">.*?</ul>', page_html, re.S)[0]
    assert checks.count('data-status="pass"') == 8 and 'data-status="fail"' not in checks
    assert 'data-check="image" data-status="na"' in checks  # no release manifest at enrolment
    assert "All capabilities dropped" in checks and "HF_TOKEN" in page_html  # the name, never the value
    assert ENV_SECRET not in page_html
    with app.app_context():
        assert ENV_SECRET not in json.dumps([row.evidence for row in db.session.scalars(sa.select(AcceptanceEvidence))])
        assert ENV_SECRET not in json.dumps([event.details for event in db.session.scalars(sa.select(AuditEvent))])


def test_an_unhardened_paste_is_contradicted_with_each_failed_check_listed(console, node):
    assert post_inspect(console, node["id"], inspect_text(hardened=False)).status_code == 200
    html = page(console, node["id"])
    assert states(html)["container_status"] == "contradicted"
    checks = re.search(r'<ul class="mf-checks" data-testid="container-checks">.*?</ul>', html, re.S)[0]
    failed = re.findall(r'data-check="(\w+)" data-status="fail"', checks)
    assert failed == [
        "read_only_root",
        "capabilities_dropped",
        "no_new_privileges",
        "no_published_ports",
        "no_container_socket",
    ]
    assert "Contradicted: Node-agent container status." in verdict(html)


def test_a_paste_without_csrf_changes_nothing(app, console, node):
    response = console.post(
        f"/hardware/nodes/{node['id']}/acceptance/container-status", data={"inspect": inspect_text()}, headers=HTMX
    )
    assert response.status_code == 400 and "Form expired" in response.get_data(as_text=True)
    assert stored(app) == ([], 0)


# --------------------------------------------------------------------------- screenshots


def test_a_screenshot_is_stored_shown_as_a_thumbnail_and_served_as_its_type(app, console, node):
    image = png(8, 6)
    response = upload(console, node["id"], image)
    html = unescape(response.get_data(as_text=True))
    assert response.status_code == 201 and response.headers["HX-Trigger"] == "acceptance-changed"
    assert "Screenshot node-page.png stored (8 × 6 px" in html
    page_html = page(console, node["id"])
    assert states(page_html)["screenshots"] == "observed"
    src = re.search(
        r'<img src="(/hardware/nodes/[^"]+/acceptance/screenshots/\d+)" alt="Screenshot node-page.png"', page_html
    )
    assert src, page_html
    served = console.get(src[1])
    body = served.get_data()
    served.close()  # the file it streamed
    assert served.status_code == 200 and body == image
    assert served.headers["Content-Type"] == "image/png"
    assert served.headers["X-Content-Type-Options"] == "nosniff"
    assert served.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize(
    ("data", "filename", "status", "message"),
    [
        (b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", "evil.png", 422, "it is neither a PNG nor a JPEG"),
        (png()[:-12], "cut.png", 422, "the PNG has no end"),
        (
            b"\x89PNG\r\n\x1a\n" + b"\x00" * (MAX_SCREENSHOT_BYTES - 7),
            "huge.png",
            413,
            "larger than the limit of 5.0 MiB",
        ),
    ],
)
def test_a_bad_upload_is_refused_inline_and_stores_nothing(app, console, node, data, filename, status, message):
    response = upload(console, node["id"], data, filename)
    html = unescape(response.get_data(as_text=True))
    assert response.status_code == status
    assert 'id="acceptance-upload-form"' in html and "<html" not in html
    assert re.search(rf'data-testid="upload-error">[^<]*{re.escape(message)}', html), html
    assert "HX-Trigger" not in response.headers
    assert stored(app) == ([], 0)
    assert stored_files(app) == []


def test_a_20_mib_upload_is_refused_by_its_length_unread(app, console, node):
    response = upload(console, node["id"], b"\x89PNG\r\n\x1a\n" + b"\x00" * (20 * 2**20))
    assert response.status_code == 413
    assert "larger than the limit of 5.0 MiB; nothing was stored" in response.get_data(as_text=True)
    assert stored(app) == ([], 0)


def test_an_upload_without_a_file_says_to_choose_one(app, console, node):
    response = htmx_post(
        console, f"/hardware/nodes/{node['id']}/acceptance/screenshots", data={}, content_type="multipart/form-data"
    )
    assert response.status_code == 422 and "Choose a PNG or JPEG file." in response.get_data(as_text=True)
    assert stored(app) == ([], 0)


def test_an_upload_without_csrf_changes_nothing(app, console, node):
    boundary, body = encode_multipart({"screenshot": image_file(png(), "shot.png")})
    path = f"/hardware/nodes/{node['id']}/acceptance/screenshots"
    response = console.post(path, data=body, headers=HTMX, content_type=f"multipart/form-data; boundary={boundary}")
    assert response.status_code == 400 and "Form expired" in response.get_data(as_text=True)
    assert stored(app) == ([], 0)


class WatchedBody(io.BytesIO):
    """A request body that, each time the app reads it, notes whether the database is held by this request.

    A SQLite writer holds BEGIN IMMEDIATE and the writer queue's file lock until it commits, so a
    view touching the database before reading a slow 6 MiB body would stall every heartbeat.
    """

    def __init__(self, data: bytes, database_url: str) -> None:
        super().__init__(data)
        self.database_url, self.held = database_url, []

    def read(self, size: int | None = -1) -> bytes:
        self._look()
        return super().read(size)

    def readinto(self, buffer) -> int:
        self._look()
        return super().readinto(buffer)

    def _look(self) -> None:
        self.held.append(("session in a transaction", db.session().in_transaction()))
        path = sa.make_url(self.database_url).database
        if self.database_url.startswith("sqlite"):
            other = sqlite3.connect(path, timeout=0.05, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
                self.held.append(("SQLite write lock", False))
            except sqlite3.OperationalError:
                self.held.append(("SQLite write lock", True))
            finally:
                other.close()
            descriptor = os.open(f"{path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held.append(("writer queue", False))
            except BlockingIOError:
                self.held.append(("writer queue", True))
            finally:
                os.close(descriptor)


@pytest.mark.parametrize("route", ["screenshots", "container-status"])
def test_the_body_is_read_before_the_database_is_touched(app, console, node, database_url, route):
    """An upload's body (up to 6 MiB, however slow the client) is read with no write transaction held."""
    if route == "screenshots":
        fields = {"screenshot": image_file(png(), "shot.png"), "csrf_token": console.csrf}
    else:
        fields = {"inspect": inspect_text(), "csrf_token": console.csrf}
    boundary, body = encode_multipart(fields)
    watched = WatchedBody(body, database_url)
    response = console.post(
        f"/hardware/nodes/{node['id']}/acceptance/{route}",
        input_stream=watched,
        headers={**HTMX, "Content-Length": str(len(body))},
        content_type=f"multipart/form-data; boundary={boundary}",
    )
    assert response.status_code in (200, 201), response.get_data(as_text=True)[:500]
    assert watched.held and not [what for what, held in watched.held if held], watched.held


def test_outside_htmx_an_upload_goes_back_to_the_page_with_the_outcome(console, node):
    response = upload(console, node["id"], png(), htmx=False, csrf_token=console.csrf)
    assert response.status_code == 303 and response.headers["Location"].endswith(f"/{node['id']}/acceptance")
    assert "Screenshot node-page.png stored" in unescape(
        console.get(response.headers["Location"]).get_data(as_text=True)
    )


# --------------------------------------------------------------------------- the verdict and eligibility


def mark(console, node_id: str, value: str):
    return htmx_post(
        console, f"/hardware/nodes/{node_id}/acceptance/production-eligibility", data={"production_eligible": value}
    )


def test_eligibility_is_refused_until_validated_then_set_and_cleared(app, console, node):
    response = mark(console, node["id"], "true")
    html = unescape(response.get_data(as_text=True))
    assert response.status_code == 409 and 'role="alert"' in html
    assert "missing: gpu_facts, container_status, node_api_output, restart_identity, recovery" in html
    assert "HX-Trigger" not in response.headers and not eligible(app, node["id"])

    all_but_the_operators_items(app, console, node)
    assert post_inspect(console, node["id"], inspect_text()).status_code == 200
    html = page(console, node["id"])
    assert states(html) == {**dict.fromkeys(ITEM_NAMES, "observed"), "screenshots": "missing"}
    job_link = re.search(r'<a href="(/jobs/[0-9a-f-]{36})" data-testid="item-job">', html)
    assert job_link and console.get(job_link[1]).status_code == 200  # the smoke test's own page
    response = mark(console, node["id"], "true")
    assert response.status_code == 409 and "missing: screenshots" in response.get_data(as_text=True)

    assert upload(console, node["id"], png()).status_code == 201
    html = page(console, node["id"])
    assert states(html) == dict.fromkeys(ITEM_NAMES, "observed")
    assert 'data-testid="verdict" data-validated="true"' in html
    assert re.search(r'value="true" data-testid="mark-eligible"\s*>', html)  # enabled now
    listing = unescape(console.get("/hardware/nodes").get_data(as_text=True))
    assert "✓ validated" in re.search(rf'<tr data-node-id="{node["id"]}">.*?</tr>', listing, re.S)[0]

    response = mark(console, node["id"], "true")
    assert response.status_code == 200 and response.headers["HX-Trigger"] == "acceptance-changed"
    assert "Marked production-eligible." in response.get_data(as_text=True) and eligible(app, node["id"])
    assert 'data-testid="clear-eligible"' in page(console, node["id"])

    # A later contradiction un-validates the node and clears the flag (app.acceptance, audited).
    assert post_inspect(console, node["id"], inspect_text(hardened=False)).status_code == 200
    html = page(console, node["id"])
    assert 'data-validated="false"' in html and not eligible(app, node["id"])
    assert "Contradicted: Node-agent container status." in verdict(html)

    response = mark(console, node["id"], "false")
    assert response.status_code == 200 and "Production eligibility cleared." in response.get_data(as_text=True)


def test_an_eligibility_post_without_a_value_changes_nothing(app, console, node):
    response = mark(console, node["id"], "maybe")
    assert response.status_code == 400 and "nothing was changed" in response.get_data(as_text=True)
    assert not eligible(app, node["id"])


# --------------------------------------------------------------------------- export and access


def test_the_bundle_is_a_zip_whose_report_lists_every_item(console, node):
    assert upload(console, node["id"], png()).status_code == 201
    response = console.get(f"/hardware/nodes/{node['id']}/acceptance/bundle")
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/zip"
    assert response.headers["Cache-Control"] == "no-store"  # the operator's evidence, as the API serves it
    assert re.match(
        r"attachment; filename=modelforge-acceptance-[0-9a-f-]{36}-\d{8}T\d{6}Z\.zip",
        response.headers["Content-Disposition"],
    )
    bundle = zipfile.ZipFile(io.BytesIO(response.data))
    report = json.loads(bundle.read("report.json"))
    assert [item["name"] for item in report["checklist"]["items"]] == ITEM_NAMES
    assert report["checklist"]["validated"] is False
    assert [name for name in bundle.namelist() if name.startswith("screenshots/")] == [report["screenshots"][0]["file"]]
    assert bundle.read(report["screenshots"][0]["file"]) == png()
    assert "report.html" in bundle.namelist()
    assert_no_secrets(response.data.decode("latin-1") + bundle.read("report.json").decode(), node["credential"])


def test_screenshots_and_the_bundle_need_a_session(app, console, node):
    assert upload(console, node["id"], png()).status_code == 201
    with app.app_context():
        shot = db.session.scalar(sa.select(AcceptanceScreenshot.id))
    assert console.post("/logout", data={"csrf_token": console.csrf}).status_code == 302
    paths = [
        f"/hardware/nodes/{node['id']}/acceptance",
        f"/hardware/nodes/{node['id']}/acceptance/screenshots/{shot}",
        f"/hardware/nodes/{node['id']}/acceptance/bundle",
    ]
    for path in paths:
        response = console.get(path)
        assert response.status_code == 302 and response.headers["Location"].startswith("/login?next="), path
        assert b"PNG" not in response.data and b"PK" not in response.data[:2]
        htmx = console.get(path, headers=HTMX)
        assert htmx.status_code == 401 and htmx.headers["HX-Redirect"] == "/login"
    assert upload(console, node["id"], png(5, 5)).status_code == 401  # signed out: not even read
    assert stored(app)[1] == 1


def test_a_screenshot_of_another_node_or_a_malformed_id_is_not_found(app, console, node):
    assert upload(console, node["id"], png()).status_code == 201
    with app.app_context():
        shot = db.session.scalar(sa.select(AcceptanceScreenshot.id))
    other = factories.enrolled_node(console, hostname="other-node")["node_id"]
    assert console.get(f"/hardware/nodes/{other}/acceptance/screenshots/{shot}").status_code == 404
    for bad in ("abc", "1%00", "9" * 40, "-1"):
        assert console.get(f"/hardware/nodes/{node['id']}/acceptance/screenshots/{bad}").status_code == 404


def test_no_secret_reaches_the_acceptance_pages(console, node):
    publish(console, node, "a" * 32)
    assert post_inspect(console, node["id"], inspect_text()).status_code == 200
    text = page(console, node["id"])
    text += console.get(f"/hardware/nodes/{node['id']}").get_data(as_text=True)
    text += console.get(f"/api/v1/admin/nodes/{node['id']}/acceptance", headers=ADMIN).get_data(as_text=True)
    assert_no_secrets(text, node["credential"], node["token"], ENV_SECRET)
