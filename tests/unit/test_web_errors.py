"""Errors in one place (P5): the API's JSON shape on API paths, the console's error page elsewhere."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from app import create_app
from app.extensions import db
from tests.support import ADMIN, PROJECT_ROOT, app_env

UNREACHABLE_DATABASE = "postgresql+psycopg://nobody@127.0.0.1:1/none"
DATABASE_UNAVAILABLE = {
    "error": {
        "code": "DATABASE_UNAVAILABLE",
        "message": "The database is busy or unreachable; nothing was changed.",
        "next_step": "Retry shortly; if it persists, check the database server and MODELFORGE_DATABASE_URL.",
    }
}
INTERNAL_ERROR = {
    "error": {
        "code": "INTERNAL_ERROR",
        "message": "The control plane hit an unexpected error.",
        "next_step": "Check the server log.",
    }
}


@pytest.mark.parametrize(
    ("failure", "status", "body"),
    [
        (OperationalError("SELECT 1", None, sqlite3.OperationalError("locked")), 503, DATABASE_UNAVAILABLE),
        (RuntimeError("detail for the log only"), 500, INTERNAL_ERROR),
    ],
    ids=["database-unavailable", "unexpected"],
)
def test_a_failing_api_call_keeps_the_one_json_error_shape(client, monkeypatch, failure, status, body):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr("app.nodes.describe", fail)
    response = client.get("/api/v1/hardware/nodes", headers=ADMIN)
    assert response.status_code == status
    assert response.get_json() == body
    assert response.headers.get("Retry-After") == ("2" if status == 503 else None)
    assert response.headers["Cache-Control"] == "no-store"
    assert "Content-Security-Policy" not in response.headers  # not dressed as a console page


def test_the_console_is_an_html_503_when_the_database_is_unreachable(tmp_path):
    application = create_app(app_env(UNREACHABLE_DATABASE, tmp_path))
    client = application.test_client()
    page = client.get("/login")  # its read-only transaction is the first thing to need the database
    fragment = client.get("/login", headers={"HX-Request": "true"})
    for response in (page, fragment):
        assert response.status_code == 503 and response.mimetype == "text/html"
        assert response.headers["Retry-After"] == "2"
        assert "Database unavailable" in response.get_data(as_text=True)
    assert "<html" in page.get_data(as_text=True)
    assert "<html" not in fragment.get_data(as_text=True)
    assert client.get("/healthz").get_json() == DATABASE_UNAVAILABLE
    with application.app_context():
        db.engine.dispose()


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module `path` imports, at the top or inside a function, as absolute dotted names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from . import x`, `from ..y import z`
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from app import console`
    return found


@pytest.mark.parametrize(("package", "other"), [("app.api", "app.console"), ("app.console", "app.api")])
def test_the_api_and_the_console_import_nothing_from_each_other(package, other):
    directory = PROJECT_ROOT.joinpath(*package.split("."))
    modules = sorted(directory.rglob("*.py"))
    assert modules
    crossing = {
        str(path.relative_to(PROJECT_ROOT)): sorted(
            name for name in imported_modules(path, package) if name == other or name.startswith(other + ".")
        )
        for path in modules
    }
    assert {path: names for path, names in crossing.items() if names} == {}


def test_the_import_scan_sees_imports_inside_functions():
    assert "app.api.openapi" in imported_modules(PROJECT_ROOT / "app" / "api" / "__init__.py", "app.api")


MISSING = "0b9cbbd8-0000-4000-8000-000000000000"


@pytest.mark.parametrize(
    ("path", "status", "title", "words"),
    [
        (f"/hardware/nodes/{MISSING}", 404, "Not found", f"No node has id &#39;{MISSING}&#39;."),
        (f"/jobs/{MISSING}", 404, "Not found", "JOB_NOT_FOUND"),
        ("/hardware/no-such-page", 404, "Not found", "There is no console page at this address."),
        (f"/settings/api-keys/{MISSING}/revoke", 405, "Not allowed here", "does not take that kind of request"),
    ],
    ids=["node", "job", "no-route", "wrong-method"],
)
def test_a_console_error_is_the_styled_page_in_words_and_the_api_keeps_json(console, path, status, title, words):
    page = console.get(path)
    html = page.get_data(as_text=True)
    assert page.status_code == status and page.mimetype == "text/html"
    assert f"<h2>{title}</h2>" in html and words in html
    assert 'class="mf-error"' in html and 'id="main"' in html  # the console's own page, with its header
    assert "The requested URL was not found on the server" not in html  # not Werkzeug's words
    fragment = console.get(path, headers={"HX-Request": "true"})
    assert fragment.status_code == status and "<html" not in fragment.get_data(as_text=True)
    assert title in fragment.get_data(as_text=True)
    api = console.get("/api/v1" + path)
    assert api.status_code in (401, 404, 405) and api.get_json()["error"]["code"]


def test_a_refusals_code_is_still_on_the_page_under_its_words(console):
    html = console.get(f"/hardware/nodes/{MISSING}").get_data(as_text=True)
    assert "Error code: <code>NODE_NOT_FOUND</code>" in html
    assert "<title>Not found · ModelForge</title>" in html
