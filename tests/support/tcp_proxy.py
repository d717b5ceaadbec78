"""A TCP proxy on loopback that can black-hole what it forwards: a database that stops answering."""

from __future__ import annotations

import socket
import threading


class BlackHoleProxy:
    """Forwards loopback TCP to `upstream_port` until `black_hole()`; from then on it still
    accepts connections and reads what clients send, but forwards nothing either way, as a
    network that drops packets while the client's kernel believes the peer alive.

    `restore()` forwards again: connections opened during the hole connect upstream then, and
    the bytes held on the connections of before are delivered late (a partition that healed).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def black_hole(self) -> None:
        self.flowing.clear()

    def restore(self) -> None:
        self.flowing.set()

    def close(self) -> None:
        self.closed.set()
        self.flowing.set()
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                sock.close()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self.lock:
            self.sockets.append(sock)
        return sock

    def _wait_flowing(self) -> bool:
        while not self.flowing.wait(0.1):
            if self.closed.is_set():
                return False
        return not self.closed.is_set()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(self._track(client),), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        if not self._wait_flowing():
            return
        try:
            upstream = self._track(socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10))
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        self._pump(upstream, client)

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or not self._wait_flowing():
                    break
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
