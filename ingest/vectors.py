"""The vector store: where a knowledge base's vectors are searched, chosen by INGEST_VECTOR_STORE.

Two backends behind one small interface (:class:`VectorStore`):

- ``mysql`` (the default): the chunk rows themselves, scored exactly, in blocks that read only
  the knowledge base's own rows (the chunk table's ``(kb_id, id)`` index); writes and deletes
  are no-ops, the rows being the store;
- ``milvus:///PATH.db`` (Milvus Lite, embedded; :mod:`ingest.milvus`) or ``http(s)://HOST:19530``
  (a Milvus server or cluster): an engine with an approximate index.

The chunk rows in the database stay the durable record (text, metadata and the vector): an
engine holds a copy keyed by chunk id, written by idempotent upserts in the transaction that
writes the rows (after the row fence, so a fenced-out run writes nothing there either), and
told of every removal (rm, cancel, a new generation, prune, the reconciler). Whatever the
engine returns is checked against the rows (the document's current generation) before it is
shown, so a vector the engine still holds by mistake is never a hit; ``ingest status`` compares
counts and ``ingest reindex`` rebuilds an engine from the rows.

The process binds one store (:func:`use`, from the settings, at every entry point); code that
removes chunks without settings at hand (:mod:`ingest.documents`, :mod:`ingest.store`) tells
:func:`active`. Every call here is blocking: run it in a thread, like the database's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import peewee

from db.database import connection, is_mysql
from db.models import Chunk as ChunkRow
from db.models import Document

log = logging.getLogger(__name__)

MYSQL = "mysql"
BLOCK_ROWS = 4096


@dataclass(frozen=True)
class KbRef:
    """What an engine needs to know of a knowledge base: its owner, id and vector space."""

    tenant_id: str
    kb_id: str
    dim: int
    model: str


@dataclass(frozen=True)
class VectorRow:
    id: str
    doc_id: str
    task_id: str
    vector: np.ndarray


class VectorStore(Protocol):
    name: str
    exact: bool  # True: search returns only current chunks, scored exactly (no check needed)

    def upsert(self, kb: KbRef, rows: Sequence[VectorRow]) -> None: ...

    def delete(
        self,
        *,
        ids: Sequence[str] = (),
        task_ids: Sequence[str] = (),
        doc_ids: Sequence[str] = (),
        kb_id: str | None = None,
    ) -> None: ...

    def search(self, kb: KbRef, query_vector: np.ndarray, limit: int) -> list[tuple[str, float]]: ...

    def count(self, kb: KbRef) -> int: ...

    def close(self) -> None: ...


class MySQLStore:
    """The rows are the store: exact search in keyset blocks of the knowledge base's index."""

    name = MYSQL
    exact = True

    def __init__(self, block_rows: int = BLOCK_ROWS) -> None:
        self.block_rows = block_rows

    def upsert(self, kb: KbRef, rows: Sequence[VectorRow]) -> None:
        return None

    def delete(self, **_: Any) -> None:
        return None

    def search(self, kb: KbRef, query_vector: np.ndarray, limit: int) -> list[tuple[str, float]]:
        return top_k(vector_blocks(kb.kb_id, kb.dim, self.block_rows), query_vector, limit)

    def count(self, kb: KbRef) -> int:
        with connection():
            return int(
                ChunkRow.select().where((ChunkRow.kb_id == kb.kb_id) & ChunkRow.vector.is_null(False)).count()
            )

    def close(self) -> None:
        return None


# MariaDB left to itself may read the chunk table by its primary key (ORDER BY id LIMIT) and pass
# over other knowledge bases' rows (measured: 55,605 rows read for a 5k-chunk base beside a 100k
# one), and a join to the document table can turn the ordered range into a sort of the whole
# range, vectors and all, for every block (a block-nested-loop join buffer when the base has few
# documents). So one table, one forced range of the (kb_id, id) index, in its own order; the
# current generation is checked against the documents' generations, read once per search.
_MYSQL_BLOCK = (
    "SELECT id, doc_id, generation, vector FROM chunk FORCE INDEX (chunk_kb_id_id) "
    "WHERE kb_id = %s AND id > %s AND vector IS NOT NULL ORDER BY id LIMIT %s"
)


