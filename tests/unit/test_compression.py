"""C5: static assets and the API's JSON go out compressed; a console page (its CSRF token beside
echoed text: BREACH) and an event stream (read piece by piece as it comes) never do."""

from __future__ import annotations

import gzip
import json

from flask import Response

from app import create_app
from app.extensions import db
from tests.support import app_env

GZIP = {"Accept-Encoding": "gzip"}


def test_static_assets_and_api_json_come_back_gzip(client):
    for path in ("/static/console.css", "/static/console.js", "/static/vendor/htmx-2.0.11/htmx.min.js"):
        with client.get(path, headers=GZIP) as response, client.get(path) as plain:
            assert response.status_code == 200 and plain.status_code == 200, path
            assert response.headers["Content-Encoding"] == "gzip", path
            assert "Accept-Encoding" in response.headers["Vary"], path
            assert gzip.decompress(response.get_data()) == plain.get_data(), path
            assert int(response.headers["Content-Length"]) < len(plain.get_data()) / 2, path
    with client.get("/static/console.css", headers=GZIP) as first:
        etag = first.headers["ETag"]
    with client.get("/static/console.css", headers={**GZIP, "If-None-Match": etag}) as again:
        assert again.status_code == 304  # a browser's cached copy still revalidates
    # The OpenAPI document is JSON well over the 500 bytes below which compressing is not worth it.
    openapi = client.get("/api/v1/openapi.json", headers=GZIP)
    assert openapi.headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(openapi.get_data()))["openapi"]


def test_without_accept_encoding_nothing_is_compressed(client):
    with client.get("/static/console.css") as response:
        assert "Content-Encoding" not in response.headers
        assert b".mf-main" in response.get_data()


def test_a_console_page_is_never_compressed(console):
    for path in ("/hardware/nodes", "/login", "/settings"):
        response = console.get(path, headers=GZIP)
        assert response.mimetype == "text/html", path
        assert "Content-Encoding" not in response.headers, path
        assert b"csrf_token" in response.get_data() or path == "/login", path


def test_an_event_stream_is_never_compressed(database_url, tmp_path):
    # The OpenAI answers and the playground stream text/event-stream (app/serving/answers.py); this
    # route sends one the same way, to show the app's policy, whatever sends it.
    application = create_app(app_env(database_url, tmp_path))

    def events():
        return Response((f"data: {'x' * 400} {n}\n\n" for n in range(5)), mimetype="text/event-stream")

    application.add_url_rule("/api/v1/test-events", "test_events", events)
    try:
        response = application.test_client().get("/api/v1/test-events", headers=GZIP)
        assert response.mimetype == "text/event-stream" and response.is_streamed
        assert "Content-Encoding" not in response.headers
        assert response.get_data().startswith(b"data: xxx")
    finally:  # this app's own engine: its pooled connection is closed, not left to the collector
        with application.app_context():
            db.session.remove()
            db.engine.dispose()
