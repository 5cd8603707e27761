"""The ``parse`` handler: a document's task → chunks with vectors in its knowledge base.

Stages, each reported on the task row: read the bytes (storage, in a thread), parse and chunk
(a killable worker process), embed (the executor's shared batching service), index (upserts,
in a thread). A document the parser cannot read raises ``BadDocument``: the executor fails
the row with that reason (progress -1) and goes on with other tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from executor.context import ExecutorEnv, TaskContext, TaskResult
from executor.handlers import owned_document, shared_embedding_service
from executor.tracing import record_span, span
from ingest import vectors
from ingest.chunking import ChunkConfig, oversize_note
from ingest.embedding import EmbeddingService
from ingest.errors import PermanentError
from ingest.storage import Storage, open_storage
from ingest.store import record_embedding_model, store_chunks
from ingest.worker import WorkerBudget, parse_and_chunk_in_worker

# Progress fractions at the end of each stage (the finisher writes 1.0).
PARSED, CHUNKED, EMBEDDED, INDEXED = 0.30, 0.35, 0.90, 0.98
EMBED_LINE_INTERVAL_S = 2.0  # "embedded N/M" lines at most this often (the fraction moves each batch)


def make_handler(env: ExecutorEnv) -> Callable[[TaskContext], Awaitable[TaskResult]]:
    """Called once per executor: the handler shares one embedding service and one storage."""
    service = shared_embedding_service(env)
    storage = open_storage(env.settings.storage_url)
    vectors.use(env.settings)  # store_chunks indexes into it

    async def handle_parse(ctx: TaskContext) -> TaskResult:
        return await parse_task(ctx, service, storage)

    return handle_parse


async def parse_task(ctx: TaskContext, service: EmbeddingService, storage: Storage) -> TaskResult:
    """Parse, chunk, embed and index one task's pages of its document."""
    started = time.monotonic()
    doc, kb, row = _require(ctx)
    config = dataclasses.replace(
        ChunkConfig.from_parser_configs(kb.get("parser_config"), doc.get("parser_config")),
        max_chars=ctx.settings.max_chunk_chars,
    )
    model = ctx.settings.embedding_model
    from_page, to_page = int(row.get("from_page") or 0), int(row.get("to_page") or 0)
    ctx.report(0.01, "parsing…")
    began = time.time()
    data = await trio.to_thread.run_sync(
        _read_bytes, storage, doc["location"], limiter=ctx.limiters.db_limiter
    )
    parsed = await parse_and_chunk_in_worker(
        data,
        doc.get("doc_type") or "",
        from_page,
        to_page,
        config,
        model,
        budget=WorkerBudget.from_settings(ctx.settings),
    )
    ended = time.time()  # one worker job: its parse and chunk stages become two spans
    record_span("parse", began, ended - parsed.chunk_s, bytes=len(data), sections=parsed.sections)
    record_span("chunk", ended - parsed.chunk_s, ended, chunks=len(parsed.chunks))
    del data
    chunks = parsed.chunks
    ctx.report(PARSED, f"{parsed.sections} sections")
    ctx.report(CHUNKED, f"{len(chunks)} chunks")

    with span("embed", chunks=len(chunks)):
        embedder = await service.embedder()
        record = functools.partial(
            record_embedding_model, kb["id"], embedder.identity, embedder.dim, oversize_note(config, model)
        )
        await trio.to_thread.run_sync(record, limiter=ctx.limiters.db_limiter)
        vectors = await service.embed([c.content for c in chunks], on_progress=_embed_progress(ctx))

    store = functools.partial(
        store_chunks,
        kb_id=kb["id"],
        doc_id=doc["id"],
        task_id=ctx.task_id,
        generation=int(row.get("generation") or 0),
        chunks=chunks,
        vectors=vectors,
        attempt=ctx.attempt,  # fenced like every other write of the run
    )
    with span("index", chunks=len(chunks)):
        chunk_ids = await trio.to_thread.run_sync(store, limiter=ctx.limiters.db_limiter)
    ctx.report(INDEXED, f"indexed {len(chunk_ids)} chunks")
    tokens = sum(c.token_num for c in chunks)
    elapsed = time.monotonic() - started
    if not chunks:
        message = f"no text found in {_pages(from_page, to_page)}: 0 chunks"
    else:
        message = f"{len(chunks)} chunks, {tokens} tokens in {elapsed:.1f} s"
    return TaskResult(message=message, chunk_ids=chunk_ids)


def _require(ctx: TaskContext) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    doc, kb = owned_document(ctx)
    return doc, kb, ctx.row


def _read_bytes(storage: Storage, location: str) -> bytes:
    try:
        return storage.get(location)
    except FileNotFoundError:
        raise PermanentError(f"the document's bytes are missing from storage ({location})") from None


def _embed_progress(ctx: TaskContext) -> Callable[[int, int], None]:
    last_line = -EMBED_LINE_INTERVAL_S

    def report(done: int, total: int) -> None:
        nonlocal last_line
        fraction = CHUNKED + (EMBEDDED - CHUNKED) * done / total
        now = time.monotonic()
        if done >= total or now - last_line >= EMBED_LINE_INTERVAL_S:
            last_line = now
            ctx.report(fraction, f"embedded {done}/{total}")
        else:
            ctx.report(fraction, "")

    return report


def _pages(from_page: int, to_page: int) -> str:
    return "the document" if from_page <= 0 and to_page >= 100_000_000 else f"pages {from_page + 1}–{to_page}"
