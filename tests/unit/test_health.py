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


def test_healthz_says_so_when_postgresql_takes_no_writes(postgres_database, tmp_path):
    """Write health (issue 22): SELECT 1 succeeds on a read-only server, a heartbeat would not."""
    import sqlalchemy as sa

    name = sa.make_url(postgres_database).database
    admin = sa.create_engine(postgres_database, isolation_level="AUTOCOMMIT")
    application = create_app(app_env(postgres_database, tmp_path))
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        response = application.test_client().get("/healthz")
        assert response.status_code == 503
        error = response.get_json()["error"]
        assert error["code"] == "DATABASE_NOT_WRITABLE" and "read-only" in error["message"]
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        admin.dispose()
        with application.app_context():
            db.engine.dispose()


def test_a_schema_that_is_not_the_codes_head_is_refused_clearly_until_upgraded(database_url, tmp_path, caplog):
    """Upgrade safety (issue 22): a database behind the code answered agents with a misleading 503 or
    a 500; now every request says why, /healthz included, and the server serves once upgraded."""
    from flask_migrate import downgrade, upgrade

    from app.db import head_revision
    from tests.support import factories, wait_until

    application = create_app(app_env(database_url, tmp_path))
    client = application.test_client()
    with application.app_context():
        downgrade(revision="0010_unvalidated_not_eligible")
    try:
        response = client.get("/healthz")
        assert response.status_code == 503
        error = response.get_json()["error"]
        assert error["code"] == "SCHEMA_OUT_OF_DATE"
        assert "0010_unvalidated_not_eligible" in error["message"] and head_revision() in error["message"]
        assert "flask --app wsgi db upgrade" in error["next_step"]
        beat = client.post(
            "/api/v1/agent/heartbeat", json=factories.heartbeat_body([]), headers=factories.bearer("mfn_" + "x" * 43)
        )
        assert (beat.status_code, beat.get_json()["error"]["code"]) == (503, "SCHEMA_OUT_OF_DATE")
        assert client.get("/login").status_code == 503  # the console's pages too
        logged = [record.getMessage() for record in caplog.records if record.name == "modelforge.db"]
        assert len(logged) == 1 and "flask --app wsgi db upgrade" in logged[0] and head_revision() in logged[0]
    finally:
        with application.app_context():
            upgrade()
    wait_until(lambda: client.get("/healthz").status_code == 200, "/healthz 200 once upgraded", timeout=10)
    with application.app_context():
        db.engine.dispose()
