"""A TCP proxy in front of Redis or Postgres that a test can make hang (connections accepted and kept
open, nothing forwarded: a server that stopped answering) or refuse (connections closed: a server down)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit, urlunsplit

FORWARD, HANG, REFUSE, CLOSED = "forward", "hang", "refuse", "closed"


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target`, one thread per direction of each connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.mode = FORWARD
        self.changed = threading.Condition()
        self.sockets: list[socket.socket] = []
        self.refused = 0  # connections closed at once while refusing
        self.held = 0  # chunks held back while hanging
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        """`url` (redis://..., postgresql+psycopg://user:pw@host:port/db) with its host and port this proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def set(self, mode: str) -> None:
        """FORWARD, HANG, REFUSE (open connections are cut too) or CLOSED (for good)."""
        with self.changed:
            self.mode = mode
            self.changed.notify_all()
            if mode in (REFUSE, CLOSED):
                for sock in self.sockets:
                    _close(sock)
                self.sockets.clear()
        if mode == CLOSED:
            _close(self.listener)

    def _accept(self) -> None:
        while self.mode != CLOSED:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.mode == REFUSE:
                self.refused += 1
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self.changed:
                self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self.changed:
                    if self.mode == HANG:
                        self.held += 1
                    self.changed.wait_for(lambda: self.mode != HANG)
                    if self.mode != FORWARD:
                        break
                dst.sendall(data)
        except OSError:
            pass
        _close(src)
        _close(dst)


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@contextmanager
def proxy_to(url: str) -> Iterator[TcpProxy]:
    """A proxy to the server `url` names, closed (every connection through it cut) at the end."""
    parts = urlsplit(url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 0))
    try:
        yield proxy
    finally:
        proxy.set(CLOSED)
