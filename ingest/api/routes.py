"""Reading and changing enqueued work: describe, watch, result, cancel, retry (``/v1/tasks``,
``/v1/documents``). Another tenant's task or document is 404, as one that does not exist."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Request

from db.database import connection
from db.models import Document, Task
from ingest.api.auth import Caller, caller
from ingest.api.hub import Hub, TooManyWatchers
from ingest.api.runtime import Runtime
from ingest.api.watch import EventStream, open_watch
from ingest.control import cancel, retry
from ingest.errors import NotFound
from ingest.status import describe

router = APIRouter(prefix="/v1", tags=["tasks and documents"])

Id = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
WATCHERS_RETRY_S = 5
SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "state, progress…, end"}
}


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _owned(kind: str, id_: str, tenant_id: str) -> None:
    """Blocking: NotFound unless ``id_`` is a ``kind`` of ``tenant_id``."""
    model = Task if kind == "task" else Document
    with connection():
        found = model.select(model.id).where((model.id == id_) & (model.tenant_id == tenant_id)).exists()
    if not found:
        raise NotFound(f"no {kind} with id {id_!r}")


async def _describe(request: Request, kind: str, id_: str, who: Caller) -> dict[str, Any]:
    runtime = _runtime(request)
    state = await runtime.in_db(lambda: describe(runtime.settings, id_, tenant_id=who.tenant_id))
    if state["kind"] != kind:
        raise NotFound(f"no {kind} with id {id_!r}")
    return state


@router.get("/tasks/{task_id}", responses={404: {}})
async def get_task(request: Request, task_id: Id, who: Caller = Depends(caller)) -> dict[str, Any]:
    """One task's row."""
    return await _describe(request, "task", task_id, who)


@router.get("/documents/{doc_id}", responses={404: {}})
async def get_document(request: Request, doc_id: Id, who: Caller = Depends(caller)) -> dict[str, Any]:
    """One document with its current generation's tasks."""
    return await _describe(request, "document", doc_id, who)


async def _watch(request: Request, kind: str, id_: str, who: Caller) -> EventStream:
    hub: Hub = request.app.state.hub
    try:
        return await open_watch(_runtime(request), hub, kind, id_, who.tenant_id)
    except TooManyWatchers as exc:
        raise HTTPException(503, str(exc), {"Retry-After": str(WATCHERS_RETRY_S)}) from None


@router.get(
    "/tasks/{task_id}/watch", response_class=EventStream, status_code=200, responses={**SSE, 404: {}, 503: {}}
)
async def watch_task(request: Request, task_id: Id, who: Caller = Depends(caller)) -> EventStream:
    """Server-sent events until the task is done, failed, cancelled or dead."""
    return await _watch(request, "task", task_id, who)


@router.get(
    "/documents/{doc_id}/watch",
    response_class=EventStream,
    status_code=200,
    responses={**SSE, 404: {}, 503: {}},
)
async def watch_document(request: Request, doc_id: Id, who: Caller = Depends(caller)) -> EventStream:
    """Server-sent events until every task of the document's current generation has ended."""
    return await _watch(request, "document", doc_id, who)


@router.get("/tasks/{task_id}/result", responses={404: {"description": "not finished, expired or not yours"}})
async def get_result(request: Request, task_id: Id, who: Caller = Depends(caller)) -> dict[str, Any]:
    """A finished task's result; single use (by default) it expires a while after this fetch."""
    runtime = _runtime(request)
    s = runtime.settings

    def fetch() -> dict[str, Any] | None:
        return runtime.results.fetch(
            task_id,
            tenant_id=who.tenant_id,
            single_use=s.single_use_results,
            removal_delay_s=s.result_removal_delay_s,
        )

    result = await runtime.in_redis(fetch)
    if result is None:
        raise NotFound(f"no result for task {task_id!r} (not finished, expired, or not yours)")
    return result


async def _control(request: Request, verb: str, kind: str, id_: str, who: Caller) -> dict[str, Any]:
    runtime = _runtime(request)
    action = cancel if verb == "cancel" else retry

    def work() -> dict[str, Any]:
        _owned(kind, id_, who.tenant_id)
        return action(runtime.settings, id_, tenant_id=who.tenant_id).to_dict()

    return await runtime.in_db(work)


@router.post("/tasks/{task_id}/cancel", responses={404: {}})
async def cancel_task(request: Request, task_id: Id, who: Caller = Depends(caller)) -> dict[str, Any]:
    """Cancel the task (rows first, then Redis); a running copy stops within seconds."""
    return await _control(request, "cancel", "task", task_id, who)


@router.post("/documents/{doc_id}/cancel", responses={404: {}})
async def cancel_document(request: Request, doc_id: Id, who: Caller = Depends(caller)) -> dict[str, Any]:
    """Cancel every unfinished task of the document."""
    return await _control(request, "cancel", "document", doc_id, who)


@router.post("/tasks/{task_id}/retry", responses={404: {}})
async def retry_task(request: Request, task_id: Id, who: Caller = Depends(caller)) -> dict[str, Any]:
    """Queue a failed, dead or cancelled task again (``skipped`` says why not, otherwise)."""
    return await _control(request, "retry", "task", task_id, who)


@router.post("/documents/{doc_id}/retry", responses={404: {}})
async def retry_document(request: Request, doc_id: Id, who: Caller = Depends(caller)) -> dict[str, Any]:
    """Queue the failed, dead or cancelled tasks of the document's current generation again."""
    return await _control(request, "retry", "document", doc_id, who)
