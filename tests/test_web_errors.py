"""Errors in one place (P5): the API's JSON shape on API paths, the console's error page elsewhere."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from app import create_app
from app.extensions import db
from tests.support import ADMIN, app_env

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
