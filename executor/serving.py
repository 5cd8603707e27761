"""A small HTTP/1.0 server for the health and metrics ports: one thread, bounded, slow clients cut.

``http.server``'s threading server starts a thread per connection and waits on a client for ever:
a thousand half-sent requests held 590 threads of an executor, whose own work then could not
start one (issue 17). This one serves every connection from a single thread with ``selectors``:

- a connection has :data:`CLIENT_TIMEOUT_S` from its accept to send its request and read the
  answer, whatever it trickles; then it is closed;
- at most :data:`MAX_CONNECTIONS` are open at once; one more closes the oldest (a real client
  is answered within milliseconds, so the oldest is the one holding a slot for nothing);
- a request head over :data:`MAX_HEAD_BYTES` gets 431; anything but ``GET``/``HEAD`` gets 405;
  the answer closes the connection (no keep-alive; Prometheus and probes expect nothing more).

The answer comes from ``route(path) -> (status, content type, body)``, called on the server's
thread; it must be quick (the health verdict is cached, the metrics a registry scrape).
:meth:`statistics` says what the server had to refuse, for the health check's ``serving`` check.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("executor.serving")

CLIENT_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 8192
SHED_RECENT_S = 10.0  # connections shed this recently make the ``serving`` check fail
REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Request Header Fields Too Large"}
Route = Callable[[str], tuple[int, str, bytes]]


@dataclass(frozen=True)
class ServingStatistics:
    open: int  # connections open now
    max_connections: int
    served: int  # answers sent since start
    timed_out: int  # connections closed for taking longer than the client timeout
    shed: int  # connections closed to make room for a new one
    last_shed_s: float | None  # seconds since the latest shed, None if never


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytes = b""
    sent: int = 0
    answering: bool = False


class SmallServer:
    """Serve ``route`` on ``(host, port)`` from one daemon thread; :meth:`close` stops it."""

    def __init__(self, host: str, port: int, route: Route, *, name: str) -> None:
        self.route = route
        self.name = name
        self._listener = socket.create_server((host, port), reuse_port=False, backlog=128)
        self._listener.setblocking(False)
        self.address = self._listener.getsockname()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}  # in accept order: the first is the oldest
        self._stop = False
        self._served = self._timed_out = self._shed = 0
        self._last_shed = 0.0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def statistics(self) -> ServingStatistics:
        last = time.monotonic() - self._last_shed if self._last_shed else None
        return ServingStatistics(
            len(self._conns), MAX_CONNECTIONS, self._served, self._timed_out, self._shed, last
        )

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        for conn in list(self._conns.values()):
            self._drop(conn)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()

    # -- the loop --------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop:
            try:
                self._turn()
            except Exception:  # a bug here must not leave the port accepting into a dead loop
                log.exception("%s: serving failed; dropping every connection and going on", self.name)
                for conn in list(self._conns.values()):
                    self._drop(conn)
                time.sleep(0.1)

    def _turn(self) -> None:
        """One select: accept, read, answer, then cut the clients past their deadline."""
        now = time.monotonic()
        timeout = min((c.deadline for c in self._conns.values()), default=now + 1.0) - now
        for key, events in self._selector.select(timeout=max(0.0, min(timeout, 1.0))):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                self._ready(key.data, events)
        self._expire(time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):  # at most this many a turn, so the open ones are served too
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: shed one, try next turn
                log.warning("%s: cannot accept: %s", self.name, exc)
                self._shed_oldest()
                return
            if len(self._conns) >= MAX_CONNECTIONS:
                self._shed_oldest()
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + CLIENT_TIMEOUT_S)
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _shed_oldest(self) -> None:
        if self._conns:
            self._drop(next(iter(self._conns.values())))
            self._shed += 1
            self._last_shed = time.monotonic()

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._drop(conn)
            self._timed_out += 1

    def _drop(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0 and self._conns.get(fd) is conn:
            del self._conns[fd]
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()

    def _ready(self, conn: _Conn, events: int) -> None:
        try:
            if conn.answering:
                self._send(conn)
            else:
                self._receive(conn)
        except OSError:  # the client went away
            self._drop(conn)

    def _receive(self, conn: _Conn) -> None:
        data = conn.sock.recv(4096)
        if not data:
            self._drop(conn)
            return
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbox.find(b"\n\n")
        if end < 0:
            if len(conn.inbox) > MAX_HEAD_BYTES:
                self._answer(conn, 431, "text/plain", b"request head too large\n", head_only=False)
            return
        self._answer(conn, *self._respond(bytes(conn.inbox[:end])))

    def _respond(self, head: bytes) -> tuple[int, str, bytes, bool]:
        words = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
        method = words[0] if words else b""
        target = words[1].decode("latin-1") if len(words) > 1 else "/"
        if method not in (b"GET", b"HEAD"):
            return 405, "text/plain", b"GET only\n", False
        try:
            status, content_type, body = self.route(target.split("?", 1)[0])
        except Exception:  # a bug in a route must not stop the port
            log.exception("%s: the answer to %s failed", self.name, target[:100])
            status, content_type, body = 500, "text/plain", b"internal error\n"
        return status, content_type, body, method == b"HEAD"

    def _answer(self, conn: _Conn, status: int, content_type: str, body: bytes, head_only: bool) -> None:
        head = (
            f"HTTP/1.0 {status} {REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode("latin-1")
        conn.outbox, conn.answering = head + (b"" if head_only else body), True
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._send(conn)

    def _send(self, conn: _Conn) -> None:
        try:
            conn.sent += conn.sock.send(conn.outbox[conn.sent :])
        except BlockingIOError:
            return
        if conn.sent >= len(conn.outbox):
            self._served += 1
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._drop(conn)