def vector_blocks(
    kb_id: str, dim: int, block_rows: int = BLOCK_ROWS
) -> Iterator[tuple[list[str], np.ndarray]]:
    """``(chunk ids, float32 matrix)`` blocks of the knowledge base's current chunks, by id:
    on MySQL a range of the ``(kb_id, id)`` index per block (:data:`_MYSQL_BLOCK`), each row
    kept when its generation is its document's."""
    if is_mysql():
        return _mysql_blocks(kb_id, dim, block_rows)
    current = (Document.id == ChunkRow.doc_id) & (Document.generation == ChunkRow.generation)
    query = (
        ChunkRow.select(ChunkRow.id, ChunkRow.vector)
        .join(Document, on=current)
        .where((ChunkRow.kb_id == kb_id) & ChunkRow.vector.is_null(False))
    )
    return keyset_vector_blocks(query, ChunkRow.id, dim, block_rows)


def mysql_block_sql(kb_id: str, after: str, block_rows: int) -> tuple[str, tuple[Any, ...]]:
    """The statement (and parameters) that reads one block on MySQL (``EXPLAIN`` it in tests)."""
    return _MYSQL_BLOCK, (kb_id, after, int(block_rows))


def _mysql_blocks(kb_id: str, dim: int, block_rows: int) -> Iterator[tuple[list[str], np.ndarray]]:
    with connection():
        current = dict(
            Document.select(Document.id, Document.generation).where(Document.kb_id == kb_id).tuples()
        )
    last = ""
    while True:
        with connection() as db:
            rows = list(db.execute_sql(*mysql_block_sql(kb_id, last, block_rows)).fetchall())
        if not rows:
            return
        last = rows[-1][0]
        yield from _matrix([(cid, vec) for cid, doc, gen, vec in rows if current.get(doc) == gen], dim)
        if len(rows) < block_rows:
            return


def _matrix(rows: list[tuple[str, Any]], dim: int) -> Iterator[tuple[list[str], np.ndarray]]:
    good = [(rid, bytes(vec)) for rid, vec in rows if vec is not None and len(vec) == dim * 4]
    if good:
        matrix = np.frombuffer(b"".join(v for _, v in good), dtype=np.float32).reshape(len(good), dim)
        yield [rid for rid, _ in good], matrix


def keyset_vector_blocks(
    query: peewee.Select, key: peewee.Field, dim: int, block_rows: int = BLOCK_ROWS
) -> Iterator[tuple[list[str], np.ndarray]]:
    """``(ids, float32 matrix)`` blocks of the ``(id, vector)`` rows ``query`` selects, read by
    keyset pagination on ``key`` (``key > last ORDER BY key``: give it an index that starts
    with the query's equality columns and ends with ``key``). Vectors that are not ``dim``
    float32 values are left out; each block is read on a connection of its own."""
    last = ""
    while True:
        with connection():
            rows = list(query.where(key > last).order_by(key).limit(block_rows).tuples())
        if not rows:
            return
        last = rows[-1][0]
        yield from _matrix(rows, dim)
        if len(rows) < block_rows:
            return


def top_k(
    blocks: Iterator[tuple[list[str], np.ndarray]] | list[tuple[list[str], np.ndarray]],
    query_vector: np.ndarray,
    k: int,
) -> list[tuple[str, float]]:
    """The ``k`` best ``(id, score)`` over all blocks, score descending, then id ascending."""
    query = np.asarray(query_vector, dtype=np.float32)
    best_ids = np.empty(0, dtype=object)
    best_scores = np.empty(0, dtype=np.float32)
    for ids, matrix in blocks:
        scores = np.concatenate([best_scores, matrix @ query])
        all_ids = np.concatenate([best_ids, np.asarray(ids, dtype=object)])
        keep = _best(all_ids, scores, k)
        best_ids, best_scores = all_ids[keep], scores[keep]
    return [(str(i), float(s)) for i, s in zip(best_ids, best_scores, strict=True)]


