"""Server-sent events of one task or document: ``state`` first, ``progress`` on each change, ``end``.

The stream registers with the :class:`~ingest.api.hub.Hub` before it reads the row, so no
change is missed; it reads the row again on each wake-up and sends a ``progress`` event when the
status, progress or message changed; when the task (or every task of the document's current
generation) is terminal it sends ``end`` and closes. A comment line every ``KEEPALIVE_S`` keeps
proxies from closing a quiet stream; a client that goes away ends the watch at once.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import trio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from db.database import RETRYABLE_DB_ERRORS
from ingest.api.hub import Hub, Watcher
from ingest.api.runtime import Runtime
from ingest.errors import NotFound
from ingest.status import describe, end_status, fingerprint, is_terminal, slim

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
RETRY_MS = 2000


# an endless body: no Content-Length, nothing cached, no proxy buffering
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def sse(event: str, data: Any) -> bytes:
    """One event in the ``text/event-stream`` format (the JSON holds no newline)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class EventStream(Response):
    """The watch itself, as an ASGI response; it owns its hub registration (``watching``)."""

    media_type = "text/event-stream"

    def __init__(
        self, runtime: Runtime, watching: Any, watcher: Watcher, first: dict[str, Any], tenant_id: str
    ) -> None:
        # not Response.__init__: it would add a Content-Length of 0 to an endless body
        self.status_code, self.background = 200, None
        self.raw_headers = list(SSE_HEADERS)
        self.runtime, self.watching, self.watcher = runtime, watching, watcher
        self.first, self.tenant_id = first, tenant_id
        self.id_ = first["task"]["id"] if first["kind"] == "task" else first["document"]["id"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_disconnect, receive, nursery.cancel_scope)
                await self._stream(send)
                nursery.cancel_scope.cancel()
        except OSError:
            pass  # the client went away mid-send
        finally:
            self.watching.__exit__(None, None, None)

    async def _stream(self, send: Send) -> None:
        async def emit(chunk: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

        await emit(f"retry: {RETRY_MS}\n\n".encode() + sse("state", slim(self.first)))
        state, last = self.first, fingerprint(self.first)
        while not is_terminal(state):
            if not await self._woken():
                await emit(b": keep-alive\n\n")
                continue
            read = await self._read()
            if read is None:
                await emit(sse("end", {"id": self.id_, "status": "removed"}), more=False)
                return
            state, now = read, fingerprint(read)
            if now != last:
                last = now
                await emit(sse("progress", slim(state)))
        await emit(sse("end", {"id": self.id_, "status": end_status(state), **slim(state)}), more=False)

    async def _woken(self) -> bool:
        """Wait for a wake-up (False after ``KEEPALIVE_S`` without one); collapse a burst."""
        with trio.move_on_after(KEEPALIVE_S):
            await self.watcher.receive.receive()
            while True:
                try:
                    self.watcher.receive.receive_nowait()
                except trio.WouldBlock:
                    return True
        return False

    async def _read(self) -> dict[str, Any] | None:
        while True:
            try:
                return await self.runtime.in_db(
                    lambda: describe(self.runtime.settings, self.id_, tenant_id=self.tenant_id)
                )
            except NotFound:
                return None
            except RETRYABLE_DB_ERRORS as exc:  # the database away: keep watching, read again
                log.warning("watch %s: cannot read the row (%r)", self.id_, exc)
                await trio.sleep(1.0)


async def until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def open_watch(runtime: Runtime, hub: Hub, kind: str, id_: str, tenant_id: str) -> EventStream:
    """Register first, then read the row; 404 (``NotFound``) when it is not ``kind``'s."""
    ids = {"task_id": id_} if kind == "task" else {"doc_id": id_}
    watching = hub.watch(**ids)
    watcher = watching.__enter__()
    try:
        first = await runtime.in_db(lambda: describe(runtime.settings, id_, tenant_id=tenant_id))
        if first["kind"] != kind:
            raise NotFound(f"no {kind} with id {id_!r}")
    except BaseException:
        watching.__exit__(None, None, None)
        raise
    return EventStream(runtime, watching, watcher, first, tenant_id)
