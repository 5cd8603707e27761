"""A document's state follows its current generation's tasks and chunks.

Whoever finishes a task (the executor's finisher, the producer when a digest is reused, a
cancel) calls :func:`recompute_documents` inside the same transaction, after
:func:`lock_documents`, so two finishers of one document never interleave.
"""

from __future__ import annotations

from collections.abc import Iterable

import peewee

from db.database import lock_for_update
from db.models import CANCELLED, DONE, QUEUED, RUNNING, TERMINAL_STATES, Chunk, Document, Task, now_ms
from ingest import vectors

DELETE_BATCH = 100  # chunk ids per DELETE: a short IN list stays a primary-key lookup, never a scan


def lock_documents(doc_ids: Iterable[str]) -> None:
    """``SELECT … FOR UPDATE`` the document rows, in id order (no deadlock between batches)."""
    ids = sorted(set(doc_ids))
    if ids:
        list(lock_for_update(Document.select(Document.id).where(Document.id.in_(ids))))


def document_run_state(statuses: list[str]) -> str:
    """``done`` when every task is done; when all are terminal, ``cancelled`` if every unfinished
    one was cancelled, else ``failed``; ``running`` while any runs; else ``queued``."""
    if not statuses:
        return QUEUED
    if all(s == DONE for s in statuses):
        return DONE
    if all(s in TERMINAL_STATES for s in statuses):
        rest = [s for s in statuses if s != DONE]
        return CANCELLED if all(s == CANCELLED for s in rest) else "failed"
    if any(s == RUNNING for s in statuses):
        return RUNNING
    return QUEUED


def recompute_documents(doc_ids: Iterable[str]) -> None:
    """Recompute run state, progress, chunk and token counts of each document.

    When a generation is done, chunks of that document's older generations are removed.
    Call inside a transaction that has locked the documents.

    What it costs (it runs at every task's end): the current generation's task rows, and no
    chunk row while the generation runs: ``chunk_num`` then counts the chunks its done tasks
    list. When the generation ends (done, failed, cancelled) the chunks are counted once, from
    the index on (doc_id, generation, token_num), and ``token_num`` with them. Older generations'
    chunks are looked up in that index without locks and deleted by primary key, only those.
    """
    for doc in Document.select().where(Document.id.in_(sorted(set(doc_ids)))):
        _recompute(doc)


def _listed_chunks() -> peewee.Expression:
    """How many chunk ids a task row lists (space-separated), counted in SQL."""
    ids = Task.chunk_ids
    spaces = peewee.fn.LENGTH(ids) - peewee.fn.LENGTH(peewee.fn.REPLACE(ids, " ", ""))
    return peewee.Case(None, [((ids.is_null()) | (ids == ""), 0)], spaces + 1)


def _recompute(doc: Document) -> None:
    tasks = list(
        Task.select(Task.status, Task.progress, Task.process_duration, _listed_chunks())
        .where((Task.doc_id == doc.id) & (Task.generation == doc.generation))
        .tuples()
    )
    statuses = [t[0] for t in tasks]
    run = document_run_state(statuses)
    if run == DONE:
        progress = 1.0
    elif run in TERMINAL_STATES or run == "failed":
        progress = -1.0
    else:
        progress = sum(max(0.0, t[1]) for t in tasks) / len(tasks) if tasks else 0.0
    if run in TERMINAL_STATES or run == "failed":
        chunk_num, token_num = _count_chunks(doc)
    else:  # running or queued: what its done tasks listed; tokens are counted at the end
        chunk_num, token_num = sum(int(t[3] or 0) for t in tasks if t[0] == DONE), doc.token_num
    if run == DONE:
        _delete_older_chunks(doc)
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    Document.update(
        run=run,
        progress=progress,
        chunk_num=int(chunk_num),
        token_num=int(token_num or 0),
        process_duration=sum(t[2] or 0.0 for t in tasks),
        progress_msg=f"{len(tasks)} task(s): {summary}",
        update_time=now_ms(),
    ).where(Document.id == doc.id).execute()


def _count_chunks(doc: Document) -> tuple[int, int]:
    """(chunks, tokens) of the document's current generation: a range of the covering index."""
    found = (
        Chunk.select(peewee.fn.COUNT(Chunk.id), peewee.fn.COALESCE(peewee.fn.SUM(Chunk.token_num), 0))
        .where((Chunk.doc_id == doc.id) & (Chunk.generation == doc.generation))
        .tuples()
        .get()
    )
    return int(found[0]), int(found[1] or 0)


def _delete_older_chunks(doc: Document) -> int:
    """Remove the chunks of the document's older generations, if it has any: found by a plain
    read of the index (no lock), deleted by primary key (a range DELETE would lock every index
    entry and gap it passes, and block other tasks' chunk writes)."""
    older = [
        cid
        for (cid,) in Chunk.select(Chunk.id)
        .where((Chunk.doc_id == doc.id) & (Chunk.generation < doc.generation))
        .tuples()
    ]
    for start in range(0, len(older), DELETE_BATCH):
        Chunk.delete().where(Chunk.id.in_(older[start : start + DELETE_BATCH])).execute()
    # From the engine at once, inside the caller's transaction: these chunks are of no current
    # generation, so no search misses them should the transaction roll back. An engine that
    # refuses now (unreachable for a moment) must not undo the transaction (a finisher's done
    # task would be written failed): logged, for ``ingest reindex``.
    vectors.forget_or_log(ids=older, what=f"document {doc.id}'s older generations'")
    return len(older)
