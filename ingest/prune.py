"""Prune: finished task rows past their retention, and the progress text of the rows kept.

``ingest prune --older-than D`` (and the reconciler, every hour, with ``INGEST_TASK_RETENTION_S``)
looks only at terminal rows whose ``update_time`` (when they ended) is older than the cutoff,
through the task table's (status, update_time) index:

- rows of a superseded generation (their document has moved on), and rows that belong to no
  document (memory saves, ``enqueue_tasks`` work), are deleted, with the chunks they wrote that
  no later generation took over (a reused chunk keeps its id and task but moves generation);
- the rows kept (a document's current generation, which its state, ``ingest retry`` and digest
  reuse read; ``dead`` rows, which ``dead replay`` needs) keep only the last line of their
  progress text.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import peewee

from db.config import Settings
from db.database import init_database, unit
from db.models import DEAD, TERMINAL_STATES, Chunk, Document, Task, now_ms
from ingest import vectors

BATCH = 1000
REMOVABLE_STATES = tuple(s for s in TERMINAL_STATES if s != DEAD)  # a dead row backs its dead letter


@dataclass(frozen=True)
class PruneResult:
    cutoff_ms: int  # rows that ended before this were looked at
    tasks_removed: int
    chunks_removed: int
    progress_trimmed: int  # rows kept whose progress text was cut to its last line

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prune_tasks(settings: Settings, older_than_s: float, *, now: int | None = None) -> PruneResult:
    """Prune finished tasks that ended more than ``older_than_s`` seconds ago (see above)."""
    if older_than_s <= 0:
        raise ValueError(f"--older-than must be a positive duration, not {older_than_s}")
    init_database(settings.db_url)
    vectors.use(settings)
    cutoff = (now if now is not None else now_ms()) - int(older_than_s * 1000)
    tasks = chunks = 0
    while True:
        selected, removed, chunks_gone = _remove_batch(cutoff)
        tasks, chunks = tasks + removed, chunks + chunks_gone
        if selected < BATCH:  # not ``removed``: rows a retry re-queued meanwhile are kept
            break
    return PruneResult(cutoff, tasks, chunks, _trim_progress(cutoff))


def _remove_batch(cutoff: int) -> tuple[int, int, int]:
    """One transaction: up to BATCH removable rows, then the chunks only they held. Returns
    (rows found, rows removed, chunks removed): fewer found than BATCH means no more to find.

    The rows are found without a lock, so the delete repeats the state and age condition: a
    row re-queued in between (``ingest retry`` commits, then publishes) is no longer finished
    and stays, with its chunks; only the chunks of rows this delete removed go. (A superseded
    generation stays superseded, so the document condition needs no repeating.)"""
    with unit():
        rows = list(
            Task.select(Task.id, Task.generation)
            .join(Document, peewee.JOIN.LEFT_OUTER, on=(Task.doc_id == Document.id))
            .where(
                _finished_before(cutoff) & (Document.id.is_null() | (Task.generation < Document.generation))
            )
            .limit(BATCH)
            .tuples()
        )
        if not rows:
            return 0, 0, 0
        ids = [tid for tid, _ in rows]
        removed = Task.delete().where(Task.id.in_(ids) & _finished_before(cutoff)).execute()
        kept = (
            {tid for (tid,) in Task.select(Task.id).where(Task.id.in_(ids)).tuples()}
            if removed < len(ids)
            else set()
        )
        by_generation: dict[int, list[str]] = defaultdict(list)
        for tid, generation in rows:
            if tid not in kept:
                by_generation[int(generation)].append(tid)
        gone: list[str] = []
        for generation, of_rows in sorted(by_generation.items()):
            held = Chunk.select(Chunk.id).where(Chunk.task_id.in_(of_rows) & (Chunk.generation == generation))
            gone += [cid for (cid,) in held.tuples()]
        for start in range(0, len(gone), BATCH):
            Chunk.delete().where(Chunk.id.in_(gone[start : start + BATCH])).execute()
    vectors.forget_or_log(ids=gone, what="pruned tasks'")  # rows first, then the engine
    return len(rows), int(removed), len(gone)


def _finished_before(cutoff: int) -> peewee.Expression:
    """A removable row: finished (not dead) before ``cutoff``."""
    return Task.status.in_(REMOVABLE_STATES) & (Task.update_time < cutoff)


def _trim_progress(cutoff: int) -> int:
    """Cut the progress text of old terminal rows to its last line, BATCH rows a transaction:
    per state, a keyset walk in (update_time, id) order along the (status, update_time) index."""
    several_lines = Task.progress_msg % "%\n%\n%"  # two line ends: more than one line
    trimmed = 0
    for status in TERMINAL_STATES:
        after: tuple[int, str] | None = None
        while True:
            where = (Task.status == status) & (Task.update_time < cutoff) & several_lines
            if after is not None:
                where &= (Task.update_time > after[0]) | (
                    (Task.update_time == after[0]) & (Task.id > after[1])
                )
            with unit():
                rows = list(
                    Task.select(Task.id, Task.update_time, Task.progress_msg)
                    .where(where)
                    .order_by(Task.update_time, Task.id)
                    .limit(BATCH)
                    .tuples()
                )
                for tid, _, text in rows:
                    if (text or "").count("\n") >= 2:
                        Task.update(progress_msg=_last_line(text)).where(Task.id == tid).execute()
                        trimmed += 1
            if len(rows) < BATCH:
                break
            after = (rows[-1][1], rows[-1][0])
    return trimmed


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return f"{lines[-1]}\n" if lines else ""
