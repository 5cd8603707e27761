"""Changing work already enqueued: cancel, retry, remove a document or a knowledge base.

Rows first, then Redis (``LIFECYCLE.md``, "Cancel, strikes, chunks"): a cancel sets the rows
``cancelled`` and then sets the tasks' ``cancel:{task}`` keys, so a running copy stops; a retry
sets failed, dead or cancelled rows ``queued`` and then publishes them afresh. Document rows
are locked (id order) before their tasks' rows, the order every finisher uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import peewee

from db.config import Settings
from db.database import init_database, lock_for_update, unit
from db.models import (
    CANCELLED,
    DEAD,
    FAILED,
    UNFINISHED_STATES,
    Chunk,
    Document,
    KnowledgeBase,
    Task,
    now_ms,
)
from ingest import ids, tenants, vectors
from ingest.documents import lock_documents, recompute_documents
from ingest.errors import NotFound
from ingest.lines import appended
from ingest.publish import publish_messages, send_cancels, task_message
from ingest.requeue import requeue_rows
from ingest.storage import open_storage

BATCH = 1000
RETRYABLE_STATES = (FAILED, DEAD, CANCELLED)


def _batches(items: Sequence[Any], size: int = BATCH) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class CancelResult:
    target: str  # "task" or "document"
    task_ids: list[str]  # tasks this call cancelled (unfinished before it)
    doc_ids: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RetryResult:
    task_ids: list[str]  # tasks set queued again
    published: int  # new stream entries (the rest still had a live one)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (id, why not retried)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RemoveResult:
    kb_id: str | None  # the knowledge base removed, for ``remove_kb``
    doc_ids: list[str]
    tasks_removed: int
    chunks_removed: int
    cancelled: list[str]  # unfinished tasks whose running copies were told to stop

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- rows --------------------------------------------------------------------------------


def cancel_task_rows(task_ids: Sequence[str], why: str) -> list[str]:
    """Set the unfinished ones of ``task_ids`` cancelled (progress -1, a line); return them.

    Call inside a transaction, after locking their documents.
    """
    done: list[str] = []
    for batch in _batches(sorted(set(task_ids))):
        live = [
            tid
            for (tid,) in lock_for_update(
                Task.select(Task.id).where(Task.id.in_(batch) & Task.status.in_(UNFINISHED_STATES))
            ).tuples()
        ]
        if live:
            Task.update(
                status=CANCELLED,
                progress=-1.0,
                progress_msg=appended(Task.progress_msg, why),
                update_time=now_ms(),
            ).where(Task.id.in_(live)).execute()
        done += live
    return done


def unfinished_task_ids(doc_ids: Sequence[str]) -> list[str]:
    out: list[str] = []
    for batch in _batches(list(doc_ids)):
        out += [
            tid
            for (tid,) in Task.select(Task.id)
            .where(Task.doc_id.in_(batch) & Task.status.in_(UNFINISHED_STATES))
            .tuples()
        ]
    return out


def refresh_kb_counts(kb_ids: Iterable[str]) -> None:
    """A knowledge base's document, chunk and token counts, from its documents' rows."""
    for kb in sorted(set(kb_ids)):
        docs, chunks, tokens = (
            Document.select(
                peewee.fn.COUNT(Document.id),
                peewee.fn.COALESCE(peewee.fn.SUM(Document.chunk_num), 0),
                peewee.fn.COALESCE(peewee.fn.SUM(Document.token_num), 0),
            )
            .where(Document.kb_id == kb)
            .tuples()
            .get()
        )
        KnowledgeBase.update(
            doc_num=int(docs), chunk_num=int(chunks), token_num=int(tokens), update_time=now_ms()
        ).where(KnowledgeBase.id == kb).execute()


# -- cancel ------------------------------------------------------------------------------


def ended_rows(task_ids: Sequence[str]) -> list[dict[str, Any]]:
    """What a result needs of rows just made terminal (id, document, tenant, type)."""
    rows: list[dict[str, Any]] = []
    for batch in _batches(list(task_ids)):
        rows += list(
            Task.select(Task.id, Task.doc_id, Task.tenant_id, Task.task_type, Task.attempt)
            .where(Task.id.in_(batch))
            .dicts()
        )
    return rows


def _task_or_document(id_: str, tenant_id: str | None) -> tuple[Task | None, Document | None]:
    """The task or document ``id_`` names; another tenant's reads as absent (``NotFound``)."""
    task = Task.get_or_none(Task.id == id_)
    if task is not None and (tenant_id is None or task.tenant_id == tenant_id):
        return task, None
    doc = Document.get_or_none(Document.id == id_)
    if doc is not None and (tenant_id is None or doc.tenant_id == tenant_id):
        return None, doc
    raise NotFound(f"no task or document with id {id_!r}")


