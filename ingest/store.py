"""The knowledge-base store: a task's chunks and vectors written with deterministic ids.

A chunk's id is the xxh128 of its task id and position (``LIFECYCLE.md``), so running a task
again overwrites its own chunks (upserts, never duplicates) and never touches another
generation's. A rerun that yields fewer chunks first deletes the positions past its new count.
Chunk writes are fenced like every other write of a run: in the same transaction the task's
row is locked and must be ``running`` (under the run's attempt, when given), so a run whose
document was removed, or whose task was cancelled or taken over, writes nothing
(:class:`~ingest.errors.TaskLost`).
The bound vector store (:mod:`ingest.vectors`) gets the same upserts inside that transaction,
after the fence (a run fenced out writes to neither), and the stale positions' removal.
A chunk's metadata is held to :data:`MAX_META_BYTES` of JSON (:func:`check_meta`): the column is
a MySQL ``TEXT``; a larger one is refused as a :class:`~ingest.errors.BadDocument` before
anything is written, on every database alike (SQLite would take it). The dataflow components
that build metadata check it as they build it; the check here is the last guard.
Each function here is blocking and one unit of work (its own connection and transaction):
call it through ``trio.to_thread.run_sync`` under the ``db_limiter``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import peewee
import xxhash

from db.bulk import statement_batches
from db.database import is_mysql, lock_for_update, unit
from db.models import Chunk as ChunkRow
from db.models import KnowledgeBase, now_ms
from ingest import vectors
from ingest.chunking import Chunk
from ingest.errors import BadDocument, PermanentError
from ingest.fence import fence

DEADLOCK_TRIES = 4  # the whole upsert is idempotent: try again at once rather than fail the task
_DEADLOCK_CODES = (1213, 1205)  # deadlock, lock wait timeout
MAX_ROWS_PER_STATEMENT = 500
MAX_BYTES_PER_STATEMENT = 4 << 20  # well under MySQL's 16 MiB max_allowed_packet
_UPDATED_COLUMNS = (
    "kb_id", "doc_id", "task_id", "generation", "position", "page", "last_page", "content", "token_num", "vector", "meta",
)  # fmt: skip
# A chunk's metadata as JSON, at most: chunk.meta is a MySQL TEXT (65,535 bytes), and widening
# a table of millions of rows would copy it. A round figure with room to spare under the column.
MAX_META_BYTES = 60_000


def chunk_id(task_id: str, position: int) -> str:
    """The chunk at ``position`` of task ``task_id``: 32 hex characters, the same every run."""
    return xxhash.xxh128_hexdigest(f"{task_id}:{position}".encode())


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def vector_from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.float32)


def check_meta(meta: Mapping[str, Any], what: str) -> None:
    """:class:`BadDocument` when ``meta`` (of ``what``, e.g. ``chunk 3``) is more than
    :data:`MAX_META_BYTES` bytes as JSON, as the ``chunk.meta`` column would store it."""
    size = len(orjson.dumps(dict(meta)))
    if size > MAX_META_BYTES:
        raise BadDocument(
            f"{what}'s metadata is {size} bytes as JSON, over the limit of {MAX_META_BYTES} bytes "
            "a chunk's metadata may hold (MAX_META_BYTES): fewer or shorter fields"
        )


def store_chunks(
    *,
    kb_id: str,
    doc_id: str,
    task_id: str,
    generation: int,
    chunks: Sequence[Chunk],
    vectors: np.ndarray,
    meta: Sequence[Mapping[str, Any] | None] | None = None,
    attempt: int | None = None,
) -> list[str]:
    """Upsert a task's chunks in one transaction, fenced on the task's row (``running``, and
    under ``attempt`` when given); return their ids in position order. Raises
    :class:`TaskLost` (nothing written) when the run no longer holds its task, and
    :class:`BadDocument` (nothing written) when a chunk's metadata is larger than
    :data:`MAX_META_BYTES`."""
    if len(vectors) != len(chunks):
        raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
    for i, chunk in enumerate(chunks):
        if meta is not None and (m := meta[i]) is not None:
            check_meta(m, f"chunk {chunk.position}")
    now = now_ms()
    rows: list[dict[str, Any]] = [
        {
            "id": chunk_id(task_id, chunk.position),
            "kb_id": kb_id,
            "doc_id": doc_id,
            "task_id": task_id,
            "generation": generation,
            "position": chunk.position,
            "page": chunk.page,
            "last_page": max(chunk.last_page, chunk.page),
            "content": chunk.content,
            "token_num": chunk.token_num,
            "vector": vector_bytes(vectors[i]),
            "meta": dict(m) if meta is not None and (m := meta[i]) is not None else None,
            "create_time": now,
        }
        for i, chunk in enumerate(chunks)
    ]
    for tries in range(1, DEADLOCK_TRIES + 1):  # not "attempt": that is the run's, for the fence
        try:
            _upsert(task_id, rows, attempt)
            break
        except peewee.OperationalError as exc:
            if tries == DEADLOCK_TRIES or not exc.args or exc.args[0] not in _DEADLOCK_CODES:
                raise
            time.sleep(random.uniform(0.02, 0.1) * tries)
    return [row["id"] for row in rows]


def _upsert(task_id: str, rows: list[dict[str, Any]], attempt: int | None = None) -> None:
    """One transaction, fenced on the task's row first (task before chunks: the order the
    finisher and the producer lock in). Stale positions are found by a plain (non-locking) read
    and deleted by primary key: a range DELETE on ``task_id`` would take gap locks that deadlock
    with other tasks inserting their chunks next to it in that index."""
    preserve = [ChunkRow._meta.fields[c] for c in _UPDATED_COLUMNS]
    with unit():
        fence(task_id, attempt, "chunks not written")
        stale = [
            cid
            for (cid,) in ChunkRow.select(ChunkRow.id)
            .where((ChunkRow.task_id == task_id) & (ChunkRow.position >= len(rows)))
            .tuples()
        ]
        if stale:
            ChunkRow.delete().where(ChunkRow.id.in_(stale)).execute()
        for batch in statement_batches(rows, MAX_ROWS_PER_STATEMENT, MAX_BYTES_PER_STATEMENT):
            query = ChunkRow.insert_many(batch)
            if is_mysql():
                query = query.on_conflict(preserve=preserve)
            else:
                query = query.on_conflict(conflict_target=[ChunkRow.id], preserve=preserve)
            query.execute()
        _index(rows)
    if stale:  # after the commit: a rolled-back rewrite keeps its rows, so their vectors stay too
        vectors.forget_or_log(ids=stale, what=f"task {task_id}'s stale chunks'")


def _index(rows: list[dict[str, Any]]) -> None:
    """The rows' vectors into the bound store's engine (upserts by chunk id; in the caller's
    transaction, so a rerun after a crash anywhere here writes the same ids again)."""
    store = vectors.active()
    if store.exact or not rows:
        return
    kb = KnowledgeBase.get_by_id(rows[0]["kb_id"])
    ref = vectors.KbRef(kb.tenant_id, kb.id, kb.embedding_dim, kb.embedding_model)
    store.upsert(
        ref,
        [vectors.VectorRow(r["id"], r["doc_id"], r["task_id"], vector_from_bytes(r["vector"])) for r in rows],
    )


def delete_task_chunks(task_id: str) -> int:
    """Remove every chunk a task wrote (after a cancel); returns how many."""
    with unit():
        removed = ChunkRow.delete().where(ChunkRow.task_id == task_id).execute()
    vectors.forget_or_log(task_ids=[task_id], what=f"task {task_id}'s")
    return int(removed)


def record_embedding_model(kb_id: str, model: str, dim: int, note: str = "") -> None:
    """Record the knowledge base's model and dimension the first time; refuse another one.

    ``note`` (e.g. a chunk size longer than the model reads) is added to the knowledge base's
    note once.
    """
    with unit():
        kb = lock_for_update(KnowledgeBase.select().where(KnowledgeBase.id == kb_id)).first()
        if kb is None:
            raise PermanentError(f"knowledge base {kb_id} does not exist (removed while the task ran?)")
        changes: dict[str, Any] = {}
        if not kb.embedding_model and not kb.embedding_dim:
            changes.update(embedding_model=model, embedding_dim=dim)
        elif kb.embedding_dim != dim or (kb.embedding_model and kb.embedding_model != model):
            raise PermanentError(
                f"knowledge base {kb.name!r} holds vectors of {kb.embedding_model or 'another model'} "
                f"(dimension {kb.embedding_dim}); this executor embeds with {model} (dimension {dim}). "
                "Use the knowledge base's model (INGEST_EMBEDDING_MODEL; INGEST_EMBEDDING_BACKEND=onnx-int8 "
                "for a #onnx-int8 one, torch or onnx otherwise) or ingest into a new knowledge base"
            )
        if note and note not in (kb.note or ""):
            changes["note"] = f"{kb.note}\n{note}".strip() if kb.note else note
        if changes:
            changes["update_time"] = now_ms()
            KnowledgeBase.update(**changes).where(KnowledgeBase.id == kb_id).execute()
