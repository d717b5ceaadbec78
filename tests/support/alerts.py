"""An alert receiver: a JSON webhook on loopback that records what it is sent (O2)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import free_port

HOOK_SECRET = "hook-password-Zq8v3LmT"


class Receiver:
    """A webhook receiver on loopback that apprise's `json://` posts to; it can go down and come back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.notifications: list[dict] = []
        self.authorizations: list[str] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def url(self, secret: str = HOOK_SECRET, path: str = "hooks/modelforge") -> str:
        """The apprise URL of this receiver; the basic-auth password is the target's secret."""
        return f"json://alerts:{secret}@127.0.0.1:{self.port}/{path}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with receiver.lock:
                    receiver.notifications.append({"path": self.path, **body})
                    receiver.authorizations.append(self.headers.get("Authorization", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Down: the port refuses connections until `start` again."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def titles(self) -> list[str]:
        with self.lock:
            return [notification["title"] for notification in self.notifications]

    def payloads(self) -> str:
        with self.lock:
            return json.dumps(self.notifications)