def cancel(settings: Settings, id_: str, *, tenant_id: str | None = None) -> CancelResult:
    """Cancel a task, or every unfinished task of a document: rows first, then cancel keys (and
    each cancelled task's result). With ``tenant_id``, only that tenant's task or document."""
    init_database(settings.db_url)
    vectors.use(settings)
    with unit():  # which rows, read apart: the write below locks its documents before it reads
        task, doc = _task_or_document(id_, tenant_id)
    if task is not None:
        target, doc_ids = "task", [task.doc_id] if task.doc_id else []
    else:
        assert doc is not None
        target, doc_ids = "document", [doc.id]
    with unit():
        lock_documents(doc_ids)
        candidates = [task.id] if task is not None else unfinished_task_ids(doc_ids)
        cancelled = cancel_task_rows(candidates, "cancelled by request")
        recompute_documents(doc_ids)
        ended = ended_rows(cancelled)
    send_cancels(settings, cancelled, ended)
    return CancelResult(target=target, task_ids=cancelled, doc_ids=doc_ids)


# -- retry -------------------------------------------------------------------------------


def retry(
    settings: Settings, id_: str | None = None, *, failed: bool = False, tenant_id: str | None = None
) -> RetryResult:
    """Re-queue failed, dead or cancelled tasks (a task, a document's current generation, or
    with ``failed=True`` every failed or dead task of a current generation), then publish them.
    With ``tenant_id``, only that tenant's task or document (another's reads as not found), and
    held to its queued cap as a submit is (:class:`TenantQueueFull`, nothing re-queued); an
    operator's retry (no ``tenant_id``) is not."""
    if (id_ is None) == (not failed):
        raise ValueError("retry takes a task or document id, or failed=True, not both")
    init_database(settings.db_url)
    skipped: list[tuple[str, str]] = []
    with unit():  # which rows, read apart: the write below locks its documents before it reads
        if failed:
            candidates = _failed_of_current_generations()
        else:
            assert id_ is not None
            candidates = _retry_candidates(id_, skipped, tenant_id)
        doc_ids = sorted({d for _, d in candidates if d})
    cap: tuple[str, tenants.Limits] | None = None
    if tenant_id is not None and candidates:
        cap = (tenant_id, tenants.precheck_queue(settings, tenant_id, lambda: len(candidates)))
        if cap[1].max_queued:
            tenants.ensure_row(tenant_id)
    with unit():
        if cap is not None:
            tenants.lock_queue(*cap)  # first, as a submit takes it
        lock_documents(doc_ids)
        rows = requeue_rows(
            [tid for tid, _ in candidates], RETRYABLE_STATES, lambda _: "re-queued by retry", retried=True
        )
        if cap is not None:
            tenants.check_queue(*cap, len(rows))
        recompute_documents(doc_ids)
    published = publish_messages(settings, [task_message(r) for r in rows], requeue=True)
    return RetryResult(task_ids=[r["id"] for r in rows], published=published.sent, skipped=skipped)


def _retry_candidates(
    id_: str, skipped: list[tuple[str, str]], tenant_id: str | None = None
) -> list[tuple[str, str]]:
    task, doc = _task_or_document(id_, tenant_id)
    if task is not None:
        why = _why_not_retryable(task)
        if why:
            skipped.append((id_, why))
            return []
        return [(task.id, task.doc_id)]
    assert doc is not None
    found = list(
        Task.select(Task.id, Task.doc_id)
        .where(
            (Task.doc_id == doc.id) & (Task.generation == doc.generation) & Task.status.in_(RETRYABLE_STATES)
        )
        .tuples()
    )
    if not found:
        skipped.append(
            (id_, f"no failed, dead or cancelled task in its current generation (document is {doc.run})")
        )
    return found


def _why_not_retryable(task: Task) -> str:
    if task.status not in RETRYABLE_STATES:
        return f"task is {task.status}; only failed, dead or cancelled tasks are retried"
    if task.doc_id:
        doc = Document.get_or_none(Document.id == task.doc_id)
        if doc is not None and doc.generation != task.generation:
            return (
                f"task belongs to generation {task.generation} but its document is at generation "
                f"{doc.generation}; retry the document or submit it again"
            )
    return ""


def _failed_of_current_generations() -> list[tuple[str, str]]:
    query = (
        Task.select(Task.id, Task.doc_id)
        .join(Document, peewee.JOIN.LEFT_OUTER, on=(Task.doc_id == Document.id))
        .where(
            Task.status.in_((FAILED, DEAD))
            & (Document.id.is_null() | (Task.generation == Document.generation))
        )
    )
    return list(query.tuples())


# -- remove ------------------------------------------------------------------------------


def remove_document(settings: Settings, doc_id: str) -> RemoveResult:
    """Remove a document: cancel its unfinished tasks, delete its tasks, chunks, row and bytes."""
    init_database(settings.db_url)
    vectors.use(settings)
    with unit():
        doc = Document.get_or_none(Document.id == doc_id)
        if doc is None:
            raise NotFound(f"no document with id {doc_id!r}")
        _lock_kb(doc.kb_id)  # the knowledge base before its documents, as every submit locks them
        query = Document.select(Document.id).where(Document.id == doc_id)
        if lock_for_update(query).tuples().first() is None:
            raise NotFound(f"no document with id {doc_id!r}")
        result, locations = _remove_docs([doc.id], kb_id=None)
        refresh_kb_counts([doc.kb_id])
    _after_remove(settings, result, locations, result.cancelled)
    return result


