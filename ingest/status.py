"""The CLI's reading side: counts of tasks and documents, one task or document, the fleet.

Everything here reads; nothing writes. The database is the truth about tasks; Redis adds what
only it knows (stream lengths, pending entries, dead letters, heartbeats).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, cast

import orjson
import peewee
import redis

from db.config import Settings
from db.database import connection, init_database
from db.gate import Gate
from db.keys import PRIORITIES, Keys
from db.models import TASK_STATES, TERMINAL_STATES, Document, KnowledgeBase, Task
from db.streams import connect
from ingest.errors import NotFound

DOCUMENT_TASKS_SHOWN = 1000
STALE_PERIODS = 3  # a heartbeat older than this many periods makes its executor unhealthy


def summary(settings: Settings) -> dict[str, Any]:
    """Tasks by status and by type, documents by run state, knowledge bases."""
    init_database(settings.db_url)
    by_type: dict[str, dict[str, int]] = defaultdict(dict)
    by_status: dict[str, int] = dict.fromkeys(TASK_STATES, 0)
    with connection():
        query = Task.select(Task.task_type, Task.status, peewee.fn.COUNT(Task.id)).group_by(
            Task.task_type, Task.status
        )
        for task_type, status, n in query.tuples():
            by_type[task_type][status] = int(n)
            by_status[status] = by_status.get(status, 0) + int(n)
        docs = {
            run: int(n)
            for run, n in Document.select(Document.run, peewee.fn.COUNT(Document.id))
            .group_by(Document.run)
            .tuples()
        }
        kbs = KnowledgeBase.select().count()
    return {
        "tasks": {"total": sum(by_status.values()), "by_status": by_status, "by_type": dict(by_type)},
        "documents": {"total": sum(docs.values()), "by_run": docs},
        "knowledge_bases": kbs,
    }


def redis_summary(settings: Settings) -> dict[str, Any]:
    """Stream lengths and pending entries (and what waits at the fair gate before each), dead
    letters, live executors, fleet counters."""
    keys = Keys(settings.key_prefix)
    client = connect(settings)
    try:
        streams = {}
        tenants = Gate(client, keys).tenants_at_gate()
        for stream, priority in zip(keys.queues, PRIORITIES, strict=True):
            length = int(client.xlen(stream))
            try:
                pending = int(client.xpending(stream, keys.group)["pending"])
            except redis.ResponseError:  # no group yet (`ingest init` not run)
                pending = 0
            pipe = client.pipeline(transaction=False)
            for tenant in tenants:
                pipe.xlen(keys.backlog(priority, tenant))
            waiting = sum(int(n) for n in pipe.execute()) if tenants else 0
            streams[stream] = {"length": length, "pending": pending, "waiting": waiting}
        executors = sum(1 for _ in client.scan_iter(match=keys.executor_pattern, count=1000))
        stats = {k: _number(v) for k, v in cast("dict[str, str]", client.hgetall(keys.stats)).items()}
        return {
            "streams": streams,
            "dead_letters": int(client.xlen(keys.dead)),
            "executors": executors,
            "stats": stats,
            "republished": int(stats.get("republished", 0)),  # rows the reconciler published again
        }
    finally:
        client.close()


def _number(value: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def task_dict(task: dict[str, Any], *, with_chunk_ids: bool = True) -> dict[str, Any]:
    out = dict(task)
    chunk_ids = (out.pop("chunk_ids", "") or "").split()
    out["chunk_count"] = len(chunk_ids)
    if with_chunk_ids:
        out["chunk_ids"] = chunk_ids
    return out


def describe(settings: Settings, id_: str, *, tenant_id: str | None = None) -> dict[str, Any]:
    """One task (``{"kind": "task", "task": …}``) or one document with its current
    generation's tasks (``{"kind": "document", "document": …, "tasks": […]}``). With
    ``tenant_id``, another tenant's task or document reads as not found."""
    init_database(settings.db_url)
    with connection():
        task = Task.get_or_none(Task.id == id_)
        if task is not None and (tenant_id is None or task.tenant_id == tenant_id):
            return {"kind": "task", "task": task_dict(task.to_dict())}
        doc = Document.get_or_none(Document.id == id_)
        if doc is None or (tenant_id is not None and doc.tenant_id != tenant_id):
            raise NotFound(f"no task or document with id {id_!r}")
        kb = KnowledgeBase.get_or_none(KnowledgeBase.id == doc.kb_id)
        tasks = list(
            Task.select()
            .where((Task.doc_id == doc.id) & (Task.generation == doc.generation))
            .order_by(Task.from_page, Task.id)
            .limit(DOCUMENT_TASKS_SHOWN)
            .dicts()
        )
        older = {
            status: int(n)
            for status, n in Task.select(Task.status, peewee.fn.COUNT(Task.id))
            .where((Task.doc_id == doc.id) & (Task.generation < doc.generation))
            .group_by(Task.status)
            .tuples()
        }
    document = doc.to_dict()
    document["kb_name"] = kb.name if kb else None
    return {
        "kind": "document",
        "document": document,
        "tasks": [task_dict(t, with_chunk_ids=False) for t in tasks],
        "older_generations": older,
    }


