"""Task types for the observability tests, loaded through ``INGEST_EXTRA_HANDLERS``."""

from __future__ import annotations

import time

import trio

from executor.context import TaskContext, TaskResult
from executor.tracing import span


async def block_loop(ctx: TaskContext) -> None:
    """Blocks the event loop itself for ``seconds`` (what a handler must never do)."""
    time.sleep(float(ctx.message.get("seconds", 2.0)))


async def traced(ctx: TaskContext) -> TaskResult:
    """Two child spans, ``step.one`` and ``step.two``; raises after them when ``fail`` is set."""
    with span("step.one", n=1):
        await trio.sleep(0)
    with span("step.two"):
        await trio.sleep(0)
    if ctx.message.get("fail"):
        raise RuntimeError("traced failure")
    return TaskResult(message="traced")
