"""``POST /v1/documents`` (multipart upload) and ``POST /v1/tasks`` (JSON): enqueue work."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import JSONResponse

from ingest.api.auth import Caller, caller
from ingest.api.models import TasksIn
from ingest.api.runtime import Runtime
from ingest.errors import NotFound
from ingest.producer import enqueue_tasks, submit_documents

router = APIRouter(prefix="/v1", tags=["submit"])

MAX_FILES_PER_CALL = 1000


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


@router.post(
    "/documents",
    status_code=201,
    responses={200: {"description": "every file was refused"}, 413: {}, 422: {}, 429: {}, 503: {}},
)
async def post_documents(
    request: Request,
    files: Annotated[list[UploadFile], File(description="one or more documents")],
    kb: Annotated[str, Form(min_length=1, max_length=128)],
    priority: Annotated[int, Form(ge=0, le=1)] = 0,
    dataflow: Annotated[str | None, Form(min_length=1, max_length=128)] = None,
    who: Caller = Depends(caller),
) -> JSONResponse:
    """Store the files, write their rows, publish their tasks (refused files are listed)."""
    runtime = _runtime(request)
    if len(files) > MAX_FILES_PER_CALL:
        raise HTTPException(422, f"at most {MAX_FILES_PER_CALL} files in one call")
    sources = [(f.filename or "", await runtime.read_file(_read_all, f)) for f in files]
    dataflow_id = await _dataflow_id(runtime, dataflow, who.tenant_id) if dataflow else None

    def work() -> dict[str, Any]:
        result = submit_documents(
            runtime.settings, sources, kb, tenant_id=who.tenant_id, priority=priority, dataflow_id=dataflow_id
        )
        return result.to_dict()

    body = await runtime.in_db(work)
    return JSONResponse(body, status_code=201 if body["documents"] else 200)


def _read_all(upload: UploadFile) -> bytes:
    upload.file.seek(0)
    return upload.file.read()


async def _dataflow_id(runtime: Runtime, name: str, tenant_id: str) -> str:
    from ingest.dataflow.catalog import get_dataflow

    try:
        row = await runtime.in_db(lambda: get_dataflow(runtime.settings, name, tenant_id=tenant_id))
    except NotFound as exc:
        raise ValueError(str(exc)) from None
    return str(row["id"])


@router.post("/tasks", status_code=201, responses={404: {}, 409: {}, 422: {}, 429: {}, 503: {}})
async def post_tasks(request: Request, body: TasksIn, who: Caller = Depends(caller)) -> dict[str, Any]:
    """Write one queued row per task (of the caller's tenant), then publish them."""
    runtime = _runtime(request)
    tasks = [{**t.model_dump(exclude_none=True), "tenant_id": who.tenant_id} for t in body.tasks]

    # enqueue_tasks refuses another tenant's task id (409), document or knowledge base (404)
    return {"task_ids": await runtime.in_db(lambda: enqueue_tasks(runtime.settings, tasks))}
