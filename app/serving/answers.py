"""S4, S5: OpenAI's answers over the relay, for `/v1` (app/api/openai.py) and the console's
playground (app/console/deployments.py): the error body, and a checked request relayed to its
model's node and answered whole or as Server-Sent Events, with a comment line at least every
relay.KEEPALIVE_SECONDS while nothing else flows.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import time
from collections.abc import Callable, Iterator

from flask import Response, current_app, request

from app.db import db
from app.errors import DomainError
from app.metrics import inference
from app.serving import completions, deployments, relay, relay_notify
from app.web_errors import INTERNAL_ERROR, STATUS_BY_CODE

FIRST_EVENT_SECONDS = 2.0
CLIENT_CHECK_SECONDS = 0.25  # a whole answer's wait checks this often whether its client hung up
ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_error"}


def error_body(status: int, code: str, message: str, next_step: str, param: str | None = None) -> dict:
    """OpenAI's error body, `{"error": {"message", "type", "code", "param"}}`, plus `next_step`:
    an error reply's whole body, or one `data:` line of a stream that fails midway."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "code": code, "param": param, "next_step": next_step}}


def openai_error(status: int, code: str, message: str, next_step: str, param: str | None = None) -> Response:
    """An error reply in OpenAI's shape, with Retry-After where retrying later is the answer."""
    body = error_body(status, code, message, next_step, param)
    response = Response(json.dumps(body), status=status, mimetype="application/json")
    response.headers["Cache-Control"] = "no-store"
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if status in (429, 503):
        response.headers["Retry-After"] = "2"
    return response


def answer(completion: completions.Completion) -> Response:
    """Relay a checked request to its model's node and answer it, whole or as a stream (S4, S5);
    the console's playground answers through here too."""
    deployment = deployments.serving(completion.model)
    node_id, deployment_id = deployment.node_id, deployment.id
    db.session.commit()  # nothing held (on SQLite, no lock) while the model generates
    db.session.remove()
    relay_notify.start(db.engine, relay.HUB)  # on PostgreSQL, the node may be held elsewhere
    tracked = inference.Tracked(completion.model)  # S7
    try:
        stream = relay.HUB.open(node_id, deployment_id, completion.request)
    except DomainError as refusal:
        tracked.end(refusal.code)
        raise
    stream.tracked = tracked
    events = stream.iterate(relay.NODE_SILENCE_SECONDS)
    try:
        # A refusal (a bad parameter, a full queue) comes at once and is answered with its status; a
        # stream queued behind others starts its answer after FIRST_EVENT_SECONDS and waits in it.
        first = stream.next_event(FIRST_EVENT_SECONDS) if completion.stream else next(events)
        if first is not None and first.get("event") != "token":
            _raise_failure(stream, first)
    except BaseException:
        stream.close()
        raise
    replies = completions.Answer(completion)
    if not completion.stream:
        try:
            whole = _whole(replies, stream, first, events, _hang_up_check(request.environ))
        finally:
            stream.close()
        _note_served(deployment_id, tracked)
        return whole
    app = current_app._get_current_object()

    def served() -> None:  # after the stream's end, outside the request: in an app context of its own
        with app.app_context():
            _note_served(deployment_id, tracked)

    response = Response(_sse(replies, completion, first, events, stream, served), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"  # S5: the bundled nginx passes it on unbuffered
    return response


def _note_served(deployment_id: str, tracked: inference.Tracked) -> None:
    """S2: the deployment's own count and figures (its page and GET /api/v1/admin/deployments)."""
    deployments.note_served(
        deployment_id,
        deployments.Served(tracked.generated_tokens, tracked.time_to_first_token_seconds, tracked.tokens_per_second),
    )


def _raise_failure(stream: relay.Stream, event: dict) -> None:
    """A stream's end other than `finished`: the relay dropped, or the generation failed."""
    if event.get("event") == relay.RELAY_LOST:
        refusal = relay.node_unavailable(str(event.get("message")))
    else:
        refusal = completions.failure(event)
    if stream.tracked is not None:
        stream.tracked.end(refusal.code)
    raise refusal


def _hang_up_check(environ: dict) -> Callable[[], bool]:
    """Whether the client of a whole answer hung up: its connection reads as closed (checked at
    most every CLIENT_CHECK_SECONDS). Only a plain TCP connection can tell, as nginx's to gunicorn
    is; gunicorn's own TLS, or no socket at all (Flask's test client), never says so."""
    connection = environ.get("gunicorn.socket")
    if not isinstance(connection, socket.socket) or isinstance(connection, ssl.SSLSocket):
        return lambda: False
    checked = time.monotonic()

    def gone() -> bool:
        nonlocal checked
        if time.monotonic() - checked < CLIENT_CHECK_SECONDS:
            return False
        checked = time.monotonic()
        try:
            readable, _, _ = select.select([connection], [], [], 0)
            return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    return gone


def _whole(
    answer: completions.Answer,
    stream: relay.Stream,
    first: dict | None,
    events: Iterator[dict | None],
    hung_up: Callable[[], bool],
) -> Response:
    """The answer as one JSON body once the node has finished. A client that hangs up meanwhile
    cancels the generation on the node, as a stream's does (S5)."""
    pieces: list[str] = []
    event = first
    while True:
        if hung_up():
            stream.close()  # cancels it on the node; the reply below reaches nobody
            return Response(status=499)
        if event is not None:
            if event.get("event") == "token":
                pieces.append(str(event.get("text", "")))
            elif event.get("event") == "finished":
                reply = answer.whole("".join(pieces), event)
                response = Response(json.dumps(reply), mimetype="application/json")
                response.headers["Cache-Control"] = "no-store"
                return response
            else:
                _raise_failure(stream, event)
        event = next(events)


def _data(payload: object) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _sse(answer, completion, first, events, stream, served) -> Iterator[bytes]:
    """The stream as it is generated. A client that hangs up makes the next write fail; gunicorn
    then closes this generator and `stream.close()` cancels the generation on the node (S5)."""
    try:
        opening = answer.opening()
        if opening is not None:
            yield _data(opening)
        event = first
        while True:
            if event is None:
                yield b": keep-alive\n\n"
            elif event.get("event") == "token":
                yield _data(answer.piece(str(event.get("text", ""))))
            elif event.get("event") == "finished":
                yield _data(answer.closing(event))
                if completion.include_usage:
                    yield _data(answer.usage(event))
                yield b"data: [DONE]\n\n"
                served()
                return
            else:
                try:
                    _raise_failure(stream, event)
                except DomainError as error:
                    status = STATUS_BY_CODE.get(error.code, 400)
                    yield _data(error_body(status, error.code, error.message, error.next_step))
                return
            event = next(events)
    except GeneratorExit:
        raise
    except Exception:  # never a half-written stream with no word: say so in the stream's own shape
        message, next_step = INTERNAL_ERROR
        yield _data(error_body(500, "INTERNAL_ERROR", message, next_step))
    finally:
        stream.close()
