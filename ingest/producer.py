"""The producer: what application services call to enqueue work, and what ``ingest submit`` runs.

``submit_documents`` stores each document's bytes, then writes the knowledge base, document
and task rows in one transaction (a PDF split into page ranges, anything else one task), then
publishes one message per task that is not already done. Submitting a document again starts a
new generation: unfinished tasks of older ones are cancelled, and a task whose digest equals a
done task of the same document takes over that task's chunks instead of being parsed again.
``enqueue_tasks`` does rows-then-publish for tasks of any type. ``cancel``, ``retry``,
``remove_document`` and ``remove_kb`` (from :mod:`ingest.control`) change what is enqueued.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import orjson
import peewee
import redis

from db.bulk import bulk_insert_into_db
from db.config import Settings
from db.database import connection, init_database, lock_for_update, unit
from db.keys import check_tenant
from db.models import DONE, QUEUED, UNFINISHED_STATES, Document, KnowledgeBase, Task, now_ms
from db.streams import connect
from ingest import ids, tenants
from ingest.control import (
    cancel,
    cancel_task_rows,
    ended_rows,
    refresh_kb_counts,
    remove_document,
    remove_kb,
    retry,
    unfinished_task_ids,
)
from ingest.documents import recompute_documents
from ingest.errors import IdInUse, NotFound, PublishError, SubmitBusy, TenantQueueFull
from ingest.lines import line
from ingest.parser_config import DEFAULT_PARSER_CONFIG, document_config, new_kb_config
from ingest.pdfpages import PageCounter
from ingest.publish import MAX_PAYLOAD_BYTES, announce_ends, publish_messages, task_message
from ingest.reuse import apply_reuse
from ingest.sources import Refusal, Source, read_sources, source_names
from ingest.storage import Storage, location_for, open_storage

__all__ = [
    "DEFAULT_PARSER_CONFIG",
    "NotFound",
    "PublishError",
    "SubmitBusy",
    "SubmitResult",
    "SubmittedDocument",
    "cancel",
    "enqueue_tasks",
    "remove_document",
    "remove_kb",
    "retry",
    "submit_documents",
    "task_message",
]

log = logging.getLogger(__name__)

PRIORITIES = (0, 1)
NO_PAGE_LIMIT = 100000000  # to_page of a task that covers the whole document
BATCH = 1000
STORE_BATCH_BYTES = 16 << 20  # documents' bytes stored per storage call
STORE_BATCH_FILES = 256
MAX_KB_NAME_CHARS = 128
_DEADLOCK_CODES = (1213, 1205)  # deadlock, lock wait timeout
_DEADLOCK_TRIES = 8  # then SubmitBusy
_BACKOFF_BASE_S = 0.02  # full jitter: a wait in [0, min(max, base * 2**attempt))
_BACKOFF_MAX_S = 1.0


@dataclass(frozen=True)
class SubmittedDocument:
    id: str
    name: str
    origin: str  # the path (or name) the caller gave
    generation: int
    doc_type: str
    size: int
    page_count: int
    task_ids: list[str]
    reused: int  # tasks done at once by taking over an earlier generation's chunks


@dataclass(frozen=True)
class SubmitResult:
    kb_id: str
    kb_name: str
    documents: list[SubmittedDocument]
    refused: list[tuple[str, str]]  # (path or name, why)
    reused: int
    published: int
    cancelled: int  # unfinished tasks of older generations cancelled

    @property
    def task_ids(self) -> list[str]:
        return [t for d in self.documents for t in d.task_ids]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Staged:
    name: str
    origin: str
    doc_id: str
    size: int
    content_hash: str
    doc_type: str
    location: str
    page_count: int | None  # None: not a PDF, or its pages could not be counted


@dataclass
class _Plan:
    documents: list[SubmittedDocument]
    messages: list[dict[str, Any]]
    cancelled: list[str]
    cancelled_rows: list[dict[str, Any]]  # what their results need
    reused_rows: list[dict[str, Any]]  # tasks done at submit (digest reuse): their results too
    obsolete_locations: list[str]
    reused: int


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or priority not in PRIORITIES:
        raise ValueError(f"priority must be 0 (normal) or 1 (high), not {priority!r}")
    return int(priority)


def page_ranges(page_count: int | None, pages_per_task: int) -> list[tuple[int, int]]:
    """``[from_page, to_page)`` ranges, 0-based; one whole-document range without a page count."""
    if not page_count:
        return [(0, NO_PAGE_LIMIT)]
    return [
        (start, min(start + pages_per_task, page_count)) for start in range(0, page_count, pages_per_task)
    ]


def doc_type_of(name: str) -> str:
    return os.path.splitext(name)[1].lower().lstrip(".")[:16]


# -- submit ------------------------------------------------------------------------------


def submit_documents(
    settings: Settings,
    sources: Iterable[Source],
    kb_name: str,
    *,
    tenant_id: str = "default",
    priority: int = 0,
    parser_config: Mapping[str, Any] | None = None,
    dataflow_id: str | None = None,
    follow_links: bool = False,
) -> SubmitResult:
    """Enqueue documents into knowledge base ``kb_name`` (created when missing).

    ``sources`` are paths (a folder: the files under it, recursively) or ``(name, bytes)``
    pairs. Files that cannot be read, are empty or larger than ``max_doc_bytes`` are refused
    (listed in the result, not raised), and so are symbolic links out of a submitted folder, or
    named directly, unless ``follow_links`` (:mod:`ingest.sources`); the others are enqueued.
    Raises ``ValueError`` for a bad priority or name, :class:`PublishError` when Redis refuses
    after the rows are committed (the rows stay queued), a :class:`LimitExceeded` when a tenant's
    limit refuses the submission (nothing written) and :class:`SubmitBusy` when it kept losing
    deadlocks (retryable; nothing written).
    """
    check_priority(priority)
    check_tenant(tenant_id)
    if not kb_name or len(kb_name) > MAX_KB_NAME_CHARS:
        raise ValueError(f"a knowledge base name has 1 to {MAX_KB_NAME_CHARS} characters: {kb_name!r}")
    ids.kb_key(kb_name)  # refuses a name of spaces only
    init_database(settings.db_url)
    sources = list(sources)
    names = source_names(sources)
    tenants.check_documents(settings, tenant_id, len(names))
    kb = ids.kb_id(tenant_id, kb_name)
    limits = tenants.precheck_queue(settings, tenant_id, lambda: _new_documents(kb, names))
    if limits.max_queued:
        tenants.ensure_row(tenant_id)
    attempted: list[str] = []  # locations this call stored (or tried to)
    try:
        staged, refused = _stage(settings, sources, kb, attempted, follow_links)
    except Exception as exc:
        _delete_unreferenced(settings, attempted)
        if _is_deadlock(exc):
            raise SubmitBusy(f"storing the documents' bytes kept deadlocking: {exc}") from exc
        raise
    if not staged:
        return SubmitResult(kb, kb_name, [], refused, reused=0, published=0, cancelled=0)
    spec = _Spec(settings, kb, kb_name, tenant_id, priority, dict(parser_config or {}), dataflow_id, limits)
    try:
        plan = _write_with_retry(spec, staged)
    except Exception as exc:  # nothing was committed: the bytes this call stored that no row names go
        orphans = _delete_unreferenced(settings, attempted)
        if isinstance(exc, TenantQueueFull):
            exc.orphan_locations = orphans
        raise
    result = SubmitResult(
        kb_id=kb,
        kb_name=kb_name,
        documents=plan.documents,
        refused=refused,
        reused=plan.reused,
        published=0,
        cancelled=len(plan.cancelled),
    )
    try:
        published = publish_messages(
            settings, plan.messages, cancel_ids=plan.cancelled, ended=plan.cancelled_rows
        )
    except PublishError as exc:
        exc.result = result  # what was committed, for the caller
        raise
    finally:
        _delete_bytes(settings, plan.obsolete_locations)
        _announce_reused(settings, plan.reused_rows)
    return dataclasses.replace(result, published=published.sent)


def _announce_reused(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Tasks done at submit end as an executor's would: a result and a completion event each.
    Their rows are committed: a Redis that cannot take the announcement is logged, not raised
    (the row is the truth; ``ingest status`` and the task's page show it done)."""
    if not rows:
        return
    try:
        client = connect(settings)
        try:
            announce_ends(
                settings,
                client,
                rows,
                DONE,
                "",
                chunk_counts={r["id"]: len(r["chunk_ids"].split()) for r in rows},
            )
        finally:
            client.close()
    except redis.RedisError as exc:
        log.warning(
            "the results of %d task(s) done at submit (digest reuse) were not announced: %s", len(rows), exc
        )


