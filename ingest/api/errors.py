"""How the domain's errors read over HTTP: a status code, a JSON body, Retry-After where useful.

``LimitExceeded`` → 429, ``NotFound`` → 404, ``ValueError`` → 422, ``PermanentError`` and ``IdInUse`` → 409,
``PublishError`` → 503 (the rows are committed; the reconciler publishes them), Redis, the
database or the vector engine unreachable (any other ``RetryableError``: busy, try again) → 503.
Each body has ``error`` (the cause's name) and ``detail``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from db.database import RETRYABLE_DB_ERRORS
from db.streams import RETRYABLE_REDIS_ERRORS
from ingest.errors import IdInUse, LimitExceeded, NotFound, PermanentError, PublishError, RetryableError

log = logging.getLogger(__name__)

UNAVAILABLE_RETRY_S = 5


def _body(exc: BaseException, **extra: Any) -> dict[str, Any]:
    return {"error": type(exc).__name__, "detail": str(exc), **extra}


async def _limit(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LimitExceeded)
    retry = int(exc.retry_after_s)
    return JSONResponse({**exc.to_dict(), "detail": str(exc)}, 429, {"Retry-After": str(retry)})


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(_body(exc), 404)


async def _bad_value(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(_body(exc), 422)


async def _permanent(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(_body(exc), 409)


async def _publish(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PublishError)
    result = exc.result.to_dict() if hasattr(exc.result, "to_dict") else None
    body = _body(
        exc,
        committed=True,
        task_ids=exc.task_ids,
        result=result,
        note="the rows are committed; the reconciler publishes their messages once Redis answers",
    )
    return JSONResponse(body, 503, {"Retry-After": str(UNAVAILABLE_RETRY_S)})


async def _retry_later(request: Request, exc: Exception) -> JSONResponse:
    log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    retry = int(getattr(exc, "retry_after_s", UNAVAILABLE_RETRY_S))
    return JSONResponse(_body(exc), 503, {"Retry-After": str(retry)})


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("%s %s: a store is unreachable: %r", request.method, request.url.path, exc)
    body = _body(exc, detail=f"a store is unreachable ({type(exc).__name__}); try again later")
    return JSONResponse(body, 503, {"Retry-After": str(UNAVAILABLE_RETRY_S)})


def install(app: FastAPI) -> None:
    """Register the handlers (the most specific class wins, as Starlette looks them up)."""
    app.add_exception_handler(LimitExceeded, _limit)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(ValueError, _bad_value)
    app.add_exception_handler(PermanentError, _permanent)
    app.add_exception_handler(IdInUse, _permanent)  # a conflict, not a malformed request
    app.add_exception_handler(RetryableError, _retry_later)  # the vector engine away, a busy submit
    app.add_exception_handler(PublishError, _publish)
    for cls in (*RETRYABLE_REDIS_ERRORS, *RETRYABLE_DB_ERRORS):
        app.add_exception_handler(cls, _unavailable)
