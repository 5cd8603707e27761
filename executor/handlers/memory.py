"""The ``memory`` handler: a conversation message → its embedding → one row of its memory.

The message carries ``memory_id``, ``source_id`` and ``message_dict`` (``role``, ``content``,
optionally ``position``). A message without content, with an unknown role or without ids fails
the task at once with the reason (:class:`~ingest.errors.PermanentError`). The content is
embedded through the executor's shared batching service (messages of concurrent tasks share
batches) and upserted under an id derived from (memory id, source id), so a redelivered or
repeated message is stored once. The upsert is fenced on the task's row under this run's attempt:
a run that was cancelled or taken over stores nothing (:class:`~ingest.errors.TaskLost`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import trio

from executor.context import ExecutorEnv, TaskContext, TaskResult
from executor.handlers import shared_embedding_service
from ingest.embedding import EmbeddingService
from ingest.memory import check_message, store_message


def make_handler(env: ExecutorEnv) -> Callable[[TaskContext], Awaitable[TaskResult]]:
    """Called once per executor: the handler shares the executor's embedding service."""
    service = shared_embedding_service(env)

    async def handle_memory(ctx: TaskContext) -> TaskResult:
        return await memory_task(ctx, service)

    return handle_memory


async def memory_task(ctx: TaskContext, service: EmbeddingService) -> TaskResult:
    item = check_message(dict(ctx.row.get("payload") or {}))  # the row's context, never the stream's
    ctx.report(0.1, f"embedding message {item.source_id} ({item.role}, {len(item.content)} characters)")
    vectors = await service.embed([item.content])
    identity = (await service.embedder()).identity  # loaded by the embed above
    ctx.report(0.8, "")
    store = functools.partial(
        store_message,
        item,
        vectors[0],
        ctx.task_id,
        int(ctx.row.get("create_time") or 0) * 1000,
        attempt=ctx.attempt,  # fenced: a run whose row is no longer its own stores nothing
        tenant_id=str(ctx.row.get("tenant_id") or "default"),  # the row's tenant owns the memory
        model=identity,  # a memory's vectors are of one model
    )
    message_id = await trio.to_thread.run_sync(store, limiter=ctx.limiters.db_limiter)
    return TaskResult(
        message=f"saved message {item.source_id} ({item.role}) to memory {item.memory_id}",
        extra={"memory_id": item.memory_id, "message_id": message_id},
    )
