"""Putting finished tasks back in the queue: the one row re-queue that ``retry`` and ``dead
replay`` share (LIFECYCLE: "a later attempt ... is never stopped by an older cancel").

A re-queued row is ``queued`` with its progress, owner, chunk list and timings reset and its
hand-back count back to 0 (a task dead from hand-backs would otherwise be buried again at once);
its attempt is kept, so a stale run of it stays fenced out. The caller commits the rows, then
publishes them with ``requeue=True`` (``ingest.publish.publish_messages``), which is safe
against the finisher acking the task's previous entry at the same moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from db.database import lock_for_update
from db.models import QUEUED, Task, now_ms
from ingest.lines import appended
from ingest.publish import MESSAGE_COLUMNS

BATCH = 1000


def _batches(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), BATCH):
        yield items[start : start + BATCH]


def requeue_rows(
    task_ids: Sequence[str],
    states: Sequence[str],
    line: Callable[[str], str],
    *,
    retried: bool,
) -> list[dict[str, Any]]:
    """Inside a transaction, with the tasks' documents locked first: those of ``task_ids``
    still in one of ``states`` (locking reads) → queued, each with ``line(task id)`` on its
    progress; ``retried`` counts a retry. Returns the re-queued rows' message fields."""
    rows: list[dict[str, Any]] = []
    for batch in _batches(sorted(set(task_ids))):
        live = [
            tid
            for (tid,) in lock_for_update(
                Task.select(Task.id).where(Task.id.in_(batch) & Task.status.in_(list(states)))
            ).tuples()
        ]
        now = now_ms()
        for tid in live:
            changes: dict[Any, Any] = {
                Task.status: QUEUED,
                Task.progress: 0.0,
                Task.owner: "",
                Task.handback_count: 0,
                Task.chunk_ids: "",
                Task.begin_at: None,
                Task.process_duration: 0.0,
                Task.progress_msg: appended(Task.progress_msg, line(tid)),
                Task.update_time: now,
            }
            if retried:
                changes[Task.retry_count] = Task.retry_count + 1
            Task.update(changes).where((Task.id == tid) & Task.status.in_(list(states))).execute()
        if live:
            rows += list(Task.select(*MESSAGE_COLUMNS).where(Task.id.in_(live)).dicts())
    return rows