# -- following one task or document (the HTTP watch, the client's watch) ------------------

DOCUMENT_ENDS = ("done", "failed", "cancelled")


def slim(state: dict[str, Any]) -> dict[str, Any]:
    """A described task or document without its chunk id list (it can be long)."""
    if state.get("kind") == "task":
        task = {k: v for k, v in state["task"].items() if k != "chunk_ids"}
        return {**state, "task": task}
    return state


def is_terminal(state: dict[str, Any]) -> bool:
    if state["kind"] == "task":
        return state["task"]["status"] in TERMINAL_STATES
    return state["document"]["run"] in DOCUMENT_ENDS


def fingerprint(state: dict[str, Any]) -> tuple[Any, ...]:
    if state["kind"] == "task":
        t = state["task"]
        return (t["status"], t["progress"], t["progress_msg"])
    d = state["document"]
    tasks = tuple((t["id"], t["status"], t["progress"]) for t in state.get("tasks", ()))
    return (d["run"], d["progress"], d["progress_msg"], d["generation"], tasks)


def end_status(state: dict[str, Any]) -> str:
    return str(state["task"]["status"] if state["kind"] == "task" else state["document"]["run"])


def fleet(settings: Settings) -> list[dict[str, Any]]:
    """Every live executor's heartbeat (``executor:{consumer}``), with ``age_s`` added."""
    keys = Keys(settings.key_prefix)
    client = connect(settings)
    try:
        names = sorted(client.scan_iter(match=keys.executor_pattern, count=1000))
        values = client.mget(names) if names else []
    finally:
        client.close()
    now = time.time()
    beats = []
    for name, raw in zip(names, values, strict=True):
        if raw is None:  # expired between SCAN and MGET
            continue
        consumer = name[len(keys.executor("")) :]
        try:
            beat = orjson.loads(raw)
            if not isinstance(beat, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            beats.append({"consumer": consumer, "error": f"unreadable heartbeat: {exc}"})
            continue
        beat.setdefault("consumer", consumer)
        beat["age_s"] = _age_s(beat.get("now"), now)
        _stale_health(beat, float(beat.get("heartbeat_s") or settings.heartbeat_s))
        beats.append(beat)
    return beats


def health_text(health: Any) -> str:
    """A heartbeat's health verdict: ``ok``, or the reasons it is not (as the health check says),
    and what its ports had to shed (``warnings``)."""
    if not isinstance(health, dict):
        return ""
    warnings = "; ".join(str(w) for w in health.get("warnings") or [])
    if health.get("ok"):
        return f"ok (warning: {warnings})" if warnings else "ok"
    reasons = "; ".join(str(r) for r in health.get("reasons") or [])
    return f"unhealthy: {reasons}" if reasons else "unhealthy"


def _stale_health(beat: dict[str, Any], heartbeat_s: float) -> None:
    """A heartbeat three periods old is itself a verdict: its event loop or its Redis is stuck."""
    age = beat.get("age_s")
    if isinstance(age, float) and age > STALE_PERIODS * heartbeat_s:
        health = given if isinstance(given := beat.get("health"), dict) else {}
        reasons = [f"heartbeat {age:.0f} s old", *(health.get("reasons") or [])]
        beat["health"] = {**health, "ok": False, "reasons": reasons}


def _age_s(stamp: Any, now: float) -> float | None:
    """Seconds since a heartbeat's ``now`` (seconds or milliseconds since the epoch)."""
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
        return None
    seconds = stamp / 1000.0 if stamp > 1e11 else float(stamp)
    return round(max(0.0, now - seconds), 3)
