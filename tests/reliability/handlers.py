"""Task types for the reliability tests: each completed run leaves a trace in the database.

``record`` sleeps ``seconds`` (``first_seconds`` on attempt 1, when given), then in one
transaction writes ``chunks`` chunk rows (ids from the task id and position, as the real
handlers make them) and a ``completion`` row keyed by
(task id, attempt): the completions of a task show every attempt whose handler finished, and
on which executor (a write retried after a lost commit counts a try, not a completion).
"""

from __future__ import annotations

import peewee
import trio

from db.database import database
from db.models import Chunk, now_ms
from executor.context import TaskContext, TaskResult
from tests.handlers import EXTRA_HANDLERS as BASE_HANDLERS

CREATE_COMPLETION = (
    "CREATE TABLE IF NOT EXISTS completion (task_id VARCHAR(64) NOT NULL, attempt INT NOT NULL,"
    " consumer VARCHAR(255) NOT NULL, at BIGINT NOT NULL, tries INT NOT NULL DEFAULT 1,"
    " PRIMARY KEY (task_id, attempt))"
)
EXTRA_HANDLERS = f"{BASE_HANDLERS},record=tests.reliability.handlers:record"


# The completion's upsert in each dialect: MariaDB's ON DUPLICATE KEY, SQLite's ON CONFLICT (the
# embedded default, INGEST_TEST_EMBEDDED=1).
_UPSERT_MYSQL = (
    "INSERT INTO completion (task_id, attempt, consumer, at) VALUES (%s, %s, %s, %s)"
    " ON DUPLICATE KEY UPDATE at = VALUES(at), tries = tries + 1"
)
_UPSERT_SQLITE = (
    "INSERT INTO completion (task_id, attempt, consumer, at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (task_id, attempt) DO UPDATE SET at = excluded.at, tries = tries + 1"
)


def _on_sqlite() -> bool:
    return isinstance(database.obj, peewee.SqliteDatabase)


def _complete(ctx: TaskContext, n: int) -> list[str]:
    rows = [
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
    if rows:
        Chunk.insert_many(rows).on_conflict_replace().execute()
    # Idempotent, as a handler's writes must be: a commit whose connection broke may have landed,
    # and the try that follows writes the same row again. A second run of one attempt on
    # another executor would show as a changed consumer.
    database.obj.execute_sql(
        _UPSERT_SQLITE if _on_sqlite() else _UPSERT_MYSQL, (ctx.task_id, ctx.attempt, ctx.consumer, now_ms())
    )
    return [r["id"] for r in rows]


async def record(ctx: TaskContext) -> TaskResult:
    """``seconds`` of work (``first_seconds`` instead on attempt 1, when given), then the trace."""
    seconds = ctx.message.get("first_seconds") if ctx.attempt == 1 else None
    await trio.sleep(float(seconds if seconds is not None else ctx.message.get("seconds", 0.1)))
    ids = await ctx.limiters.db(_complete, ctx, int(ctx.message.get("chunks", 2)))
    return TaskResult(message=f"{len(ids)} chunks", chunk_ids=ids)
