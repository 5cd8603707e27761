"""Dead letters: list the dead-letter stream, replay entries, purge old ones.

Each entry of ``ingest:dead`` keeps the original message, the reason, the delivery count and
the time (``LIFECYCLE.md``, "Errors"). ``replay`` sets the entry's task row ``queued`` again
(only a ``dead`` row; its attempt is kept, its hand-back count reset so the delivery cap starts
afresh), then publishes it through the guarded publish; the entry stays, marked replayed in a
hash beside the stream. ``purge`` is the only thing that removes entries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import orjson

from db.config import Settings
from db.database import init_database, unit
from db.keys import Keys
from db.models import DEAD, Task, now_ms
from db.streams import connect
from ingest.documents import lock_documents, recompute_documents
from ingest.errors import NotFound
from ingest.publish import publish_messages, task_message
from ingest.requeue import requeue_rows

PAGE = 1000
MESSAGE_SHOWN = 2000  # characters of the original message kept in a listing


@dataclass(frozen=True)
class DeadLetter:
    id: str  # the entry's id in the dead-letter stream
    task_id: str  # '' when the message named none
    reason: str
    deliveries: int
    time: int  # ms since the epoch, when it was dead-lettered
    stream: str  # where the message was
    entry: str  # its entry id there
    consumer: str  # the executor that dead-lettered it
    message: str  # the original message (head)
    replayed_at: int | None = None  # ms, when ``dead replay`` re-queued its task

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReplayResult:
    replayed: list[tuple[str, str]]  # (dead entry id, task id)
    published: int  # new stream entries (the rest still had a live one)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (dead entry id, why)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PurgeResult:
    removed: int
    older_than_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ms_of(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _letter(entry_id: str, fields: dict[str, str], replayed: dict[str, str]) -> DeadLetter:
    mark = replayed.get(entry_id)
    when = None
    if mark:
        try:
            when = _int(orjson.loads(mark).get("time"), None)  # type: ignore[arg-type]  # None: a mark without a time
        except (orjson.JSONDecodeError, AttributeError):
            when = 0
    message = fields.get("message", "")
    return DeadLetter(
        id=entry_id,
        task_id=fields.get("task_id", ""),
        reason=fields.get("reason", ""),
        deliveries=_int(fields.get("deliveries")),
        time=_int(fields.get("time"), _ms_of(entry_id)),
        stream=fields.get("stream", ""),
        entry=fields.get("entry", ""),
        consumer=fields.get("consumer", ""),
        message=message if len(message) <= MESSAGE_SHOWN else message[:MESSAGE_SHOWN] + "…",
        replayed_at=when,
    )


def list_dead(settings: Settings, *, limit: int | None = None) -> list[DeadLetter]:
    """Every dead letter, oldest first (at most ``limit``)."""
    keys = Keys(settings.key_prefix)
    client = connect(settings)
    try:
        replayed = cast("dict[str, str]", client.hgetall(keys.dead_replayed))  # decoded replies
        out: list[DeadLetter] = []
        low = "-"
        while limit is None or len(out) < limit:
            page = cast("list[tuple[str, dict[str, str]]]", client.xrange(keys.dead, low, "+", count=PAGE))
            out += [_letter(eid, fields, replayed) for eid, fields in page]
            if len(page) < PAGE:
                break
            low = f"({page[-1][0]}"
        return out[:limit] if limit is not None else out
    finally:
        client.close()


def recent_dead(settings: Settings, limit: int) -> list[DeadLetter]:
    """The newest ``limit`` dead letters, newest first (the dashboard's page)."""
    keys = Keys(settings.key_prefix)
    client = connect(settings)
    try:
        replayed = cast("dict[str, str]", client.hgetall(keys.dead_replayed))  # decoded replies
        page = cast("list[tuple[str, dict[str, str]]]", client.xrevrange(keys.dead, count=limit))
        return [_letter(eid, fields, replayed) for eid, fields in page]
    finally:
        client.close()


def _pick(
    letters: list[DeadLetter], entry_ids: Sequence[str] | None, skipped: list[tuple[str, str]]
) -> list[DeadLetter]:
    """The letters to replay: those named, or (``entry_ids`` None) every one not yet replayed."""
    if entry_ids is None:
        return [d for d in letters if d.replayed_at is None]
    by_id = {d.id: d for d in letters}
    picked = []
    for eid in dict.fromkeys(entry_ids):
        if eid in by_id:
            picked.append(by_id[eid])
        else:
            skipped.append((eid, "no such dead letter"))
    return picked


def replay(settings: Settings, entry_ids: Sequence[str] | None = None) -> ReplayResult:
    """Replay the named dead letters, or with ``entry_ids`` None every one not replayed yet:
    each one's ``dead`` task row goes back to ``queued``, then it is published afresh."""
    skipped: list[tuple[str, str]] = []
    chosen = _pick(list_dead(settings), entry_ids, skipped)
    if entry_ids is not None and not chosen and len(skipped) == 1:
        raise NotFound(f"no dead letter {skipped[0][0]!r} (see `ingest dead list`)")
    by_task: dict[str, DeadLetter] = {}
    for d in chosen:
        if not d.task_id:
            skipped.append((d.id, "the message names no task (malformed): nothing to replay"))
        elif d.task_id in by_task:
            skipped.append((d.id, f"task {d.task_id} is replayed by dead letter {by_task[d.task_id].id}"))
        else:
            by_task[d.task_id] = d
    init_database(settings.db_url)
    with unit():  # what the rows are, read apart: the write below locks before it reads
        found = _found(sorted(by_task))
    with unit():
        rows = _requeue(by_task, found, skipped)
    keys = Keys(settings.key_prefix)
    if rows:
        client = connect(settings)
        try:
            stamp = now_ms()
            # a task that dies again gets a dead letter of its own
            client.hdel(keys.dead_tasks, *[r["id"] for r in rows])
            client.hset(
                keys.dead_replayed,
                mapping={
                    by_task[r["id"]].id: orjson.dumps({"time": stamp, "task_id": r["id"]}).decode()
                    for r in rows
                },
            )
        finally:
            client.close()
    published = publish_messages(settings, [task_message(r) for r in rows], requeue=True) if rows else None
    return ReplayResult(
        replayed=[(by_task[r["id"]].id, r["id"]) for r in rows],
        published=published.sent if published else 0,
        skipped=skipped,
    )


def _found(ids: list[str]) -> dict[str, dict[str, Any]]:
    return {
        r["id"]: r for r in Task.select(Task.id, Task.doc_id, Task.status).where(Task.id.in_(ids)).dicts()
    }


def _requeue(
    by_task: dict[str, DeadLetter], found: dict[str, dict[str, Any]], skipped: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Inside a transaction whose first statement locks the documents (so the recompute reads
    what is committed now, not an older snapshot): ``dead`` rows → ``queued`` (attempt kept)."""
    if not by_task:
        return []
    ids = sorted(by_task)
    for tid in ids:
        if tid not in found:
            skipped.append((by_task[tid].id, f"no task row {tid}"))
        elif found[tid]["status"] != DEAD:
            skipped.append(
                (by_task[tid].id, f"task {tid} is {found[tid]['status']}; only dead tasks are replayed")
            )
    doc_ids = sorted({r["doc_id"] for r in found.values() if r["doc_id"] and r["status"] == DEAD})
    lock_documents(doc_ids)
    rows = requeue_rows(
        [t for t in ids if t in found],
        (DEAD,),
        lambda tid: f"re-queued by dead replay of entry {by_task[tid].id}",
        retried=False,
    )
    recompute_documents(doc_ids)
    return rows


def purge(settings: Settings, older_than_s: float) -> PurgeResult:
    """Remove dead letters dead-lettered more than ``older_than_s`` ago (and their replay marks)."""
    if older_than_s < 0:
        raise ValueError("--older-than must not be negative")
    keys = Keys(settings.key_prefix)
    cutoff = int(time.time() * 1000 - older_than_s * 1000)
    client = connect(settings)
    try:
        removed = int(client.xtrim(keys.dead, minid=f"{max(0, cutoff)}-0", approximate=False))
        marks = [eid for eid in cast("list[str]", client.hkeys(keys.dead_replayed)) if _ms_of(eid) < cutoff]
        for start in range(0, len(marks), PAGE):
            client.hdel(keys.dead_replayed, *marks[start : start + PAGE])
        tasks = cast("dict[str, str]", client.hgetall(keys.dead_tasks))  # decoded replies
        gone = [t for t, eid in tasks.items() if _ms_of(eid) < cutoff]
        for start in range(0, len(gone), PAGE):
            client.hdel(keys.dead_tasks, *gone[start : start + PAGE])
    finally:
        client.close()
    return PurgeResult(removed=removed, older_than_s=older_than_s)