def _new_documents(kb: str, names: Sequence[str]) -> int:
    """How many of ``names`` are not documents of ``kb`` yet: each adds a task at least (a
    document submitted again replaces its unfinished tasks, so it may add none)."""
    doc_ids = sorted({ids.doc_id(kb, n) for n in names})
    return len(doc_ids) - len(_existing_documents(doc_ids))


def _stage(
    settings: Settings,
    sources: Iterable[Source],
    kb: str,
    attempted: list[str],
    follow_links: bool = False,
) -> tuple[list[_Staged], list[tuple[str, str]]]:
    """Read each file, refuse what cannot be enqueued, and store the bytes of the rest (each
    location is added to ``attempted`` before it is stored). PDFs' pages are counted in a child
    process (one for the whole call): see :mod:`ingest.pdfpages`."""
    storage = open_storage(settings.storage_url)
    with PageCounter() as counter:
        return _stage_with(storage, counter, settings, sources, kb, attempted, follow_links)


def _put_many(storage: Storage, batch: list[tuple[str, bytes]], attempted: list[str]) -> None:
    """Store a batch; again after a deadlock (two submits of the same bytes replace the same
    parts; storing is idempotent)."""
    attempted.extend(loc for loc, _ in batch)
    for attempt in range(1, _DEADLOCK_TRIES + 1):
        try:
            storage.put_many(batch)
            return
        except peewee.DatabaseError as exc:
            if not _is_deadlock(exc) or attempt == _DEADLOCK_TRIES:
                raise
            time.sleep(_backoff_s(attempt))


