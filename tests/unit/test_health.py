"""GET /healthz answers 200 only when the database answers (spec "Wire format")."""

from __future__ import annotations

from app import create_app
from app.extensions import db
from tests.support import app_env


def test_healthz_is_ok_when_the_database_answers(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_healthz_is_a_503_json_error_when_the_database_is_unreachable(tmp_path):
    application = create_app(app_env("postgresql+psycopg://nobody@127.0.0.1:1/none", tmp_path))
    response = application.test_client().get("/healthz")
    assert response.status_code == 503
    error = response.get_json()["error"]
    assert error["code"] == "DATABASE_UNAVAILABLE" and "MODELFORGE_DATABASE_URL" in error["next_step"]
    assert response.headers["Retry-After"] == "2"
    with application.app_context():
        db.engine.dispose()
