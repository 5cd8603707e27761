"""One server-sent-event stream per open dashboard page: the page's regions, rendered again when
something they show may have changed, sent only when they did.

The stream watches the ids its page shows through the :class:`~ingest.api.hub.Hub` (the updates
channel wakes it at once on a task's end; the hub's row poller within half a second on any
progress), and refreshes at least every ``view.refresh_s`` (heartbeats, new rows, the charts).
It keeps the last HTML it sent per region and nothing else, so an hour-long page holds the same
memory as a fresh one; the browser's ``EventSource`` reconnects by itself after a server restart
(``retry:``), with the same cookie.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import peewee
import trio
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from db.database import RETRYABLE_DB_ERRORS
from db.streams import RETRYABLE_REDIS_ERRORS
from ingest.api.dashboard.access import Viewer
from ingest.api.dashboard.templating import render
from ingest.api.dashboard.views import View
from ingest.api.hub import Hub, TooManyWatchers
from ingest.api.watch import SSE_HEADERS, until_disconnect
from ingest.api.watch import sse as event

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
RETRY_MS = 2000
UNAVAILABLE_WAIT_S = 2.0


class PageStream(Response):
    """The live stream of one page, as an ASGI response."""

    media_type = "text/event-stream"

    def __init__(self, request: Request, view: View, who: Viewer, base: dict[str, Any]) -> None:
        self.status_code, self.background = 200, None
        self.raw_headers = list(SSE_HEADERS)
        self.request, self.view, self.who, self.base = request, view, who, base
        self.hub: Hub = request.app.state.hub
        self._watching: contextlib.AbstractContextManager[Any] | None = None
        self._watcher: Any = None
        self._ids: tuple[str, ...] = ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_disconnect, receive, nursery.cancel_scope)
                await self._stream(send)
                nursery.cancel_scope.cancel()
        except OSError:
            pass  # the browser went away mid-send
        finally:
            self._unwatch()

    async def _stream(self, send: Send) -> None:
        async def emit(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        await emit(f"retry: {RETRY_MS}\n\n".encode())
        sent: dict[str, str] = {}
        quiet_s = 0.0
        while True:
            regions = await self._regions()
            changed = {k: v for k, v in regions.items() if sent.get(k) != v}
            if changed:
                sent.update(changed)
                await emit(event("regions", changed))
                quiet_s = 0.0
            elif quiet_s >= KEEPALIVE_S:
                await emit(b": keep-alive\n\n")
                quiet_s = 0.0
            waited = await self._wait(self.view.refresh_s if regions else UNAVAILABLE_WAIT_S)
            quiet_s += waited

    async def _regions(self) -> dict[str, str]:
        """The page's regions now ({} when a store does not answer: try again soon)."""
        try:
            context = await self.view.build(self.request, self.who)
        except (*RETRYABLE_DB_ERRORS, *RETRYABLE_REDIS_ERRORS, peewee.DatabaseError) as exc:
            log.warning("dashboard %s: a store did not answer (%r)", self.view.name, exc)
            return {}
        self._rewatch(tuple(context.get("watch_ids", ())))
        full = {**self.base, **context}
        return {region: render(template, full) for region, template in self.view.regions}

    def _rewatch(self, ids: tuple[str, ...]) -> None:
        if ids == self._ids and (self._watching is not None or not ids):
            return
        self._unwatch()
        self._ids = ids
        if not ids:
            return
        watching = self.hub.watch(ids=ids)
        try:
            self._watcher = watching.__enter__()
        except TooManyWatchers:
            return  # the server is full of watchers: this page refreshes on its timer only
        self._watching = watching

    def _unwatch(self) -> None:
        if self._watching is not None:
            self._watching.__exit__(None, None, None)
        self._watching = self._watcher = None

    async def _wait(self, timeout_s: float) -> float:
        """Until a wake-up of the watched ids or ``timeout_s``; the seconds it waited."""
        started = trio.current_time()
        with trio.move_on_after(timeout_s):
            if self._watcher is None:
                await trio.sleep_forever()
            await self._watcher.receive.receive()
            while True:  # collapse a burst into one refresh
                try:
                    self._watcher.receive.receive_nowait()
                except trio.WouldBlock:
                    break
        return trio.current_time() - started