def _stage_with(
    storage: Storage,
    counter: PageCounter,
    settings: Settings,
    sources: Iterable[Source],
    kb: str,
    attempted: list[str],
    follow_links: bool = False,
) -> tuple[list[_Staged], list[tuple[str, str]]]:
    staged: list[_Staged] = []
    refused: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    batch: list[tuple[str, bytes]] = []
    batch_bytes = 0
    for item in read_sources(sources, settings.max_doc_bytes, follow_links=follow_links):
        if isinstance(item, Refusal):
            refused.append((item.origin, item.reason))
            continue
        if item.name in seen:
            refused.append((item.origin, f"same document name {item.name!r} as {seen[item.name]}"))
            continue
        seen[item.name] = item.origin
        doc = ids.doc_id(kb, item.name)
        content = ids.content_hash(item.data)
        doc_type = doc_type_of(item.name)
        location = location_for(kb, doc, content)
        pages = counter.count(item.data) if doc_type == "pdf" else None
        if settings.max_pages and pages is not None and pages > settings.max_pages:
            refused.append(
                (
                    item.origin,
                    f"{pages} pages, more than the limit of {settings.max_pages} pages per document "
                    "(INGEST_MAX_PAGES)",
                )
            )
            continue
        staged.append(
            _Staged(item.name, item.origin, doc, len(item.data), content, doc_type, location, pages)
        )
        batch.append((location, item.data))
        batch_bytes += len(item.data)
        if batch_bytes >= STORE_BATCH_BYTES or len(batch) >= STORE_BATCH_FILES:
            _put_many(storage, batch, attempted)
            batch, batch_bytes = [], 0
    if batch:
        _put_many(storage, batch, attempted)
    return staged, refused


@dataclass(frozen=True)
class _Spec:
    settings: Settings
    kb_id: str
    kb_name: str
    tenant_id: str
    priority: int
    parser_config: dict[str, Any]
    dataflow_id: str | None
    limits: tenants.Limits

    @property
    def task_type(self) -> str:
        return "dataflow" if self.dataflow_id else "parse"

    @property
    def payload(self) -> dict[str, Any] | None:
        return {"dataflow_id": self.dataflow_id} if self.dataflow_id else None


def _is_deadlock(exc: BaseException | None) -> bool:
    # After a deadlock InnoDB has rolled the whole transaction back, so the savepoint rollback
    # of a nested unit() fails too: the deadlock may be the context of the error raised.
    seen = 0
    while exc is not None and seen < 5:
        args = getattr(exc, "args", ())
        if args and args[0] in _DEADLOCK_CODES:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _backoff_s(attempt: int) -> float:
    return random.uniform(0.0, min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2**attempt))  # noqa: S311 - backoff jitter, not a secret