def remove_kb(settings: Settings, kb_name: str, *, tenant_id: str = "default") -> RemoveResult:
    """Remove a knowledge base with all its documents, tasks, chunks and bytes.

    In batches of ``BATCH`` documents, each its own transaction (knowledge base row locked
    first, as submits lock it) followed by its bytes and cancels; the last transaction removes
    what belongs to no document, then its vectors go from the engine, then its row. Stopped
    half way (or refused by the engine), the knowledge base stands with the documents not yet
    removed, each whole: ``rm --kb`` again finishes."""
    init_database(settings.db_url)
    vectors.use(settings)
    kb = ids.kb_id(tenant_id, kb_name)
    with unit():
        if not _lock_kb(kb):
            raise NotFound(f"no knowledge base {kb_name!r} (tenant {tenant_id!r})")
    doc_ids: list[str] = []
    cancelled: list[str] = []
    tasks = chunks = 0
    while True:
        with unit():
            if not _lock_kb(kb):  # another rm finished it meanwhile
                break
            batch = [
                d
                for (d,) in Document.select(Document.id)
                .where(Document.kb_id == kb)
                .order_by(Document.id)
                .limit(BATCH)
                .tuples()
            ]
            part, locations = _remove_docs(batch, kb_id=None if batch else kb)
            if batch:
                refresh_kb_counts([kb])
        _after_remove(settings, part, locations, part.cancelled, forget=bool(batch))
        doc_ids += part.doc_ids
        cancelled += part.cancelled
        tasks, chunks = tasks + part.tasks_removed, chunks + part.chunks_removed
        if batch:
            continue
        # Nothing of it is left but its row: its vectors go first. An engine that refuses
        # raises here and the row stays, so ``rm --kb`` again finishes the removal (reindex and
        # ``ingest status`` walk the rows: vectors of a row gone would be found by nothing).
        vectors.forget(kb_id=kb)
        with unit():
            if not _lock_kb(kb):
                break
            if not Document.select().where(Document.kb_id == kb).exists():  # no submit meanwhile
                KnowledgeBase.delete().where(KnowledgeBase.id == kb).execute()
                break
    return RemoveResult(
        kb_id=kb, doc_ids=doc_ids, tasks_removed=tasks, chunks_removed=chunks, cancelled=cancelled
    )


def _lock_kb(kb_id: str) -> bool:
    """``SELECT … FOR UPDATE`` a knowledge base's row (first: the order submits lock in)."""
    query = KnowledgeBase.select(KnowledgeBase.id).where(KnowledgeBase.id == kb_id)
    return lock_for_update(query).tuples().first() is not None


def _remove_docs(doc_ids: list[str], *, kb_id: str | None) -> tuple[RemoveResult, list[str]]:
    doc_ids = sorted(set(doc_ids))
    for batch in _batches(doc_ids, BATCH):  # id order across batches too
        lock_documents(batch)
    locations = [
        loc
        for batch in _batches(doc_ids)
        for (loc,) in Document.select(Document.location).where(Document.id.in_(batch)).tuples()
        if loc
    ]
    unfinished = unfinished_task_ids(doc_ids)
    if kb_id is not None:  # tasks of the knowledge base that belong to no document (dataflow runs)
        unfinished += [
            t
            for (t,) in Task.select(Task.id)
            .where((Task.kb_id == kb_id) & Task.status.in_(UNFINISHED_STATES))
            .tuples()
        ]
    cancelled = cancel_task_rows(unfinished, "cancelled: its document was removed")
    tasks = chunks = 0
    for batch in _batches(doc_ids):
        chunks += Chunk.delete().where(Chunk.doc_id.in_(batch)).execute()
        tasks += Task.delete().where(Task.doc_id.in_(batch)).execute()
        Document.delete().where(Document.id.in_(batch)).execute()
    if kb_id is not None:
        chunks += Chunk.delete().where(Chunk.kb_id == kb_id).execute()
        tasks += Task.delete().where(Task.kb_id == kb_id).execute()
    result = RemoveResult(
        kb_id=kb_id, doc_ids=list(doc_ids), tasks_removed=tasks, chunks_removed=chunks, cancelled=cancelled
    )
    return result, locations


def _after_remove(
    settings: Settings,
    result: RemoveResult,
    locations: list[str],
    cancelled: list[str],
    *,
    forget: bool = True,
) -> None:
    """After the rows' commit: the engine's vectors (``forget``; an engine that refuses keeps
    them for ``ingest reindex`` of their knowledge base, logged: the rows are the record), the
    bytes, the cancel keys."""
    if forget:
        vectors.forget_or_log(doc_ids=result.doc_ids, kb_id=result.kb_id, what="removed documents'")
    storage = open_storage(settings.storage_url)
    for location in locations:
        storage.delete(location)
    send_cancels(settings, cancelled)
