"""What the dashboard's pages show, read from the database and Redis (blocking: call in a thread).

Lists of documents and tasks are pages of :data:`PAGE_ROWS`, newest first, by a keyset cursor
``(create_time, id)`` on the ``(kb_id|tenant_id, create_time)`` indexes: a page after the
cursor reads as fast in a knowledge base of 100,000 documents as in one of 10 (never OFFSET,
never a count of the whole set).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee
import redis

from db.config import Settings
from db.database import connection, init_database
from db.gate import Gate
from db.keys import PRIORITIES, Keys
from db.models import Document, KnowledgeBase, Task
from ingest.status import STALE_PERIODS, fleet, health_text
from ingest.tenants import standings

PAGE_ROWS = 50
KBS_SHOWN = 500
MESSAGE_LINES = 3
_CURSOR = re.compile(r"^(\d{1,16})_([A-Za-z0-9_-]{1,64})$")
DOCUMENT_STATES = ("queued", "running", "done", "failed", "cancelled")
TASK_STATES = ("queued", "running", "done", "failed", "cancelled", "held", "dead")


@dataclass(frozen=True)
class Filters:
    """A list's filters as the page's query string gives them (already checked)."""

    tenant: str | None = None
    kb: str | None = None  # a knowledge base id
    state: str | None = None
    doc: str | None = None  # tasks of one document
    after: str | None = None  # the cursor: ``{create_time}_{id}`` of the last row shown

    def cursor(self) -> tuple[int, str] | None:
        match = _CURSOR.match(self.after or "")
        return (int(match.group(1)), match.group(2)) if match else None

    def query(self, **changes: str | None) -> dict[str, str]:
        """The query string of these filters with ``changes`` (None drops one)."""
        values = {"tenant": self.tenant, "kb": self.kb, "state": self.state, "doc": self.doc}
        values.update(changes)
        return {k: v for k, v in values.items() if v}


def cursor_of(row: dict[str, Any]) -> str:
    return f"{int(row['create_time'])}_{row['id']}"


def _keyset(model: type[peewee.Model], query: peewee.Select, f: Filters) -> peewee.Select:
    after = f.cursor()
    if after is not None:
        created, last_id = after
        query = query.where(
            (model.create_time < created) | ((model.create_time == created) & (model.id < last_id))
        )
    return query.order_by(model.create_time.desc(), model.id.desc()).limit(PAGE_ROWS + 1)


def _page(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    if len(rows) > PAGE_ROWS:
        rows = rows[:PAGE_ROWS]
        return rows, cursor_of(rows[-1])
    return rows, None


def last_lines(text: str, n: int = MESSAGE_LINES) -> list[str]:
    return [line for line in (text or "").splitlines() if line.strip()][-n:]


def _kb_names(kb_ids: Sequence[str]) -> dict[str, str]:
    ids = sorted({k for k in kb_ids if k})
    if not ids:
        return {}
    return dict(
        KnowledgeBase.select(KnowledgeBase.id, KnowledgeBase.name).where(KnowledgeBase.id.in_(ids)).tuples()
    )


def documents_page(settings: Settings, f: Filters) -> tuple[list[dict[str, Any]], str | None]:
    """A page of documents (newest first) and the cursor of the next page (None: the last)."""
    init_database(settings.db_url)
    fields = (
        Document.id,
        Document.kb_id,
        Document.tenant_id,
        Document.name,
        Document.doc_type,
        Document.size,
        Document.run,
        Document.progress,
        Document.progress_msg,
        Document.chunk_num,
        Document.generation,
        Document.create_time,
        Document.update_time,
    )
    query = Document.select(*fields)
    if f.kb:
        query = query.where(Document.kb_id == f.kb)
    if f.tenant:
        query = query.where(Document.tenant_id == f.tenant)
    if f.state:
        query = query.where(Document.run == f.state)
    with connection():
        rows = list(_keyset(Document, query, f).dicts())
        names = _kb_names([r["kb_id"] for r in rows])
    rows, more = _page(rows)
    for r in rows:
        r["kb_name"] = names.get(r["kb_id"], "")
        r["lines"] = last_lines(r.pop("progress_msg"), 1)
    return rows, more


def tasks_page(settings: Settings, f: Filters) -> tuple[list[dict[str, Any]], str | None]:
    """A page of tasks (newest first) and the cursor of the next page."""
    init_database(settings.db_url)
    fields = (
        Task.id,
        Task.doc_id,
        Task.kb_id,
        Task.tenant_id,
        Task.task_type,
        Task.priority,
        Task.from_page,
        Task.to_page,
        Task.status,
        Task.progress,
        Task.progress_msg,
        Task.owner,
        Task.attempt,
        Task.strike_id,
        Task.create_time,
        Task.update_time,
    )
    query = Task.select(*fields)
    if f.doc:
        query = query.where(Task.doc_id == f.doc)
    if f.kb:
        query = query.where(Task.kb_id == f.kb)
    if f.tenant:
        query = query.where(Task.tenant_id == f.tenant)
    if f.state:
        query = query.where(Task.status == f.state)
    with connection():
        rows = list(_keyset(Task, query, f).dicts())
        doc_ids = sorted({r["doc_id"] for r in rows if r["doc_id"]})
        names = (
            dict(Document.select(Document.id, Document.name).where(Document.id.in_(doc_ids)).tuples())
            if doc_ids
            else {}
        )
    rows, more = _page(rows)
    for r in rows:
        r["doc_name"] = names.get(r["doc_id"], "")
        r["lines"] = last_lines(r.pop("progress_msg"))
    return rows, more


def knowledge_bases(settings: Settings, tenant: str | None) -> list[dict[str, Any]]:
    init_database(settings.db_url)
    query = KnowledgeBase.select(
        KnowledgeBase.id,
        KnowledgeBase.tenant_id,
        KnowledgeBase.name,
        KnowledgeBase.doc_num,
        KnowledgeBase.chunk_num,
        KnowledgeBase.token_num,
        KnowledgeBase.embedding_model,
        KnowledgeBase.update_time,
    )
    if tenant is not None:
        query = query.where(KnowledgeBase.tenant_id == tenant)
    with connection():
        return list(query.order_by(KnowledgeBase.tenant_id, KnowledgeBase.name).limit(KBS_SHOWN).dicts())


def knowledge_base(settings: Settings, kb_id: str, tenant: str | None) -> dict[str, Any] | None:
    """One knowledge base, or None when it is not there or not ``tenant``'s."""
    init_database(settings.db_url)
    with connection():
        kb = KnowledgeBase.get_or_none(KnowledgeBase.id == kb_id)
    if kb is None or (tenant is not None and kb.tenant_id != tenant):
        return None
    return dict(kb.to_dict())


