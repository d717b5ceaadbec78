"""S4: the OpenAI-compatible API at `/v1`, for client keys (S1), relayed to the serving node (S5).

`GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`; the answers, streamed or
whole, are app/serving/answers.py's. Errors come in OpenAI's shape, with our `next_step` beside
its fields, so the official client raises the right exception.
"""

from __future__ import annotations

import json

from flask import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from app.api.errors import ApiError
from app.db import db
from app.errors import DomainError
from app.extensions import csrf
from app.models.deployment import DeploymentState
from app.serving import api_keys, completions, deployments
from app.serving.answers import answer, openai_error
from app.web_errors import STATUS_BY_CODE

v1 = Blueprint("openai", __name__, url_prefix="/v1")


@v1.errorhandler(DomainError)
def _on_domain_error(error: DomainError):
    db.session.rollback()
    status = STATUS_BY_CODE.get(error.code, 400)
    return openai_error(status, error.code, error.message, error.next_step, error.extra.get("param"))


@v1.errorhandler(ApiError)
def _on_api_error(error: ApiError):
    db.session.rollback()
    return openai_error(error.status, error.code, error.message, error.next_step, error.extra.get("field"))


@v1.errorhandler(HTTPException)
def _on_http_error(error: HTTPException):
    status = error.code or 500
    return openai_error(
        status, error.name.upper().replace(" ", "_"), error.description or error.name, "See the message."
    )


def _client() -> api_keys.Client:
    """S1: the client key, first thing (api_keys.authenticate writes its last use outside any transaction)."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise api_keys.invalid("is missing: send `Authorization: Bearer mfk_…`")
    return api_keys.authenticate(secret.strip())


@v1.get("/models")
def models():
    """The deployments clients can name as `model`: every one not stopped, by name."""
    _client()
    listed = [
        {"id": each.name, "object": "model", "created": int(each.created_at.timestamp()), "owned_by": "modelforge"}
        for each in deployments.list_all()
        if each.state not in (DeploymentState.STOPPING, DeploymentState.STOPPED)
    ]
    response = Response(json.dumps({"object": "list", "data": listed}), mimetype="application/json")
    response.headers["Cache-Control"] = "no-store"
    return response


@v1.post("/chat/completions")
def chat_completions():
    return _complete(completions.CHAT)


@v1.post("/completions")
def text_completions():
    return _complete(completions.COMPLETION)


def _complete(kind: str):
    _client()
    body = request.get_json(silent=True)
    if body is None:
        raise completions.invalid("body", "must be JSON with Content-Type: application/json")
    return answer(completions.parse(kind, body))


def init_app(app) -> None:
    csrf.exempt(v1)  # keys travel in a header, never a cookie
    app.register_blueprint(v1)
