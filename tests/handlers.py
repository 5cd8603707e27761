"""Cheap task types for tests and benchmarks, loaded through ``INGEST_EXTRA_HANDLERS``.

Each reads its knobs from the stream message (``seconds``, ``failures``, ``steps`` …).
``CALLS`` records, in this process, the order in which handlers began (in-process tests).
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import trio

from db.keys import Keys
from db.models import Chunk, now_ms
from db.streams import connect
from executor.context import TaskContext, TaskResult
from ingest.errors import PermanentError, RetryableError

CALLS: list[str] = []
_TRIES: Counter[tuple[str, int]] = Counter()

NAMES = (
    "noop",
    "sleep",
    "sleep_first_attempt",
    "fail",
    "permanent",
    "flaky",
    "hang",
    "progress",
    "kill_self",
    "chunks",
    "chunks_then_hang",
    "heartbeat_probe",
)
EXTRA_HANDLERS = ",".join(f"{name}=tests.handlers:{name}" for name in NAMES)


def _seconds(ctx: TaskContext, default: float) -> float:
    return float(ctx.message.get("seconds", default))


async def noop(ctx: TaskContext) -> None:
    CALLS.append(ctx.task_id)


async def sleep(ctx: TaskContext) -> None:
    CALLS.append(ctx.task_id)
    await trio.sleep(_seconds(ctx, 1.0))


async def sleep_first_attempt(ctx: TaskContext) -> None:
    """Long on the first attempt (to be handed back or killed), instant after."""
    CALLS.append(ctx.task_id)
    if ctx.attempt == 1:
        await trio.sleep(_seconds(ctx, 60.0))


async def fail(ctx: TaskContext) -> None:
    raise ValueError(ctx.message.get("error", "boom"))


async def permanent(ctx: TaskContext) -> None:
    raise PermanentError(ctx.message.get("error", "bad parameters"))


async def flaky(ctx: TaskContext) -> TaskResult:
    """Raises a retryable error on its first ``failures`` tries, then succeeds."""
    _TRIES[(ctx.task_id, ctx.attempt)] += 1
    tries = _TRIES[(ctx.task_id, ctx.attempt)]
    if tries <= int(ctx.message.get("failures", 2)):
        raise RetryableError(f"transient failure number {tries}")
    return TaskResult(message=f"succeeded on try {tries}")


async def hang(ctx: TaskContext) -> None:
    CALLS.append(ctx.task_id)
    await trio.sleep_forever()


async def progress(ctx: TaskContext) -> None:
    """Reports each fraction of ``steps`` with a line, ``pause`` seconds apart."""
    for n, fraction in enumerate(ctx.message.get("steps", [0.25, 0.5, 0.75])):
        ctx.progress(fraction, f"step {n} at {fraction}")
        await trio.sleep(float(ctx.message.get("pause", 0.05)))


async def kill_self(ctx: TaskContext) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _write_chunks(ctx: TaskContext, n: int) -> list[str]:
    rows: list[dict[str, Any]] = [
        {
            "id": f"{ctx.task_id[:24]}{i:08d}",
            "kb_id": ctx.row.get("kb_id") or "",
            "doc_id": ctx.row.get("doc_id") or "",
            "task_id": ctx.task_id,
            "generation": ctx.row.get("generation") or 0,
            "position": i,
            "content": f"chunk {i} of {ctx.task_id}",
            "token_num": 3,
            "create_time": now_ms(),
        }
        for i in range(n)
    ]
    Chunk.insert_many(rows).on_conflict_replace().execute()
    return [r["id"] for r in rows]


async def chunks(ctx: TaskContext) -> TaskResult:
    ids = await ctx.limiters.db(_write_chunks, ctx, int(ctx.message.get("chunks", 3)))
    return TaskResult(message=f"{len(ids)} chunks", chunk_ids=ids, extra={"chunks": len(ids)})


async def chunks_then_hang(ctx: TaskContext) -> None:
    await ctx.limiters.db(_write_chunks, ctx, int(ctx.message.get("chunks", 3)))
    ctx.progress(0.5, "chunks written")
    await trio.sleep_forever()


def _heartbeat_of(ctx: TaskContext) -> str:
    client = connect(ctx.settings)
    try:
        return client.get(Keys(ctx.settings.key_prefix).executor(ctx.consumer)) or "no heartbeat"
    finally:
        client.close()


async def heartbeat_probe(ctx: TaskContext) -> TaskResult:
    """Returns, as its message, the heartbeat its executor had written when the task ran."""
    return TaskResult(message=await trio.to_thread.run_sync(_heartbeat_of, ctx))
