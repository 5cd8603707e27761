"""Search: the top chunks of a knowledge base by cosine similarity to a query.

Only chunks of each document's current generation count. Where the vectors are searched is the
vector store's business (:mod:`ingest.vectors`: the chunk rows, exactly, in blocks of the
knowledge base's own index; or an engine such as Milvus); what an engine returns is checked
against the rows (still there, of the document's current generation) and it is asked for more
when too few remain. Texts and names are read for the final top-k only. The query is embedded
by the same model in the calling process, through its ONNX export when there is one
(:mod:`ingest.query_encoder`: no torch), else through sentence-transformers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from db.config import Settings
from db.database import connection, init_database, is_mysql
from db.models import Chunk as ChunkRow
from db.models import Document, KnowledgeBase
from ingest import vectors
from ingest.errors import NotFound, PermanentError
from ingest.ids import kb_id as kb_id_of
from ingest.keywords import fuse, keyword_available, keyword_top
from ingest.query_encoder import query_encoder
from ingest.vectors import BLOCK_ROWS, KbRef, keyset_vector_blocks, top_k, vector_blocks

__all__ = ["BLOCK_ROWS", "MODES", "Hit", "keyset_vector_blocks", "search", "top_k", "vector_blocks"]
MODES = ("dense", "keyword", "hybrid")
_ENCODE_LOCK = threading.Lock()  # one query encode at a time per process
DEFAULT_MODE = "hybrid"  # bench/retrieval.py: hybrid ranks the answer first most often (README)
FUSE_DEPTH = 50  # each list's candidates fused in hybrid mode (at least k)
ENGINE_OVERFETCH = 2  # an engine is asked for this many times k (plus 10) candidates at first
ENGINE_ROUNDS = 4  # and up to 4x more each round while checked candidates fall short of k


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    doc_id: str
    doc_name: str
    page: int | None  # first page of the chunk (1-based); None for a format without pages
    score: float
    content: str
    last_page: int | None = None  # the page it ends on (a chunk of pages 2-3: page 2, last_page 3)


def search(
    settings: Settings,
    kb_name: str,
    query: str,
    k: int = 5,
    tenant_id: str = "default",
    *,
    mode: str = DEFAULT_MODE,
    block_rows: int | None = None,
) -> list[Hit]:
    """The ``k`` chunks of knowledge base ``kb_name`` closest to ``query``, best first: by
    vector similarity (``dense``), by the words' full-text relevance (``keyword``), or both
    fused by reciprocal rank (``hybrid``; dense alone where the database has no full-text index).

    ``k`` above ``INGEST_SEARCH_MAX_K`` is refused (``ValueError``), and so is a blank ``query``:
    every chunk is as close to it as any, so its hits would be arbitrary."""
    if mode not in MODES:
        raise ValueError(f"search mode {mode!r}: use one of {', '.join(MODES)}")
    if k > settings.search_max_k:
        raise ValueError(f"-k {k} is more than {settings.search_max_k} (INGEST_SEARCH_MAX_K)")
    if not query.strip():
        raise ValueError("empty query")
    if k <= 0:
        return []
    init_database(settings.db_url)
    store = vectors.use(settings)
    with connection():
        kb = KnowledgeBase.get_or_none(KnowledgeBase.id == kb_id_of(tenant_id, kb_name))
    if kb is None:
        raise NotFound(f"no knowledge base named {kb_name!r} (tenant {tenant_id!r})")
    if not kb.embedding_dim:
        return []  # nothing embedded yet
    if mode == "keyword":
        return _hits(keyword_top(kb.id, query, k))
    embedder = query_encoder(settings)
    if embedder.dim != kb.embedding_dim or (kb.embedding_model and kb.embedding_model != embedder.identity):
        raise PermanentError(
            f"knowledge base {kb_name!r} was embedded with {kb.embedding_model} (dimension "
            f"{kb.embedding_dim}); set INGEST_EMBEDDING_MODEL to that model to search it "
            "(INGEST_EMBEDDING_BACKEND=onnx-int8 for a #onnx-int8 one, torch or onnx otherwise) "
            f"(now {embedder.identity}, dimension {embedder.dim})"
        )
    with _ENCODE_LOCK:  # CPU-bound: concurrent searches' encodes would only share the cores
        query_vector = embedder.encode([query])[0]
    ref = KbRef(tenant_id=kb.tenant_id, kb_id=kb.id, dim=kb.embedding_dim, model=kb.embedding_model)
    if block_rows is not None:  # exact, in blocks of this size (tests compare block sizes)
        store = vectors.MySQLStore(block_rows)
    if mode == "dense" or not keyword_available():
        return _hits(nearest(store, ref, query_vector, k))
    depth = max(k, FUSE_DEPTH)
    dense = nearest(store, ref, query_vector, depth)
    return _hits(fuse([dense, keyword_top(kb.id, query, depth)], k))


def nearest(
    store: vectors.VectorStore, kb: KbRef, query_vector: np.ndarray, k: int
) -> list[tuple[str, float]]:
    """The ``k`` best ``(chunk id, score)`` of the store, only current chunks of the rows."""
    if store.exact:
        return store.search(kb, query_vector, k)
    limit = ENGINE_OVERFETCH * k + 10
    for _ in range(ENGINE_ROUNDS):
        found = store.search(kb, query_vector, limit)
        current = _current(kb.kb_id, [cid for cid, _ in found])
        kept = [(cid, score) for cid, score in found if cid in current]
        if len(kept) >= k or len(found) < limit:
            break
        limit *= 4
    kept.sort(key=lambda hit: (-hit[1], hit[0]))
    return kept[:k]


def _current(kb_id: str, ids: list[str]) -> set[str]:
    """Those of ``ids`` that are chunk rows of ``kb_id`` of their document's current generation.

    Two lookups by primary key (the chunks, then their documents' generations), not a join:
    MariaDB drove a join from the document into the chunk table's ``(doc_id, generation)``
    index and read every chunk of the document (2-3.6 s for 30 ids at 1M chunks in one). The
    chunks' primary key is forced (:func:`current_chunks_sql`): left to itself, with a freshly
    loaded table's statistics, MariaDB read them through the ``(kb_id, id)`` index by ``kb_id``
    alone, every entry of the knowledge base (0.5-0.7 s for 30 ids at 1M chunks)."""
    if not ids:
        return set()
    rows: list[tuple[str, str, int]] = []
    with connection() as db:
        for start in range(0, len(ids), 1000):
            part = ids[start : start + 1000]
            if is_mysql():
                rows.extend(db.execute_sql(*current_chunks_sql(kb_id, part)).fetchall())
            else:
                rows.extend(
                    ChunkRow.select(ChunkRow.id, ChunkRow.doc_id, ChunkRow.generation)
                    .where((ChunkRow.kb_id == kb_id) & ChunkRow.id.in_(part))
                    .tuples()
                )
        docs = sorted({doc for _, doc, _ in rows})
        generation: dict[str, int] = {}
        for start in range(0, len(docs), 1000):
            generation.update(
                Document.select(Document.id, Document.generation)
                .where(Document.id.in_(docs[start : start + 1000]))
                .tuples()
            )
    return {cid for cid, doc, gen in rows if generation.get(doc) == gen}


def current_chunks_sql(kb_id: str, ids: list[str]) -> tuple[str, list[str]]:
    """MySQL's statement (and parameters) for the chunk rows of ``ids`` in ``kb_id``: one
    primary-key lookup each (``EXPLAIN`` it in tests)."""
    marks = ", ".join(["%s"] * len(ids))
    return (
        "SELECT id, doc_id, generation FROM chunk FORCE INDEX (PRIMARY) "  # noqa: S608 - placeholders only
        f"WHERE id IN ({marks}) AND kb_id = %s",
        [*ids, kb_id],
    )


def _hits(top: list[tuple[str, float]]) -> list[Hit]:
    if not top:
        return []
    with connection():
        rows = {
            row[0]: row
            for row in ChunkRow.select(
                ChunkRow.id,
                ChunkRow.doc_id,
                Document.name,
                ChunkRow.page,
                ChunkRow.content,
                ChunkRow.last_page,
            )
            .join(Document, on=(Document.id == ChunkRow.doc_id))
            .where(ChunkRow.id.in_([cid for cid, _ in top]))
            .tuples()
        }
    return [
        Hit(
            chunk_id=cid,
            doc_id=rows[cid][1],
            doc_name=rows[cid][2],
            page=rows[cid][3] or None,
            score=score,
            content=rows[cid][4],
            last_page=max(rows[cid][5] or 0, rows[cid][3] or 0) or None,
        )
        for cid, score in top
        if cid in rows
    ]