class _KnowledgeBaseGone(Exception):
    """The knowledge base was removed between ensuring it and locking it: ensure it again."""


def _write_with_retry(spec: _Spec, staged: list[_Staged]) -> _Plan:
    """Ensure the knowledge base (its own statement), then write the rows in one transaction;
    again, after an exponential backoff with full jitter, when it lost a deadlock or a lock
    wait; :class:`SubmitBusy` after ``_DEADLOCK_TRIES`` tries."""
    last: BaseException | None = None
    for attempt in range(1, _DEADLOCK_TRIES + 1):
        try:
            _ensure_kb(spec)
            with unit():
                return _write_rows(spec, staged)
        except _KnowledgeBaseGone as exc:
            last = exc
        except peewee.DatabaseError as exc:
            if not _is_deadlock(exc):
                raise
            last = exc
            log.info("submit: %s, trying again (%d/%d)", exc, attempt, _DEADLOCK_TRIES)
        if attempt < _DEADLOCK_TRIES:
            time.sleep(_backoff_s(attempt))
    raise SubmitBusy(
        f"submit into knowledge base {spec.kb_name!r} lost to concurrent writers {_DEADLOCK_TRIES} times "
        f"({last}); nothing was kept, submit again"
    ) from last


def _write_rows(spec: _Spec, staged: list[_Staged]) -> _Plan:
    """One transaction: superseded tasks cancelled, task rows, document rows, counts; refused
    (rolled back) when the tenant's queue would pass its cap.

    Locks in one order, the same in every submit: the tenant's row (only with a queued cap),
    the knowledge base's row, the documents that exist (by primary key, id order), then their
    tasks, then chunks. A document that does not exist yet is not locked (a locking read of a
    missing key takes a gap lock that blocks other submits' inserts); no other submit can
    insert it meanwhile, since they all wait for the knowledge base's row first."""
    tenants.lock_queue(spec.tenant_id, spec.limits)
    kb_config = _lock_kb(spec)
    doc_config = document_config(kb_config, spec.parser_config)
    doc_ids = [s.doc_id for s in staged]
    existing = _lock_existing_documents(doc_ids)
    tasks_by_doc: dict[str, list[dict[str, Any]]] = {}
    incarnations: dict[str, str] = {}
    for s in staged:
        old = existing.get(s.doc_id)
        # A new document (also one of a removed document's name) is a new incarnation: its task
        # ids (and so its chunk ids) are never those of an earlier one's runs, which may still
        # be in flight and would otherwise match them, attempt for attempt.
        incarnations[s.doc_id] = old.incarnation if old is not None else ids.new_id()
        generation = old.generation + 1 if old is not None else 1
        tasks_by_doc[s.doc_id] = _task_rows(spec, s, generation, doc_config, incarnations[s.doc_id])
    cancelled = cancel_task_rows(  # tasks before chunks: the order finishers and chunk writes use
        unfinished_task_ids(list(existing)), "cancelled: the document was submitted again"
    )
    apply_reuse(list(existing), tasks_by_doc)
    all_tasks = [t for rows in tasks_by_doc.values() for t in rows]
    bulk_insert_into_db(Task, all_tasks, replace_on_conflict=True)
    try:
        tenants.check_queue(spec.tenant_id, spec.limits, sum(t["status"] == QUEUED for t in all_tasks))
    except TenantQueueFull as exc:  # the bytes stored for this call that no document keeps
        kept = {e.location for e in existing.values()}
        exc.orphan_locations = [s.location for s in staged if s.location not in kept]
        raise
    bulk_insert_into_db(
        Document,
        [_document_row(spec, s, tasks_by_doc[s.doc_id], doc_config, incarnations[s.doc_id]) for s in staged],
        True,
    )
    recompute_documents(sorted({t["doc_id"] for t in all_tasks if t["status"] == DONE}))
    refresh_kb_counts([spec.kb_id])
    documents = [
        SubmittedDocument(
            id=s.doc_id,
            name=s.name,
            origin=s.origin,
            generation=tasks_by_doc[s.doc_id][0]["generation"],
            doc_type=s.doc_type,
            size=s.size,
            page_count=s.page_count or 0,
            task_ids=[t["id"] for t in tasks_by_doc[s.doc_id]],
            reused=sum(t["status"] == DONE for t in tasks_by_doc[s.doc_id]),
        )
        for s in staged
    ]
    obsolete = [
        loc
        for doc, (_, loc, _) in existing.items()
        if loc and loc not in {s.location for s in staged if s.doc_id == doc}
    ]
    return _Plan(
        documents=documents,
        messages=[task_message(t) for t in all_tasks if t["status"] == QUEUED],
        cancelled=cancelled,
        cancelled_rows=ended_rows(cancelled),
        reused_rows=[t for t in all_tasks if t["status"] == DONE],
        obsolete_locations=obsolete,
        reused=sum(d.reused for d in documents),
    )


