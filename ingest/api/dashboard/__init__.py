"""The live web dashboard that ``ingest serve`` also serves, under ``/dashboard`` (issue 19).

Server-rendered pages (Jinja2, autoescaped) of the fleet, the queues, documents and tasks,
dead letters, strikes and knowledge bases (with a retrieval test box); one server-sent-event
stream per open page keeps it live (:mod:`~ingest.api.dashboard.live`); a few lines of plain
JavaScript in a static file apply its updates, and every page reads the same without it.
Access and actions: :mod:`~ingest.api.dashboard.access`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles

from ingest.api.dashboard.access import NeedsLogin
from ingest.api.dashboard.history import History
from ingest.api.dashboard.pages import needs_login, router
from ingest.api.dashboard.templating import STATIC, SecurityHeaders, render
from ingest.api.hub import Hub
from ingest.errors import NotFound

__all__ = ["History", "install"]


async def _error(request: Request, exc: Exception) -> Response:
    """Errors under ``/dashboard`` as a page; elsewhere as the API answers them."""
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 404
    if not request.url.path.startswith("/dashboard"):
        if isinstance(exc, StarletteHTTPException):
            return await http_exception_handler(request, exc)
        return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, 404)
    detail = exc.detail if isinstance(exc, StarletteHTTPException) else str(exc)
    context = {
        "title": f"{status}",
        "status": status,
        "detail": str(detail),
        "page": "",
        "live": None,
        "note": "",
    }
    return HTMLResponse(render("error.html", context), status, headers=getattr(exc, "headers", None))


def install(app: FastAPI, hub: Hub, history: History) -> None:
    """Add the dashboard's routes, static files, headers and error pages to ``app``; ``hub``
    feeds ``history`` (whose sampler the app's lifespan runs)."""
    hub.add_listener(history.on_event)
    app.state.dashboard_history = history
    app.include_router(router)
    app.mount("/dashboard/static", StaticFiles(directory=str(STATIC)), name="dashboard-static")
    app.add_exception_handler(NeedsLogin, needs_login)
    app.add_exception_handler(StarletteHTTPException, _error)
    app.add_exception_handler(NotFound, _error)
    app.add_middleware(SecurityHeaders)
