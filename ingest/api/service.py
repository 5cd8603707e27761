"""The server's own routes: health, the caller's tenant standing, and admin's result clearing."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from db.config import parse_duration
from db.database import RETRYABLE_DB_ERRORS, connection
from db.keys import check_tenant
from db.streams import RETRYABLE_REDIS_ERRORS
from ingest.api.auth import Caller, admin, caller
from ingest.api.hub import Hub
from ingest.api.runtime import Runtime
from ingest.tenants import limits_of, standings

router = APIRouter(tags=["service"])


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _db_answers() -> bool:
    with connection() as db:
        db.execute_sql("SELECT 1")
    return True


@router.get("/healthz", responses={503: {"description": "Redis or the database does not answer"}})
async def healthz(request: Request) -> JSONResponse:
    """Whether Redis and the database answer (no key needed)."""
    runtime = _runtime(request)
    checks: dict[str, str] = {}
    try:
        await runtime.in_redis(runtime.redis_client.ping)
        checks["redis"] = "ok"
    except RETRYABLE_REDIS_ERRORS as exc:
        checks["redis"] = f"unreachable: {type(exc).__name__}"
    try:
        await runtime.in_db(_db_answers)
        checks["database"] = "ok"
    except RETRYABLE_DB_ERRORS as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    hub: Hub = request.app.state.hub
    ok = all(v == "ok" for v in checks.values())
    body = {"ok": ok, **checks, "watchers": asdict(hub.statistics())}
    return JSONResponse(body, 200 if ok else 503, None if ok else {"Retry-After": "5"})


@router.get("/v1/tenants/me")
async def tenant_me(request: Request, who: Caller = Depends(caller)) -> dict[str, Any]:
    """The caller's tenant: its limits in effect and how it stands now."""
    runtime = _runtime(request)
    limits = await runtime.in_db(limits_of, runtime.settings, who.tenant_id)
    standing = await runtime.in_db(standings, runtime.settings, [who.tenant_id])
    return {
        "tenant_id": who.tenant_id,
        "admin": who.admin,
        "limits": limits.to_dict(),
        "standing": standing[0].to_dict() if standing else None,
    }


@router.delete("/v1/results", tags=["admin"], responses={401: {}, 403: {}})
async def clear_results(
    request: Request,
    older_than: Annotated[str | None, Query(max_length=32, description="e.g. 7d, 12h, 30m")] = None,
    tenant: Annotated[str | None, Query(max_length=64, description="only this tenant's")] = None,
    who: Caller = Depends(admin),
) -> dict[str, Any]:
    """Remove finished tasks' results (older than ``older_than``, of ``tenant``, when given)."""
    runtime = _runtime(request)
    older_ms = int(parse_duration(older_than) * 1000) if older_than else None
    if tenant is not None:
        check_tenant(tenant)

    def work() -> int:
        return runtime.results.clear(older_than_ms=older_ms, now_ms=int(time.time() * 1000), tenant_id=tenant)

    return {"removed": await runtime.in_redis(work), "older_than_ms": older_ms, "tenant": tenant}
