"""After rows are committed: send their stream messages and cancel requests to Redis.

Every publish goes through ``Streams.publish_many`` (the Lua script that adds an entry only when
the task has no live one), pipelined a thousand at a time. When Redis refuses, the rows stay as
committed and :class:`~ingest.errors.PublishError` says how many were not sent; the reconciler
re-publishes queued rows that have no stream entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from db.config import Settings
from db.keys import CANCEL_ANY, Keys
from db.models import CANCELLED, Task, now_ms
from db.results import Announcement, Results, result_record
from db.streams import Streams, connect
from ingest.errors import PublishError

CHUNK = 1000
_BASE_FIELDS = ("id", "doc_id", "task_type", "priority", "kb_id", "tenant_id")
MAX_PAYLOAD_BYTES = 8 << 20  # a task's payload as JSON, at most (the producer refuses more)
# The largest message a task of the producer's makes: its payload's JSON (characters ≤ its UTF-8
# bytes) and the contract's fields. The executor reads any message up to this (claim.parse_message).
MAX_MESSAGE_CHARS = MAX_PAYLOAD_BYTES + (64 << 10)
# The task row's columns :func:`task_message` reads: what a re-publish selects.
MESSAGE_COLUMNS = (
    Task.id,
    Task.doc_id,
    Task.task_type,
    Task.priority,
    Task.kb_id,
    Task.tenant_id,
    Task.payload,
)


def task_message(row: Mapping[str, Any]) -> dict[str, Any]:
    """The stream message of a task row: the contract's fields plus the row's ``payload``
    (the type's own context, e.g. ``dataflow_id``), so a re-publish rebuilds it exactly."""
    base = {name: row.get(name) for name in _BASE_FIELDS}
    base["task_type"] = base["task_type"] or "parse"
    base["priority"] = int(base["priority"] or 0)
    payload = row.get("payload") or {}
    return {**payload, **base}


@dataclass(frozen=True)
class Published:
    sent: int  # new stream entries
    already_live: int  # tasks that still had a live entry (it will deliver them)


def _chunks(items: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def send_cancels(
    settings: Settings, task_ids: Sequence[str], ended: Sequence[Mapping[str, Any]] = ()
) -> None:
    """Set ``cancel:{task}`` (expiring after the task timeout) for each task; rows go first.
    ``ended`` are the rows this cancel made terminal: each gets its result and completion event,
    and its cancel request names the attempt it had (a later attempt is never stopped by it);
    a task without its row here (removed) is cancelled whatever its attempt."""
    if not task_ids:
        return
    keys = Keys(settings.key_prefix)
    ttl = max(1, int(settings.task_timeout_s))
    attempts = {str(r["id"]): r.get("attempt") for r in ended}
    client = connect(settings)
    try:
        for chunk in _chunks(task_ids):
            pipe = client.pipeline(transaction=False)
            for tid in chunk:
                attempt = attempts.get(tid)
                pipe.set(keys.cancel(tid), CANCEL_ANY if attempt is None else str(int(attempt)), ex=ttl)
            pipe.execute()
        announce_ends(settings, client, ended, CANCELLED, "cancelled")
    except redis.RedisError as exc:
        raise PublishError(
            f"{len(task_ids)} task(s) are cancelled on their rows but the cancel requests could not "
            f"be sent: {exc}; a running copy stops when its next write is refused",
            list(task_ids),
        ) from exc
    finally:
        client.close()


def announce_ends(
    settings: Settings,
    client: redis.Redis,
    rows: Sequence[Mapping[str, Any]],
    status: str,
    error: str,
    *,
    chunk_counts: Mapping[str, int] | None = None,
) -> None:
    """Rows made terminal outside an executor (a cancel, a digest reuse at submit): their
    results and completion events, each written once (``db.results``)."""
    if not rows:
        return
    results = Results(client, Keys(settings.key_prefix))
    now = now_ms()
    for chunk in _chunks(list(rows)):
        results.announce(
            [
                Announcement(
                    {
                        "task_id": r["id"],
                        "doc_id": r.get("doc_id") or "",
                        "tenant_id": r.get("tenant_id") or "",
                        "status": status,
                        "progress": -1.0,
                    },
                    result_record(
                        r,
                        status,
                        chunk_count=(chunk_counts or {}).get(str(r["id"]), 0),
                        error=error,
                        finished_at=now,
                    ),
                )
                for r in chunk
            ],
            ttl_s=settings.results_ttl_s,
        )


def publish_messages(
    settings: Settings,
    messages: Sequence[Mapping[str, Any]],
    *,
    cancel_ids: Sequence[str] = (),
    ended: Sequence[Mapping[str, Any]] = (),
    requeue: bool = False,
) -> Published:
    """Send cancel requests for ``cancel_ids`` (``ended``: their rows, for their results), then
    one message per task. With ``requeue`` (rows re-queued from a terminal state), a task whose
    previous entry is still being processed gets its message published by that entry's ack.

    A task being published gets any stale cancel request and result of its id removed first (an
    id can come back: a retried task, a document submitted again after ``rm``).
    """
    keys = Keys(settings.key_prefix)
    client = connect(settings)
    streams = Streams(client, keys)
    sent = live = 0
    try:
        if cancel_ids:
            send_cancels(settings, cancel_ids, ended)
        for chunk in _chunks(messages):
            ids_ = [str(m["id"]) for m in chunk]
            # a task published again starts afresh: no old cancel request, no old result
            client.delete(*[keys.cancel(t) for t in ids_], *[keys.result(t) for t in ids_])
            for result in streams.publish_many(chunk, chunk=CHUNK, requeue=requeue):
                if result is None:
                    live += 1
                else:
                    sent += 1
    except (redis.RedisError, PublishError) as exc:
        left = [str(m["id"]) for m in messages[sent + live :]]
        cause = exc.__cause__ if isinstance(exc, PublishError) and exc.__cause__ else exc
        also = (
            f" (nor the cancel requests of {len(cancel_ids)} superseded task(s))"
            if isinstance(exc, PublishError)
            else ""
        )
        raise PublishError(
            f"{len(left)} task rows are queued but could not be published{also}: {cause}; "
            "the reconciler re-publishes them",
            left,
        ) from exc
    finally:
        client.close()
    return Published(sent=sent, already_live=live)