def _ensure_kb(spec: _Spec) -> None:
    """The knowledge base's row, in its own autocommit statement before the submit's
    transaction (an ``INSERT IGNORE`` of an existing row inside it takes a shared lock that the
    count update must then upgrade: two submits deadlock)."""
    with connection():
        if KnowledgeBase.select(KnowledgeBase.id).where(KnowledgeBase.id == spec.kb_id).exists():
            return
        now = now_ms()
        KnowledgeBase.insert(
            id=spec.kb_id,
            tenant_id=spec.tenant_id,
            name=spec.kb_name,
            parser_config=new_kb_config(spec.parser_config),
            create_time=now,
            update_time=now,
        ).on_conflict_ignore().execute()


def _lock_kb(spec: _Spec) -> dict[str, Any]:
    """``SELECT … FOR UPDATE`` the knowledge base's row; its parser config."""
    query = KnowledgeBase.select(KnowledgeBase.parser_config).where(KnowledgeBase.id == spec.kb_id)
    row = lock_for_update(query).tuples().first()
    if row is None:
        raise _KnowledgeBaseGone(spec.kb_id)
    return dict(row[0] or {})


class _Existing(NamedTuple):
    generation: int
    location: str
    incarnation: str  # "" for a document written before incarnations (task ids as they were)


def _lock_existing_documents(doc_ids: Sequence[str]) -> dict[str, _Existing]:
    """Lock the documents of ``doc_ids`` that exist, by primary key in id order (record locks
    only); what they hold as locked."""
    found = sorted(_existing_documents(doc_ids))
    locked: dict[str, _Existing] = {}
    for start in range(0, len(found), BATCH):
        batch = found[start : start + BATCH]
        query = Document.select(Document.id, Document.generation, Document.location, Document.incarnation)
        query = query.where(Document.id.in_(batch)).order_by(Document.id)
        for did, generation, location, incarnation in lock_for_update(query).tuples():
            locked[did] = _Existing(int(generation), location, incarnation or "")
    return locked


def _existing_documents(doc_ids: Sequence[str]) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    for start in range(0, len(doc_ids), BATCH):
        batch = doc_ids[start : start + BATCH]
        for did, generation, location in (
            Document.select(Document.id, Document.generation, Document.location)
            .where(Document.id.in_(batch))
            .tuples()
        ):
            found[did] = (int(generation), location)
    return found


def _task_rows(
    spec: _Spec, s: _Staged, generation: int, config: dict[str, Any], incarnation: str
) -> list[dict[str, Any]]:
    model = ids.embedding_identity(spec.settings.embedding_model, spec.settings.embedding_backend)
    rows = []
    for from_page, to_page in page_ranges(s.page_count, spec.settings.pages_per_task):
        rows.append(
            {
                "id": ids.task_id(s.doc_id, from_page, to_page, generation, incarnation),
                "doc_id": s.doc_id,
                "kb_id": spec.kb_id,
                "tenant_id": spec.tenant_id,
                "task_type": spec.task_type,
                "priority": spec.priority,
                "from_page": from_page,
                "to_page": to_page,
                "status": QUEUED,
                "progress": 0.0,
                "progress_msg": line(f"queued (generation {generation})"),
                "owner": "",
                "claim_token": "",
                "generation": generation,
                "handback_count": 0,
                "retry_count": 0,
                "digest": ids.digest(
                    s.content_hash,
                    model,
                    config,
                    from_page,
                    to_page,
                    task_type=spec.task_type,
                    dataflow_id=spec.dataflow_id,
                    max_chunk_chars=spec.settings.max_chunk_chars,
                ),
                "chunk_ids": "",
                "payload": spec.payload,
                "begin_at": None,
                "process_duration": 0.0,
                # no "attempt": an existing row keeps its count, so a stale run stays fenced out
            }
        )
    return rows


