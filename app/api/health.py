"""GET /healthz: the process is up, its database answers, and it can take a write."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Blueprint, jsonify

from app.api import operations, replies
from app.db import begin_read_only, write_problem
from app.errors import DomainError
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
    """200 once a trivial query succeeds and a write could (app.db.WriteProbe, cached a few
    seconds); a database error becomes a 503 JSON error, and so does a database that cannot write."""
    begin_read_only()
    db.session.execute(sa.text("SELECT 1"))
    db.session.rollback()
    problem = write_problem()
    if problem is not None:
        raise DomainError(
            "DATABASE_NOT_WRITABLE",
            problem,
            "Free space on the database's disk (or make it writable); the control plane recovers by itself.",
        )
    return jsonify(status="ok")
