"""A TCP proxy between one gate and PostgreSQL that a test cuts and restores: the gate's
``storage.url`` names the proxy's port; ``cut()`` resets every connection through it and
refuses new ones (the gate is cut off from the database while the other gates keep it);
``restore()`` takes connections again on the same port. ``hold()`` keeps every connection
open but passes nothing on until ``release()`` (the database stops answering without any
connection breaking, as behind a stalled network). Threads, one pair per connection, bytes
passed through unchanged.
"""

from __future__ import annotations

import socket
import struct
import threading
from urllib.parse import urlsplit, urlunsplit

from tests.pg_server import free_port

ACCEPT_POLL_S = 0.1  # how soon a cut listener stops accepting
CONNECT_TIMEOUT_S = 5.0


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0), waking a thread blocked on it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class CutProxy:
    """127.0.0.1:``port`` forwarded to ``target`` (host, port); see the module docstring.
    ``cuts`` counts the cuts, ``reset`` the connections they reset."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.cuts = 0
        self.reset = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listening: threading.Event | None = None
        self._flowing = threading.Event()
        self._flowing.set()

    def url(self, url: str) -> str:
        """``url`` (a libpq URL of the target) with the proxy's host and port instead."""
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def start(self) -> CutProxy:
        """Take connections (again); returns when the port listens."""
        with self._lock:
            assert self._listening is None, "the proxy is listening already"
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            listener.settimeout(ACCEPT_POLL_S)
            self._listening = threading.Event()
            self._listening.set()
        threading.Thread(
            target=self._accept, args=(listener, self._listening), daemon=True, name="cut-proxy"
        ).start()
        return self

    restore = start

    def cut(self) -> None:
        """Refuse new connections (the port closes) and reset every open one."""
        with self._lock:
            if self._listening is not None:
                self._listening.clear()
                self._listening = None
            victims, self._open = self._open, set()
            self.cuts += 1
            self.reset += len(victims) // 2
        for sock in victims:
            _reset(sock)

    stop = cut

    def hold(self) -> None:
        """Pass nothing on (either way) until ``release()``; connections stay open."""
        self._flowing.clear()

    def release(self) -> None:
        """Pass on again what was held, and what comes."""
        self._flowing.set()

    def _accept(self, listener: socket.socket, listening: threading.Event) -> None:
        with listener:
            while listening.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                try:
                    upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
                except OSError:  # PostgreSQL is down: the gate sees the connection close
                    _reset(client)
                    continue
                client.settimeout(None)
                upstream.settimeout(None)
                with self._lock:
                    if not listening.is_set():  # cut meanwhile
                        _reset(client)
                        _reset(upstream)
                        continue
                    self._open |= {client, upstream}
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            gone = src in self._open
            self._open -= {src, dst}
        if gone:  # ended from one side, not by a cut: end the other side too
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
