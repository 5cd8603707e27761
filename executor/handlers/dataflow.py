"""The ``dataflow`` handler: run a stored dataflow's graph on a task's document.

The message names the dataflow (``dataflow_id``), the knowledge base (``kb_id``) and the tenant.
The graph runs as :mod:`ingest.dataflow.runner` describes: Parser, Splitter and Extractor in a
killable worker process, the Embedder through the executor's shared embedding service, the
Indexer into the task's knowledge base with the same deterministic chunk ids as ``parse``.
Progress is reported per component. A debug run (``debug`` in the payload) names a stored file
instead of a document row, writes no chunks, and returns each component's output (truncated)
as ``TaskResult.extra["outputs"]``, which the finisher keeps in the task's ``result``.

An unknown dataflow id, a DSL no longer valid or a missing document fail the task at once
(:class:`~ingest.errors.PermanentError`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from executor.context import ExecutorEnv, TaskContext, TaskResult
from executor.handlers import owned_document, shared_embedding_service
from ingest.dataflow.catalog import graph_of, load_dataflow
from ingest.dataflow.components import FileInput, IndexTarget, Runtime
from ingest.dataflow.debug import debug_location
from ingest.dataflow.runner import run_graph
from ingest.embedding import EmbeddingService
from ingest.errors import PermanentError
from ingest.parsers import extra_parsers
from ingest.storage import Storage, open_storage
from ingest.worker import WorkerBudget, run_in_worker

NO_PAGE_LIMIT = 100_000_000


def make_handler(env: ExecutorEnv) -> Callable[[TaskContext], Awaitable[TaskResult]]:
    """Called once per executor: the handler shares one embedding service and one storage."""
    service = shared_embedding_service(env)
    storage = open_storage(env.settings.storage_url)

    async def handle_dataflow(ctx: TaskContext) -> TaskResult:
        return await dataflow_task(ctx, service, storage)

    return handle_dataflow


def _context(ctx: TaskContext) -> dict[str, Any]:
    """The task's context: its row's payload (``ctx.message`` is rebuilt from the row too; the
    stream message is never believed)."""
    return dict(ctx.row.get("payload") or {})


async def dataflow_task(ctx: TaskContext, service: EmbeddingService, storage: Storage) -> TaskResult:
    started = time.monotonic()
    info = _context(ctx)
    dataflow_id = info.get("dataflow_id")
    if not isinstance(dataflow_id, str) or not dataflow_id:
        raise PermanentError("a dataflow task needs a dataflow_id in its message")
    row = await ctx.limiters.db(load_dataflow, dataflow_id)
    if row is None:
        raise PermanentError(
            f"unknown dataflow id {dataflow_id!r}: no such dataflow (never created, or replaced since the submit)"
        )
    tenant = ctx.row.get("tenant_id") or "default"
    if row["tenant_id"] != tenant:
        raise PermanentError(
            f"dataflow {row['name']!r} belongs to tenant {row['tenant_id']!r}, not {tenant!r}"
        )
    graph = graph_of(row)
    debug = bool(info.get("debug"))
    name, doc_type, location = _document(ctx, info, debug)
    ctx.report(0.01, f"dataflow {row['name']!r}{' (debug run)' if debug else ''}: reading {name}")
    data = await trio.to_thread.run_sync(_read_bytes, storage, location, limiter=ctx.limiters.db_limiter)
    file = FileInput(
        name=name,
        doc_type=doc_type,
        data=data,
        from_page=int(ctx.row.get("from_page") or 0),
        to_page=int(ctx.row.get("to_page") or NO_PAGE_LIMIT),
    )
    del data
    target = None if debug else _target(ctx)
    budget = WorkerBudget.from_settings(ctx.settings)
    runtime = Runtime(
        ctx.settings.embedding_model,
        service,
        ctx.limiters.db_limiter,
        target,
        max_chars=budget.max_held_chars,
        max_chunk_chars=ctx.settings.max_chunk_chars,
    )
    result = await run_graph(
        graph,
        file,
        runtime,
        ctx.report,
        run_worker=functools.partial(run_in_worker, budget=budget),
        extra_parsers=extra_parsers(),
        previews=debug,
    )
    elapsed = time.monotonic() - started
    head = {"dataflow": {"id": row["id"], "name": row["name"]}, "debug": debug}
    if debug:
        message = (
            f"debug run of {row['name']!r}: {len(graph.order)} components in {elapsed:.1f} s, nothing indexed"
        )
        return TaskResult(message=message, extra={**head, "outputs": result.outputs})
    message = f"dataflow {row['name']!r}: {result.chunks} chunks in {elapsed:.1f} s"
    return TaskResult(
        message=message, chunk_ids=result.chunk_ids, extra={**head, "components": result.summaries}
    )


def _document(ctx: TaskContext, info: Mapping[str, Any], debug: bool) -> tuple[str, str, str]:
    """(name, type, storage location) of the input document."""
    if debug:
        doc = info.get("document")
        if not isinstance(doc, Mapping) or not doc.get("location"):
            raise PermanentError(
                "a debug dataflow run needs a document (name, doc_type, location) in its payload"
            )
        location = str(doc["location"])
        if not location.startswith(debug_location(ctx.task_id, "")):
            # a debug run reads only the bytes its own submit stored (under its task id)
            raise PermanentError(f"a debug run reads only its own upload, not {location!r}")
        return str(doc.get("name") or ""), str(doc.get("doc_type") or ""), location
    doc, _ = owned_document(ctx)
    return doc["name"], doc.get("doc_type") or "", doc["location"]


def _target(ctx: TaskContext) -> IndexTarget:
    assert ctx.doc is not None and ctx.kb is not None
    return IndexTarget(
        kb_id=ctx.kb["id"],
        doc_id=ctx.doc["id"],
        task_id=ctx.task_id,
        generation=int(ctx.row.get("generation") or 0),
        attempt=ctx.attempt,
    )


def _read_bytes(storage: Storage, location: str) -> bytes:
    try:
        return storage.get(location)
    except FileNotFoundError:
        raise PermanentError(f"the document's bytes are missing from storage ({location})") from None
