"""The ASGI application: ``create_app(settings)``, and ``app`` for hypercorn's worker processes.

``create_app`` wires the routes, the dashboard (``/dashboard``), the error handlers, the
body-size cap and the lifespan (the watchers' hub and the dashboard's history sampler run in the
lifespan's nursery). ``app`` builds its application from the
environment (``Settings.from_env``) on its first call, so importing this module reads nothing
and loads no model.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from db.config import Settings
from ingest.api import dashboard, errors, query, routes, service, submit
from ingest.api.auth import KeyRing
from ingest.api.hub import Hub
from ingest.api.runtime import Runtime


class ContentLengthCap:
    """413 at once for a declared ``Content-Length`` over the cap (FastAPI's ``max_body_size``
    also counts the bytes of a body sent without one, as they arrive)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = dict(scope.get("headers") or ()).get(b"content-length")
            if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
                response = JSONResponse(
                    {"error": "RequestTooLarge", "detail": f"the body is over {self.max_bytes} bytes"}, 413
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    """The API over ``settings`` (nothing connects until the lifespan starts)."""
    runtime = Runtime.create(settings)
    keyring = KeyRing(settings)
    hub = Hub(runtime)
    history = dashboard.History()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            nursery.start_soon(history.sample_forever, runtime)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()
                runtime.close()

    app = FastAPI(
        title="ingest",
        summary="Document ingestion: submit, watch, fetch results, search",
        version="1",
        lifespan=lifespan,
        max_body_size=settings.api_max_request_bytes,
    )
    app.state.runtime, app.state.keyring, app.state.hub = runtime, keyring, hub
    for module in (submit, routes, query, service):
        app.include_router(module.router)
    errors.install(app)
    dashboard.install(app, hub, history)
    app.add_middleware(ContentLengthCap, max_bytes=settings.api_max_request_bytes)
    return app


class _FromEnvironment:
    """An ASGI app that builds ``create_app(Settings.from_env(os.environ))`` on its first call
    (a worker process of ``hypercorn.run.run`` imports ``ingest.api.app:app``)."""

    def __init__(self) -> None:
        self._app: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = create_app(Settings.from_env(os.environ))
        await self._app(scope, receive, send)


app = _FromEnvironment()