def _document_row(
    spec: _Spec, s: _Staged, tasks: list[dict[str, Any]], config: dict[str, Any], incarnation: str
) -> dict[str, Any]:
    n = len(tasks)
    return {
        "id": s.doc_id,
        "kb_id": spec.kb_id,
        "tenant_id": spec.tenant_id,
        "name": s.name,
        "doc_type": s.doc_type,
        "size": s.size,
        "content_hash": s.content_hash,
        "location": s.location,
        "page_count": s.page_count or 0,
        "parser_config": config,
        "generation": tasks[0]["generation"],
        "incarnation": incarnation,
        "run": QUEUED,
        "progress": 0.0,
        "progress_msg": f"{n} task(s): {n} queued",
        "chunk_num": 0,
        "token_num": 0,
        "process_duration": 0.0,
    }


def _delete_unreferenced(settings: Settings, locations: Sequence[str]) -> list[str]:
    """Remove the bytes at ``locations`` that no document row names (what a failed call had
    stored); returns those locations. Best effort: a failure here leaves bytes, not a row
    without them."""
    wanted = sorted(set(locations))
    if not wanted:
        return []
    try:
        with connection():
            named = {
                loc
                for start in range(0, len(wanted), BATCH)
                for (loc,) in Document.select(Document.location)
                .where(Document.location.in_(wanted[start : start + BATCH]))
                .tuples()
            }
    except peewee.DatabaseError:
        log.warning("submit failed, and its stored bytes could not be checked; left in place")
        return []
    orphans = [loc for loc in wanted if loc not in named]
    _delete_bytes(settings, orphans)
    return orphans


def _delete_bytes(settings: Settings, locations: list[str]) -> None:
    """Remove the bytes of superseded contents; best effort (the rows no longer name them)."""
    if not locations:
        return
    storage = open_storage(settings.storage_url)
    for location in locations:
        with contextlib.suppress(Exception):
            storage.delete(location)


# -- tasks of any type -------------------------------------------------------------------

_TASK_COLUMNS = frozenset(
    {
        "id",
        "doc_id",
        "kb_id",
        "tenant_id",
        "task_type",
        "priority",
        "from_page",
        "to_page",
        "generation",
        "digest",
        "payload",
    }
)


# A task's own fields (its row's payload, re-sent in its message): a memory message of a
# million characters fits; the database's packet (16 MiB by default) and Redis's memory bound it.


