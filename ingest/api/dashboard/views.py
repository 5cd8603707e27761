"""Each page of the dashboard as data: its query parameters, the context its template renders,
the regions a live update replaces, the ids its live stream watches and how often it refreshes.

A page and its live stream build the same context with :func:`context`, so what a reload shows
and what the stream sends never differ.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request

from db.keys import check_tenant
from ingest.api.dashboard import reads
from ingest.api.dashboard.access import Viewer
from ingest.api.dashboard.history import History
from ingest.api.runtime import Runtime
from ingest.dead import recent_dead
from ingest.strikes import FIELDS, OPERATORS, list_strikes

DEAD_SHOWN = 200
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def history_of(request: Request) -> History:
    history: History = request.app.state.dashboard_history
    return history


def filters(request: Request, who: Viewer, states: tuple[str, ...]) -> reads.Filters:
    """The list filters of the query string; a tenant's key always filters by its tenant."""
    q = request.query_params
    tenant = q.get("tenant") or None
    if tenant is not None:
        try:
            tenant = check_tenant(tenant)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
    if who.tenant_id is not None:
        tenant = who.tenant_id
    out: dict[str, str | None] = {}
    for name in ("kb", "doc"):
        value = q.get(name) or None
        if value is not None and not _ID.match(value):
            raise HTTPException(422, f"{name} is an id of letters, digits, '_' and '-'")
        out[name] = value
    state = q.get("state") or None
    if state is not None and state not in states:
        raise HTTPException(422, f"state is one of {', '.join(states)}")
    after = q.get("after") or None
    f = reads.Filters(tenant=tenant, kb=out["kb"], state=state, doc=out["doc"], after=after)
    if after is not None and f.cursor() is None:
        raise HTTPException(422, "after is a cursor of this page's 'next' link")
    return f


async def _fleet(request: Request, who: Viewer) -> dict[str, Any]:
    runtime = runtime_of(request)
    executors = await runtime.in_redis(reads.fleet_rows, runtime.settings)
    return {"executors": executors, "charts": history_of(request).charts()}


async def _queues(request: Request, who: Viewer) -> dict[str, Any]:
    runtime = runtime_of(request)
    data = await runtime.in_db(reads.queues, runtime.settings, runtime.redis_client, who.tenant_id)
    return {"queues": data, "charts": history_of(request).charts()}


async def _kb_choices(runtime: Runtime, who: Viewer, tenant: str | None) -> list[dict[str, Any]]:
    return await runtime.in_db(reads.knowledge_bases, runtime.settings, tenant or who.tenant_id)


async def _listing(request: Request, who: Viewer, states: tuple[str, ...], read: Any) -> dict[str, Any]:
    runtime = runtime_of(request)
    f = filters(request, who, states)
    rows, more = await runtime.in_db(read, runtime.settings, f)
    return {
        "rows": rows,
        "next": more,
        "f": f,
        "states": states,
        "kbs": await _kb_choices(runtime, who, f.tenant),
        "watch_ids": tuple(r["id"] for r in rows),
    }


async def _documents(request: Request, who: Viewer) -> dict[str, Any]:
    return await _listing(request, who, reads.DOCUMENT_STATES, reads.documents_page)


async def _tasks(request: Request, who: Viewer) -> dict[str, Any]:
    return await _listing(request, who, reads.TASK_STATES, reads.tasks_page)


def _admin_only(who: Viewer) -> None:
    if not who.admin:
        raise HTTPException(403, "this page needs the admin key")


async def _dead(request: Request, who: Viewer) -> dict[str, Any]:
    _admin_only(who)
    runtime = runtime_of(request)
    letters = await runtime.in_redis(recent_dead, runtime.settings, DEAD_SHOWN)
    return {"letters": [d.to_dict() for d in letters], "shown": DEAD_SHOWN}


async def _strikes(request: Request, who: Viewer) -> dict[str, Any]:
    _admin_only(who)
    runtime = runtime_of(request)
    rules = await runtime.in_db(lambda: list_strikes(runtime.settings))
    return {"rules": rules, "fields": FIELDS, "operators": OPERATORS}


async def _kbs(request: Request, who: Viewer) -> dict[str, Any]:
    runtime = runtime_of(request)
    return {"kbs": await runtime.in_db(reads.knowledge_bases, runtime.settings, who.tenant_id)}


@dataclass(frozen=True)
class View:
    """One live page: its template, how its context is built, the regions a live update
    replaces (element id → partial template) and the longest time between two refreshes."""

    name: str
    title: str
    template: str
    build: Callable[[Request, Viewer], Awaitable[dict[str, Any]]]
    regions: tuple[tuple[str, str], ...]
    refresh_s: float
    admin: bool = False


VIEWS: dict[str, View] = {
    v.name: v
    for v in (
        View(
            "fleet",
            "Fleet",
            "fleet.html",
            _fleet,
            (("fleet-rows", "_fleet_rows.html"), ("charts", "_charts.html")),
            2.0,
        ),
        View(
            "queues",
            "Queues",
            "queues.html",
            _queues,
            (("queues-body", "_queues_body.html"), ("charts", "_charts.html")),
            2.0,
        ),
        View(
            "documents",
            "Documents",
            "documents.html",
            _documents,
            (("doc-rows", "_doc_rows.html"), ("doc-more", "_more.html")),
            5.0,
        ),
        View(
            "tasks",
            "Tasks",
            "tasks.html",
            _tasks,
            (("task-rows", "_task_rows.html"), ("task-more", "_more.html")),
            5.0,
        ),
        View(
            "dead", "Dead letters", "dead.html", _dead, (("dead-rows", "_dead_rows.html"),), 5.0, admin=True
        ),
        View(
            "strikes",
            "Strikes",
            "strikes.html",
            _strikes,
            (("strike-rows", "_strike_rows.html"),),
            3.0,
            admin=True,
        ),
        View("kbs", "Knowledge bases", "kbs.html", _kbs, (("kb-rows", "_kb_rows.html"),), 10.0),
    )
}
