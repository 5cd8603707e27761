"""Memory: conversation messages kept with their embeddings, searchable by meaning.

Application services call :func:`save_message` (or :func:`save_messages`); each message
becomes a ``memory`` task whose stream message carries ``memory_id``, ``source_id`` and
``message_dict`` (``role``, ``content``, and what orders the conversation: an explicit
``position``, else ``saved_at_us``, the time of the save), as the contract says. The ``memory`` handler checks it (:func:`check_message`), embeds the content
through the executor's shared service and upserts it (:func:`store_message`) under an id derived
from (memory id, source id): saving the same source id twice stores it once (in the place it
first took, unless a position is given), and a redelivered message is harmless. The upsert is
fenced on the task's row like every write of a run; a task cancelled after it takes the message
it created with it (:func:`remove_cancelled_messages`, from the finisher). :func:`search_memory` finds the closest messages (blockwise, with
:func:`ingest.search.top_k`); :func:`conversation` returns them in order.

Importing this module is light: the model is loaded only by :func:`search_memory`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from db.config import Settings
from db.database import connection, init_database, is_mysql, unit
from db.models import MemoryMessage, now_ms
from ingest import ids
from ingest.errors import PermanentError
from ingest.fence import fence

if TYPE_CHECKING:
    import numpy as np

ROLES = ("user", "assistant", "system", "tool")
MAX_MEMORY_ID_CHARS = 64
MAX_SOURCE_ID_CHARS = 128
MAX_CONTENT_CHARS = 1_000_000
BATCH = 1000  # rows removed per transaction
BLOCK_ROWS = 4096


@dataclass(frozen=True)
class MemoryItem:
    """A checked message: where it goes, who said it, what, and its place in the conversation."""

    memory_id: str
    source_id: str
    role: str
    content: str
    position: int | None  # an explicit place in the conversation
    saved_at_us: int | None  # when it was saved (microseconds): the place without a position

    def id_for(self, tenant_id: str) -> str:
        return ids.memory_message_id(self.memory_id, self.source_id, tenant_id)


@dataclass(frozen=True)
class MemoryHit:
    source_id: str
    role: str
    content: str
    position: int
    score: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text_id(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PermanentError(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > limit:
        raise PermanentError(f"{what} is longer than {limit} characters")
    return value


def check_message(message: Mapping[str, Any]) -> MemoryItem:
    """The message's memory fields, or :class:`PermanentError` saying what is wrong."""
    memory_id = _text_id(message.get("memory_id"), "memory_id", MAX_MEMORY_ID_CHARS)
    source_id = _text_id(message.get("source_id"), "source_id", MAX_SOURCE_ID_CHARS)
    body = message.get("message_dict")
    if not isinstance(body, Mapping):
        raise PermanentError(f"message_dict must be an object with role and content, not {body!r}")
    role = body.get("role")
    if role not in ROLES:
        raise PermanentError(f"invalid role {role!r} in message_dict (one of {', '.join(ROLES)})")
    if "content" not in body:
        raise PermanentError("message_dict has no content")
    content = body["content"]
    if not isinstance(content, str) or not content.strip():
        raise PermanentError(f"message_dict content must be non-empty text, not {content!r}")
    if len(content) > MAX_CONTENT_CHARS:
        raise PermanentError(f"message_dict content is longer than {MAX_CONTENT_CHARS} characters")
    position, saved_at = body.get("position"), body.get("saved_at_us")
    for name, value in (("position", position), ("saved_at_us", saved_at)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise PermanentError(f"message_dict {name} must be an integer, not {value!r}")
        if value is not None and not -(2**63) <= value < 2**63:  # the column's BIGINT
            raise PermanentError(f"message_dict {name} {value} is out of range (a signed 64-bit integer)")
    return MemoryItem(memory_id, source_id, role, content, position, saved_at)


# -- enqueue (application services, ``ingest memory save``) ------------------------------------


def memory_task(item: MemoryItem, *, tenant_id: str = "default", priority: int = 0) -> dict[str, Any]:
    """The task that saves ``item`` (for :func:`ingest.producer.enqueue_tasks`)."""
    body: dict[str, Any] = {"role": item.role, "content": item.content}
    if item.position is not None:
        body["position"] = item.position
    if item.saved_at_us is not None:
        body["saved_at_us"] = item.saved_at_us
    return {
        "id": ids.memory_task_id(item.memory_id, item.source_id, tenant_id),
        "task_type": "memory",
        "tenant_id": tenant_id,
        "priority": priority,
        "memory_id": item.memory_id,
        "source_id": item.source_id,
        "message_dict": body,
    }


def save_messages(
    settings: Settings,
    memory_id: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tenant_id: str = "default",
    priority: int = 0,
) -> list[str]:
    """Enqueue conversation messages (each ``{"role", "content"}``, optionally ``source_id``
    and ``position``) in one batch; returns their task ids. Messages without a position take
    their place by the time of the save (in microseconds), in the order given. A ``ValueError``
    names a bad one.
    """
    from ingest.producer import enqueue_tasks

    base = time.time_ns() // 1000
    tasks = []
    for n, message in enumerate(messages):
        body = {
            "role": message.get("role"),
            "content": message.get("content"),
            "position": message.get("position"),
            "saved_at_us": base + n,
        }
        raw = {
            "memory_id": memory_id,
            "source_id": message.get("source_id") or ids.new_id(),
            "message_dict": body,
        }
        try:
            item = check_message(raw)
        except PermanentError as exc:
            raise ValueError(f"message {n + 1}: {exc}") from None
        tasks.append(memory_task(item, tenant_id=tenant_id, priority=priority))
    return enqueue_tasks(settings, tasks)


def save_message(
    settings: Settings,
    memory_id: str,
    role: str,
    content: str,
    source_id: str | None = None,
    *,
    position: int | None = None,
    tenant_id: str = "default",
    priority: int = 0,
) -> str:
    """Enqueue one message of memory ``memory_id``; returns its task id.

    ``source_id`` names the message in its source (a chat message id); without one a fresh id
    is generated. Saving the same ``source_id`` again replaces that message rather than adding
    one, in the place the first took (if the first save is still queued, the second is left
    out). ``position`` orders the conversation; by default the time of the first save.
    """
    message: dict[str, Any] = {"role": role, "content": content, "source_id": source_id}
    if position is not None:
        message["position"] = position
    (task_id,) = save_messages(settings, memory_id, [message], tenant_id=tenant_id, priority=priority)
    return task_id


# -- store (the ``memory`` handler) ----------------------------------------------------------


def store_message(
    item: MemoryItem,
    vector: np.ndarray,
    task_id: str,
    default_position: int,
    *,
    attempt: int | None = None,
    tenant_id: str = "default",
    model: str = "",
) -> str:
    """Blocking, one unit of work: upsert the message with its vector into ``tenant_id``'s
    memory; returns its id. A message stored before keeps its place unless this one gives an
    explicit position. Fenced like every write of a run: in the same transaction the task's row
    is locked first and must be ``running`` (under ``attempt``, when given), else
    :class:`TaskLost` and nothing is written. ``model`` is the identity of the model that made
    ``vector``: a memory that holds another model's vectors refuses it (:class:`PermanentError`)."""
    import numpy as np

    now = now_ms()
    message_id = item.id_for(tenant_id)
    row = {
        "id": message_id,
        "tenant_id": tenant_id,
        "memory_id": item.memory_id,
        "source_id": item.source_id,
        "role": item.role,
        "content": item.content,
        "position": next(p for p in (item.position, item.saved_at_us, default_position) if p is not None),
        "vector": np.ascontiguousarray(vector, dtype=np.float32).tobytes(),
        "task_id": task_id,
        "embedding_model": model,
        "create_time": now,
        "update_time": now,
    }
    columns = ["role", "content", "vector", "embedding_model", "task_id", "update_time"]
    if item.position is not None:
        columns.append("position")
    changed = [MemoryMessage._meta.fields[c] for c in columns]
    with unit():
        fence(
            task_id, attempt, "message not stored"
        )  # task row before message row: the order the finisher locks in
        other = memory_model(tenant_id, item.memory_id, besides=model)
        if model and other:
            raise PermanentError(
                f"memory {item.memory_id!r} holds messages embedded with {other}; this executor embeds "
                f"with {model}: vectors of two models are not comparable (set INGEST_EMBEDDING_MODEL "
                "and INGEST_EMBEDDING_BACKEND to the memory's, or save into a new memory)"
            )
        query = MemoryMessage.insert(**row)
        if is_mysql():
            query = query.on_conflict(preserve=changed)
        else:
            query = query.on_conflict(conflict_target=[MemoryMessage.id], preserve=changed)
        query.execute()
    return message_id


def memory_model(tenant_id: str, memory_id: str, *, besides: str = "") -> str:
    """The model identity a message of the memory was embedded with, other than ``besides``
    (and than "": messages of before schema 3); "" when there is none."""
    return str(model_query(tenant_id, memory_id, besides=besides).scalar() or "")


def model_query(tenant_id: str, memory_id: str, *, besides: str = "") -> Any:
    """:func:`memory_model`'s query: a range of the (memory_id, embedding_model) index."""
    return (
        MemoryMessage.select(MemoryMessage.embedding_model)
        .where(
            (MemoryMessage.memory_id == memory_id)
            & (MemoryMessage.tenant_id == tenant_id)
            & MemoryMessage.embedding_model.not_in(["", besides])
        )
        .limit(1)
    )


def remove_cancelled_messages(runs: Sequence[Mapping[str, Any]]) -> int:
    """In the caller's transaction, right after it wrote these memory tasks ``cancelled`` under
    their runs' attempts (the finisher): remove the message each run stored; ``runs`` are their
    claimed task rows. Returns how many rows went.

    A message id is one per (tenant, memory, source id) and so is a task id made by
    :func:`memory_task`: saving a source id again re-queues the same task (with a higher attempt)
    and its run overwrites the message an earlier save stored. Removing that message on a late
    cancel would destroy the earlier save, whose content is kept nowhere to restore. So only a
    message this run created goes: still written last by this task (``task_id``) and created
    since this run's claim (``create_time`` >= ``begin_at``, both from the executor's clock).
    A message this run overwrote stays, with this run's content (a cancel that comes after the
    commit undoes a first save, not a re-save); so does one first stored by an earlier attempt of
    the same save (a run that crashed or was handed back after its commit): nothing tells it from
    an earlier save's. By primary key: ``task_id`` has no index, and a scan would lock the table."""
    removed = 0
    for row in runs:
        payload, begin_at = row.get("payload"), row.get("begin_at")
        if not isinstance(payload, Mapping):
            continue  # no message context: nothing was stored
        memory_id, source_id = payload.get("memory_id"), payload.get("source_id")
        if begin_at is None or not isinstance(memory_id, str) or not isinstance(source_id, str):
            continue  # not claimed, or a message check_message refused: nothing was stored
        message_id = ids.memory_message_id(memory_id, source_id, str(row.get("tenant_id") or "default"))
        removed += (
            MemoryMessage.delete()
            .where(
                (MemoryMessage.id == message_id)
                & (MemoryMessage.task_id == row["id"])
                & (MemoryMessage.create_time >= int(begin_at))
            )
            .execute()
        )
    return removed


# -- read (``ingest memory search|show``) ------------------------------------------------------


def conversation(settings: Settings, memory_id: str, *, tenant_id: str = "default") -> list[dict[str, Any]]:
    """The messages of ``tenant_id``'s memory ``memory_id`` in conversation order."""
    init_database(settings.db_url)
    with connection():
        query = (
            MemoryMessage.select(
                MemoryMessage.source_id,
                MemoryMessage.role,
                MemoryMessage.content,
                MemoryMessage.position,
                MemoryMessage.create_time,
            )
            .where((MemoryMessage.memory_id == memory_id) & (MemoryMessage.tenant_id == tenant_id))
            .order_by(MemoryMessage.position, MemoryMessage.create_time, MemoryMessage.id)
        )
        return list(query.dicts())


def remove_memory(
    settings: Settings, memory_id: str, *, tenant_id: str = "default", source_id: str | None = None
) -> int:
    """Remove ``tenant_id``'s memory ``memory_id`` (every message; with ``source_id``, that one
    message); returns how many rows went. Messages still queued are stored when they run."""
    init_database(settings.db_url)
    where = (MemoryMessage.memory_id == memory_id) & (MemoryMessage.tenant_id == tenant_id)
    if source_id is not None:
        where &= MemoryMessage.source_id == source_id
    removed = 0
    while True:  # in batches, each its own transaction: a long conversation holds no long lock
        with unit():
            batch = [i for (i,) in MemoryMessage.select(MemoryMessage.id).where(where).limit(BATCH).tuples()]
            if batch:
                MemoryMessage.delete().where(MemoryMessage.id.in_(batch)).execute()
        removed += len(batch)
        if len(batch) < BATCH:
            return removed


def vector_blocks(
    memory_id: str, dim: int, block_rows: int = BLOCK_ROWS, tenant_id: str = "default"
) -> Iterator[tuple[list[str], np.ndarray]]:
    """``(message ids, float32 matrix)`` blocks of a memory's vectors, by id (keyset, on the
    ``(memory_id, id)`` index)."""
    from ingest.search import keyset_vector_blocks

    query = MemoryMessage.select(MemoryMessage.id, MemoryMessage.vector).where(
        (MemoryMessage.memory_id == memory_id) & (MemoryMessage.tenant_id == tenant_id)
    )
    return keyset_vector_blocks(query, MemoryMessage.id, dim, block_rows)


def search_memory(
    settings: Settings,
    memory_id: str,
    query: str,
    k: int = 5,
    *,
    block_rows: int = BLOCK_ROWS,
    tenant_id: str = "default",
) -> list[MemoryHit]:
    """The ``k`` messages of ``tenant_id``'s memory ``memory_id`` closest to ``query``, best first.
    A blank ``query`` is refused (``ValueError``): every message is as close to it as any."""
    from ingest.query_encoder import query_encoder
    from ingest.search import top_k

    if not query.strip():
        raise ValueError("empty query")
    if k <= 0:
        return []
    init_database(settings.db_url)
    embedder = query_encoder(settings)
    with connection():
        other = memory_model(tenant_id, memory_id, besides=embedder.identity)
    if other:
        raise PermanentError(
            f"memory {memory_id!r} was embedded with {other}; set INGEST_EMBEDDING_MODEL to that model "
            "to search it (INGEST_EMBEDDING_BACKEND=onnx-int8 for a #onnx-int8 one, torch or onnx "
            f"otherwise) (now {embedder.identity})"
        )
    query_vector = embedder.encode([query])[0]
    top = top_k(vector_blocks(memory_id, embedder.dim, block_rows, tenant_id), query_vector, k)
    if not top:
        return []
    with connection():
        rows = {
            r["id"]: r
            for r in MemoryMessage.select(
                MemoryMessage.id,
                MemoryMessage.source_id,
                MemoryMessage.role,
                MemoryMessage.content,
                MemoryMessage.position,
            )
            .where(MemoryMessage.id.in_([mid for mid, _ in top]))
            .dicts()
        }
    return [
        MemoryHit(
            rows[mid]["source_id"], rows[mid]["role"], rows[mid]["content"], rows[mid]["position"], score
        )
        for mid, score in top
        if mid in rows
    ]