def enqueue_tasks(settings: Settings, tasks: Sequence[Mapping[str, Any]]) -> list[str]:
    """Write one queued row per task, then publish one message each; returns the task ids.

    Each task is a dict of task columns (``id``, ``doc_id``, ``kb_id``, ``tenant_id``,
    ``task_type``, ``priority``, ``from_page``, ``to_page``, ``generation``, ``digest``);
    any other key is the type's own message context (e.g. ``memory_id``, ``message_dict``), kept
    in the row's ``payload`` so a re-publish rebuilds the same message. A ``payload`` mapping
    given is that context too, merged (not nested; a key given beside it wins). Without an ``id`` a
    random one is given. A task whose id names an unfinished row is left as it is (its message
    is published only if it has no live one).
    """
    init_database(settings.db_url)
    rows: list[dict[str, Any]] = []
    given: list[str] = []
    for task in tasks:
        context = task.get("payload")
        if context is not None and not isinstance(context, Mapping):
            raise ValueError(f"a task's payload is a mapping of message fields, not {type(context).__name__}")
        extras = {k: v for k, v in task.items() if k not in _TASK_COLUMNS}
        payload = {**(context or {}), **extras} or None
        _check_payload(payload)
        if task.get("id"):
            given.append(str(task["id"]))
        rows.append(
            {
                "id": str(task.get("id") or ids.new_id()),
                "doc_id": task.get("doc_id") or "",
                "kb_id": task.get("kb_id") or "",
                "tenant_id": task.get("tenant_id") or "default",
                "task_type": task.get("task_type") or "parse",
                "priority": check_priority(task.get("priority", 0)),
                "from_page": int(task.get("from_page", 0)),
                "to_page": int(task.get("to_page", NO_PAGE_LIMIT)),
                "generation": int(task.get("generation", 0)),
                "digest": task.get("digest") or "",
                "payload": payload,
                "status": QUEUED,
                "progress": 0.0,
                "progress_msg": line("queued"),
                "owner": "",
                "claim_token": "",
                "chunk_ids": "",
                "begin_at": None,
                "process_duration": 0.0,
            }
        )
    if len({r["id"] for r in rows}) != len(rows):
        raise ValueError("enqueue_tasks was given the same task id twice")
    by_tenant: dict[str, list[str]] = {}
    for r in rows:
        check_tenant(r["tenant_id"])
        by_tenant.setdefault(r["tenant_id"], []).append(r["id"])
    given_set = set(given)

    def adding(task_ids: list[str]) -> int:  # a task already unfinished is left as it is
        return len(task_ids) - len(_unfinished_ids([i for i in task_ids if i in given_set]))

    limits = {
        t: tenants.precheck_queue(settings, t, functools.partial(adding, task_ids))
        for t, task_ids in sorted(by_tenant.items())
    }
    for t, lim in limits.items():
        if lim.max_queued:
            tenants.ensure_row(t)
    with unit():
        for t in sorted(limits):
            tenants.lock_queue(t, limits[t])
        _check_owned(rows, given_set)
        live = _unfinished_ids(given)
        fresh = [r for r in rows if r["id"] not in live]
        bulk_insert_into_db(Task, fresh, replace_on_conflict=True)
        for t in sorted(limits):
            tenants.check_queue(t, limits[t], sum(r["tenant_id"] == t for r in fresh))
    publish_messages(settings, [task_message(r) for r in rows])
    return [r["id"] for r in rows]


def _check_payload(payload: dict[str, Any] | None) -> None:
    """A payload the row and the message can carry: JSON (orjson's: integers of 64 bits) of at
    most :data:`MAX_PAYLOAD_BYTES`; else ``ValueError`` (HTTP 422) before anything is written."""
    if payload is None:
        return
    try:
        size = len(orjson.dumps(payload))
    except TypeError as exc:  # orjson.JSONEncodeError
        raise ValueError(f"a task's fields must be JSON: {exc}") from None
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"a task's fields take {size} bytes as JSON, over the {MAX_PAYLOAD_BYTES} allowed")


def _check_owned(rows: list[dict[str, Any]], given: set[str]) -> None:
    """A task may take neither an id another tenant's task has (:class:`IdInUse`) nor a document
    or knowledge base that is not its tenant's (:class:`NotFound`, as if it did not exist): one
    that does not exist yet is refused too (document ids are derived from names, so a task could
    wait for another tenant's next document and count in its state). Tenants compared exactly, in
    Python (whatever the database's collation)."""
    for model, column, key, what in (
        (Task, Task.id, "id", None),
        (Document, Document.id, "doc_id", "document"),
        (KnowledgeBase, KnowledgeBase.id, "kb_id", "knowledge base"),
    ):
        wanted: dict[str, set[str]] = {}
        for r in rows:
            if r[key] and (key != "id" or r["id"] in given):
                wanted.setdefault(r[key], set()).add(r["tenant_id"])
        names = sorted(wanted)
        found: dict[str, str] = {}
        for start in range(0, len(names), BATCH):
            query = model.select(column, model.tenant_id).where(column.in_(names[start : start + BATCH]))
            found.update(query.tuples())
        for name in names:
            owner = found.get(name)
            if what is None:
                if owner is not None and any(t != owner for t in wanted[name]):
                    raise IdInUse(f"task id {name!r} is already in use; leave id out to get a fresh one")
            elif owner is None or any(t != owner for t in wanted[name]):
                raise NotFound(f"no such {what}: {name!r}")


def _unfinished_ids(task_ids: list[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(task_ids), BATCH):
        batch = task_ids[start : start + BATCH]
        found.update(
            t
            for (t,) in Task.select(Task.id)
            .where(Task.id.in_(batch) & Task.status.in_(UNFINISHED_STATES))
            .tuples()
        )
    return found