def _best(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    if len(scores) > 4 * k:  # cut to a few candidates first (ties at the edge all kept)
        edge = np.partition(scores, len(scores) - k)[len(scores) - k]
        candidates = np.nonzero(scores >= edge)[0]
    else:
        candidates = np.arange(len(scores))
    order = sorted(candidates, key=lambda i: (-float(scores[i]), ids[i]))
    return np.asarray(order[:k], dtype=np.intp)


# -- the process's store -------------------------------------------------------------------

_lock = threading.Lock()
_stores: dict[str, VectorStore] = {}
_active: list[VectorStore] = []


def open_vector_store(url: str) -> VectorStore:
    """The store at ``url`` (one per URL and process)."""
    url = (url or MYSQL).strip()
    with _lock:
        store = _stores.get(url)
        if store is None:
            if url == MYSQL:
                store = MySQLStore()
            elif url.startswith(("milvus://", "http://", "https://")):
                from ingest.milvus import MilvusStore

                store = MilvusStore(url)
            else:
                raise ValueError(
                    f"INGEST_VECTOR_STORE: {url!r} is not mysql, milvus:///PATH.db or http(s)://HOST:19530"
                )
            _stores[url] = store
        return store


def use(settings: Any) -> VectorStore:
    """Bind the process to the store its settings name, and return it."""
    store = open_vector_store(settings.vector_store)
    if not isinstance(store, MySQLStore):  # an engine: its search breadth is a setting
        from ingest.milvus import MilvusStore

        if isinstance(store, MilvusStore):
            store.search_ef = int(getattr(settings, "vector_search_ef", 0) or 0)
    with _lock:
        _active[:] = [store]
    return store


def active() -> VectorStore:
    """The store :func:`use` bound (``mysql`` until then)."""
    with _lock:
        if _active:
            return _active[0]
    return open_vector_store(MYSQL)


def close_all() -> None:
    """Close every store this process opened (a Milvus Lite server this process serves stops)."""
    with _lock:
        stores = list(_stores.values())
        _stores.clear()
        _active.clear()
    for store in stores:
        store.close()


def forget(
    *,
    ids: Sequence[str] = (),
    task_ids: Sequence[str] = (),
    doc_ids: Sequence[str] = (),
    kb_id: str | None = None,
) -> None:
    """Remove chunks from the bound store's engine (nothing for ``mysql``)."""
    if ids or task_ids or doc_ids or kb_id:
        active().delete(ids=list(ids), task_ids=list(task_ids), doc_ids=list(doc_ids), kb_id=kb_id)


def forget_or_log(
    *,
    what: str = "removed chunks'",
    ids: Sequence[str] = (),
    task_ids: Sequence[str] = (),
    doc_ids: Sequence[str] = (),
    kb_id: str | None = None,
) -> bool:
    """:func:`forget`, for removals whose chunk rows are gone (or going) for good: the rows are
    the record, and search drops a hit without its row, so an engine that refuses (down, or
    refusing this call) leaves vectors nobody finds. That must neither undo the removal nor end
    the caller (a finisher's write, a reconcile pass, a prune, and with them the daemon): the
    error is logged (``what`` names the vectors) and False returned; ``ingest status`` counts
    what the engine kept, and ``ingest reindex`` removes it."""
    named = {"ids": ids, "task_ids": task_ids, "doc_ids": doc_ids}
    asked: dict[str, Any] = {name: list(given) for name, given in named.items() if given}
    if kb_id:
        asked["kb_id"] = kb_id
    if not asked:
        return True
    try:
        forget(**asked)
    except Exception as exc:  # noqa: BLE001 - any engine error: the rows are the record
        log.warning(
            "%s vectors not removed from the engine (ingest reindex repairs what it kept): %s: %s",
            what,
            type(exc).__name__,
            exc,
        )
        return False
    return True