# -- the fleet and the queues ------------------------------------------------------------------


def fleet_rows(settings: Settings) -> list[dict[str, Any]]:
    """Each live executor: health verdict, RSS, CPU, running tasks, heartbeat age, draining,
    and ``stale`` when its heartbeat is older than three periods."""
    out = []
    for beat in fleet(settings):
        age = beat.get("age_s")
        period = float(beat.get("heartbeat_s") or settings.heartbeat_s)
        running = beat.get("running")
        health = beat.get("health")
        out.append(
            {
                "consumer": str(beat.get("consumer", "")),
                "host": str(beat.get("host", "")),
                "pid": beat.get("pid", ""),
                "ok": isinstance(health, dict) and bool(health.get("ok")),
                "verdict": beat.get("error") or health_text(health) or "unknown",
                "rss_mb": beat.get("rss_mb"),
                "cpu_percent": beat.get("cpu_percent"),
                "running": len(running) if isinstance(running, list) else (running or 0),
                "done": beat.get("done", ""),
                "failed": beat.get("failed", ""),
                "age_s": age,
                "draining": bool(beat.get("draining")),
                "stale": not isinstance(age, (int, float)) or age > STALE_PERIODS * period,
            }
        )
    return out


def streams(client: redis.Redis, keys: Keys, tenants: Sequence[str]) -> list[dict[str, Any]]:
    """Per priority: entries in the stream, pending (read, not acked), lag (not yet read by the
    group) and waiting at the gate in the ``tenants``' backlogs."""
    out = []
    for stream, priority in zip(keys.queues, PRIORITIES, strict=True):
        pipe = client.pipeline(transaction=False)
        pipe.xlen(stream)
        for tenant in tenants:
            pipe.xlen(keys.backlog(priority, tenant))
        length, *backlogs = pipe.execute()
        pending = lag = 0
        try:
            for group in client.xinfo_groups(stream):
                if group.get("name") == keys.group:
                    pending, lag = int(group.get("pending") or 0), int(group.get("lag") or 0)
        except redis.ResponseError:  # no stream or group yet
            pass
        out.append(
            {
                "priority": priority,
                "stream": stream,
                "length": int(length),
                "pending": pending,
                "lag": lag,
                "waiting": sum(int(n) for n in backlogs),
            }
        )
    return out


def queue_depth(client: redis.Redis, keys: Keys) -> int:
    """Entries in the priority streams and every backlog at the gate (the chart's queue depth)."""
    tenants = Gate(client, keys).tenants_at_gate()
    return sum(s["length"] + s["waiting"] for s in streams(client, keys, tenants))


def queues(settings: Settings, client: redis.Redis, tenant: str | None) -> dict[str, Any]:
    """The queues page: each priority, and each tenant's standing (only ``tenant``'s when given)."""
    rows = [s.to_dict() for s in standings(settings, None if tenant is None else [tenant])]
    keys = Keys(settings.key_prefix)
    backlog_tenants = [r["tenant_id"] for r in rows] if tenant is None else [tenant]
    if tenant is None:
        backlog_tenants = sorted({*backlog_tenants, *Gate(client, keys).tenants_at_gate()})
    for r in rows:
        pipe = client.pipeline(transaction=False)
        for p in PRIORITIES:
            pipe.xlen(keys.backlog(p, r["tenant_id"]))
        r["backlog_by_priority"] = [int(n) for n in pipe.execute()]
        r["gate"] = (
            "parked"
            if r["parked"]
            else ("admitted" if r["slots"] else ("waiting" if r["backlog"] else "idle"))
        )
    return {
        "streams": streams(client, keys, backlog_tenants),
        "tenants": rows,
        "admitted": [r["tenant_id"] for r in rows if r["slots"]],
        "waiting": [r["tenant_id"] for r in rows if r["backlog"] and not r["slots"]],
        "defaults": {
            "max_running": settings.tenant_max_running,
            "max_queued": settings.tenant_max_queued,
            "max_docs": settings.tenant_max_docs,
        },
    }
