"""GET /healthz: the process is up and can reach its database."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Blueprint, jsonify

from app.api import operations, replies
from app.db import begin_read_only
from app.extensions import db

bp = Blueprint("health", __name__)


@operations.route(
    bp,
    "GET",
    "/healthz",
    "Liveness of the control plane and its database",
    replies={200: (replies.Healthy, "Healthy")},
)
def healthz():
    """200 once a trivial query succeeds; a database error becomes a 503 JSON error."""
    begin_read_only()
    db.session.execute(sa.text("SELECT 1"))
    db.session.rollback()
    return jsonify(status="ok")
