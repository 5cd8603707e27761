"""Helpers for executor tests: enqueue tasks (rows, then messages), run a daemon, read rows."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import trio

from db.bulk import bulk_insert_into_db
from db.config import Settings
from db.database import unit
from db.models import Document, KnowledgeBase, Task
from db.streams import Streams
from executor.daemon import Daemon
from executor.runner import RetryPolicy

ROW_FIELDS = {
    "status",
    "attempt",
    "owner",
    "handback_count",
    "progress",
    "progress_msg",
    "generation",
    "payload",
}
FAST_RETRIES = RetryPolicy(max_tries=5, base_s=0.05, cap_s=0.2)


def new_id() -> str:
    return uuid.uuid4().hex


def make_document(kb_id: str | None = None, doc_id: str | None = None) -> tuple[str, str]:
    kb_id, doc_id = kb_id or new_id(), doc_id or new_id()
    bulk_insert_into_db(KnowledgeBase, [{"id": kb_id, "name": f"kb-{kb_id[:8]}"}], replace_on_conflict=True)
    bulk_insert_into_db(Document, [{"id": doc_id, "kb_id": kb_id, "name": f"doc-{doc_id[:8]}.txt"}])
    return kb_id, doc_id


def task_spec(task_type: str, **fields: Any) -> dict[str, Any]:
    return {"task_type": task_type, **fields}


def enqueue(streams: Streams, specs: Iterable[dict[str, Any]], *, publish: bool = True) -> list[str]:
    """Write a task row per spec, then publish its message (extra spec fields go in the message,
    row fields such as ``status`` or ``attempt`` go on the row). Returns the task ids."""
    rows, messages = [], []
    for spec in specs:
        spec = dict(spec)
        tid = spec.pop("id", None) or new_id()
        doc_id = spec.pop("doc_id", "")
        kb_id = spec.pop("kb_id", "")
        priority = spec.pop("priority", 0)
        task_type = spec.pop("task_type")
        row_extra = {k: spec.pop(k) for k in list(spec) if k in ROW_FIELDS}
        if "tenant_id" in spec:  # on the row and in the message, as the producer writes both
            row_extra["tenant_id"] = spec["tenant_id"]
        context = {k: v for k, v in spec.items() if k != "tenant_id"}
        if context and "payload" not in row_extra:  # the type's own context lives on the row
            row_extra["payload"] = context
        rows.append(
            {
                "id": tid,
                "doc_id": doc_id,
                "kb_id": kb_id,
                "priority": priority,
                "task_type": task_type,
                **row_extra,
            }
        )
        messages.append({"id": tid, "doc_id": doc_id, "task_type": task_type, "priority": priority, **spec})
    bulk_insert_into_db(Task, rows)
    if publish:
        streams.publish_many(messages)
    return [r["id"] for r in rows]


def row(task_id: str) -> dict[str, Any]:
    with unit():
        return Task.get_by_id(task_id).to_dict()


def rows(task_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    with unit():
        return {t.id: t.to_dict() for t in Task.select().where(Task.id.in_(list(task_ids)))}


def statuses(task_ids: Iterable[str]) -> dict[str, str]:
    return {tid: r["status"] for tid, r in rows(task_ids).items()}


def all_in(task_ids: Iterable[str], *states: str) -> bool:
    ids = list(task_ids)
    got = statuses(ids)
    return len(got) == len(ids) and all(s in states for s in got.values())


@contextlib.asynccontextmanager
async def running_daemon(settings: Settings, name: str = "host_1", **kw: Any) -> AsyncIterator[Daemon]:
    """A daemon in this process for the body of the block; stopped gracefully after it."""
    kw.setdefault("retry_policy", FAST_RETRIES)
    daemon = Daemon(settings, name, **kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_stop()
