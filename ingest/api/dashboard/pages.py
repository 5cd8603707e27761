"""The dashboard's routes: its pages (``GET /dashboard/...``), their live streams
(``GET /dashboard/events/{page}``), the login, and the actions (POSTs with the admin key and the
CSRF token), which call the same functions as the CLI's verbs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ingest.api.dashboard import reads
from ingest.api.dashboard.access import (
    COOKIE,
    COOKIE_MAX_AGE_S,
    COOKIE_PATH,
    CSRF_FIELD,
    NeedsLogin,
    Viewer,
    check_action,
    check_origin,
    csrf_token,
    identify,
    viewer,
)
from ingest.api.dashboard.live import PageStream
from ingest.api.dashboard.templating import render
from ingest.api.dashboard.views import VIEWS, View, runtime_of
from ingest.api.query import run_search
from ingest.control import cancel, retry
from ingest.dead import replay
from ingest.errors import IngestError, NotFound
from ingest.strikes import restore, strike

router = APIRouter(prefix="/dashboard", include_in_schema=False)

Id = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
MAX_K = 50
NOTE_CHARS = 300


def base_context(request: Request, who: Viewer, view: View | None, title: str) -> dict[str, Any]:
    ring = request.app.state.keyring
    live = None
    if view is not None:
        query = urlencode(list(request.query_params.multi_items()))
        live = f"/dashboard/events/{view.name}" + (f"?{query}" if query else "")
    note = request.query_params.get("note", "")[:NOTE_CHARS]
    return {
        "who": who,
        "title": title,
        "page": view.name if view else "",
        "views": [v for v in VIEWS.values() if who.admin or not v.admin],
        "live": live,
        "csrf": csrf_token(ring) if who.admin else "",
        "csrf_field": CSRF_FIELD,
        "note": note,
        "keys_required": ring.required,
    }


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status, headers={"cache-control": "no-store"})


async def _page(request: Request, name: str, who: Viewer) -> HTMLResponse:
    view = VIEWS[name]
    context = {**base_context(request, who, view, view.title), **await view.build(request, who)}
    return _html(render(view.template, context))


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
async def home(request: Request, who: Viewer = Depends(viewer)) -> HTMLResponse:
    return await _page(request, "fleet", who)


def _page_route(name: str) -> Callable[..., Any]:
    async def page(request: Request, who: Viewer = Depends(viewer)) -> HTMLResponse:
        return await _page(request, name, who)

    page.__name__ = f"page_{name}"
    return page


for _name in VIEWS:
    router.add_api_route(f"/{_name}", _page_route(_name), methods=["GET"], response_class=HTMLResponse)


@router.get("/events/{name}")
async def events(request: Request, name: str, who: Viewer = Depends(viewer)) -> Response:
    """The live stream of page ``name`` (server-sent events: ``regions``)."""
    view = VIEWS.get(name)
    if view is None:
        raise HTTPException(404, f"no page {name!r}")
    if view.admin and not who.admin:
        raise HTTPException(403, "this page needs the admin key")
    base = base_context(request, who, view, view.title)
    await view.build(request, who)  # a bad filter answers 422 here, not in the stream
    return PageStream(request, view, who, base)


@router.get("/kbs/{kb_id}", response_class=HTMLResponse)
async def kb_page(
    request: Request,
    kb_id: Id,
    q: Annotated[str, Query(max_length=1000)] = "",
    k: int = 5,
    who: Viewer = Depends(viewer),
) -> HTMLResponse:
    """One knowledge base and its retrieval test box (the API's search, top ``k``: held to
    1…``MAX_K`` and to the search's own cap, ``INGEST_SEARCH_MAX_K``)."""
    runtime = runtime_of(request)
    max_k = min(MAX_K, runtime.settings.search_max_k)
    k = max(1, min(k, max_k))
    kb = await runtime.in_db(reads.knowledge_base, runtime.settings, kb_id, who.tenant_id)
    if kb is None:
        raise NotFound(f"no knowledge base {kb_id!r}")
    hits: list[dict[str, Any]] | None = None
    error = ""
    if q.strip():
        try:
            hits = await run_search(runtime, kb["name"], q, k, kb["tenant_id"])
        except (IngestError, ValueError) as exc:  # a refusal of the search (as _act's) is the page's note
            error = str(exc)
    context = {
        **base_context(request, who, None, f"Knowledge base {kb['name']}"),
        "page": "kbs",
        "kb": kb,
        "q": q,
        "k": k,
        "max_k": max_k,
        "hits": hits,
        "error": error,
    }
    return _html(render("kb.html", context))


# -- login -------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> HTMLResponse:
    return _login(request, request.query_params.get("why", ""))


def _login(request: Request, why: str, status: int = 200) -> HTMLResponse:
    context = {"title": "Log in", "why": why[:NOTE_CHARS], "page": "login", "live": None, "note": ""}
    return _html(render("login.html", context), status)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    check_origin(request)  # another site's form would log this browser in under its own key
    form = await request.form()
    key = str(form.get("key") or "").strip()
    who = identify(request.app.state.keyring, key) if key else None
    if who is None:
        return _login(request, "unknown key", 401)
    response = RedirectResponse("/dashboard/", 303)
    response.set_cookie(
        COOKIE,
        key,
        max_age=COOKIE_MAX_AGE_S,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    check_origin(request)
    response = RedirectResponse("/dashboard/login", 303)
    response.delete_cookie(COOKIE, path=COOKIE_PATH)
    return response


async def needs_login(request: Request, exc: Exception) -> Response:
    """Pages send the browser to the login form; a live stream answers 401."""
    reason = exc.reason if isinstance(exc, NeedsLogin) else "log in"
    if request.url.path.startswith("/dashboard/events/"):
        return Response(reason, 401, media_type="text/plain")
    return RedirectResponse("/dashboard/login?" + urlencode({"why": reason}), 303)


# -- actions (the CLI verbs' functions) ----------------------------------------------------


async def _form(request: Request, who: Viewer) -> dict[str, str]:
    form = await request.form()
    values = {k: str(v) for k, v in form.items() if isinstance(v, str)}
    check_action(request, who, values.get(CSRF_FIELD, ""))
    return values


def _back(path: str, note: str, **query: str) -> RedirectResponse:
    return RedirectResponse(f"{path}?" + urlencode({**query, "note": note[:NOTE_CHARS]}), 303)


def _act(work: Callable[[], str]) -> str:
    """Run an action's domain call; its refusal (not found, bad value) becomes the note."""
    try:
        return work()
    except (IngestError, ValueError) as exc:
        return f"refused: {exc}"


@router.post("/dead/replay")
async def replay_dead(request: Request, who: Viewer = Depends(viewer)) -> Response:
    runtime = runtime_of(request)
    entry = (await _form(request, who)).get("entry", "")

    def work() -> str:
        result = replay(runtime.settings, [entry])
        done = ", ".join(f"{e} (task {t})" for e, t in result.replayed)
        skipped = "; ".join(f"{e}: {why}" for e, why in result.skipped)
        return f"replayed {done}" if done else f"not replayed: {skipped}"

    return _back("/dashboard/dead", await runtime.in_db(_act, work))


@router.post("/strikes")
async def add_strike(request: Request, who: Viewer = Depends(viewer)) -> Response:
    runtime = runtime_of(request)
    form = await _form(request, who)
    parts = [form.get(k, "").strip() or None for k in ("task_type", "field", "op", "value")]

    def work() -> str:
        result = strike(runtime.settings, *parts)
        verb = "added" if result.created else "already active:"
        return f"{verb} strike #{result.rule['id']}: {result.rule['rule']}"

    return _back("/dashboard/strikes", await runtime.in_db(_act, work))


@router.post("/strikes/{strike_id}/restore")
async def restore_strike(request: Request, strike_id: int, who: Viewer = Depends(viewer)) -> Response:
    runtime = runtime_of(request)
    await _form(request, who)

    def work() -> str:
        result = restore(runtime.settings, strike_id=strike_id)
        return f"restored strike #{strike_id}: {len(result.task_ids)} task(s) released"

    return _back("/dashboard/strikes", await runtime.in_db(_act, work))


@router.post("/{kind}/{id_}/{verb}")
async def control(request: Request, kind: str, id_: Id, verb: str, who: Viewer = Depends(viewer)) -> Response:
    """Cancel or retry a task or a document (``ingest cancel`` / ``ingest retry``)."""
    if kind not in ("tasks", "documents") or verb not in ("cancel", "retry"):
        raise HTTPException(404, "no such action")
    runtime = runtime_of(request)
    await _form(request, who)

    def work() -> str:
        if verb == "cancel":
            done = cancel(runtime.settings, id_)
            return f"cancelled {len(done.task_ids)} task(s)"
        result = retry(runtime.settings, id_)
        why = "; ".join(w for _, w in result.skipped)
        return f"re-queued {len(result.task_ids)} task(s)" + (f" ({why})" if why else "")

    return _back(f"/dashboard/{kind}", await runtime.in_db(_act, work))
