"""S5: the agent's relay connection, `GET /api/v1/agent/relay` upgraded to a WebSocket.

The node credential is checked before the upgrade, so a refusal is an ordinary JSON 401/403. The
connection then holds one thread of this process for as long as it lasts (app/gunicorn_conf.py);
frames and their meaning are app/serving/relay.py's.
"""

from __future__ import annotations

from flask import Response, current_app, request
from simple_websocket import ConnectionClosed, Server

from app.api import bp
from app.api.auth import bearer_credential
from app.db import db
from app.nodes import publishing
from app.serving import relay, relay_notify


class _HandedOver(Response):
    """What gunicorn gets back once the WebSocket has closed: the socket was the view's, so there
    is no response left to write (simple_websocket's documented way out of a gunicorn request)."""

    def __call__(self, environ, start_response):
        if environ.get("gunicorn.socket") is not None:
            raise StopIteration
        return super().__call__(environ, start_response)


@bp.route("/agent/relay", websocket=True)
def agent_relay():
    """Authenticate the node, then relay frames until either end closes (S5)."""
    node_id = publishing.authenticate(bearer_credential(), first_use=False).node_id
    db.session.commit()  # no transaction (and on SQLite no lock) held for the connection's life
    db.session.remove()
    relay_notify.start(db.engine, relay.HUB)  # on PostgreSQL, the other processes learn who holds it
    socket = Server(request.environ, ping_interval=relay.PING_SECONDS, max_message_size=relay.FRAME_MAX_BYTES)
    connection = relay.HUB.attach(node_id, socket)
    current_app.logger.info("relay: node %s connected", node_id)
    why = "the agent closed its relay connection"
    try:
        while True:
            frame = socket.receive()
            if frame is None:
                continue
            relay.HUB.deliver(connection, frame)
    except ConnectionClosed:
        pass
    except Exception:  # never let one connection's failure escape into gunicorn's worker
        current_app.logger.exception("relay: node %s's connection failed", node_id)
        why = "the relay connection failed"
    finally:
        relay.HUB.detach(connection, why)
        try:
            socket.close()
        except Exception:  # already closed
            pass
        current_app.logger.info("relay: node %s disconnected", node_id)
    return _HandedOver()
