"""Search: the top chunks of a knowledge base by cosine similarity to a query.

Only chunks of each document's current generation count. Vectors are read in blocks (keyset
pagination by chunk id, :data:`BLOCK_ROWS` rows a block) and scored with one matrix product
per block while a running top-k is kept, so memory stays bounded however large the knowledge
base grows; texts and names are read for the final top-k only. The query is embedded by the
same model in the calling process, through its ONNX export when there is one
(:mod:`ingest.query_encoder`: no torch), else through sentence-transformers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import peewee

from db.config import Settings
from db.database import connection, init_database
from db.models import Chunk as ChunkRow
from db.models import Document, KnowledgeBase
from ingest.errors import NotFound, PermanentError
from ingest.ids import kb_id as kb_id_of
from ingest.query_encoder import query_encoder

BLOCK_ROWS = 4096


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    doc_id: str
    doc_name: str
    page: int
    score: float
    content: str


def search(
    settings: Settings,
    kb_name: str,
    query: str,
    k: int = 5,
    tenant_id: str = "default",
    *,
    block_rows: int = BLOCK_ROWS,
) -> list[Hit]:
    """The ``k`` chunks of knowledge base ``kb_name`` closest to ``query``, best first."""
    if k <= 0:
        return []
    init_database(settings.db_url)
    with connection():
        kb = KnowledgeBase.get_or_none(KnowledgeBase.id == kb_id_of(tenant_id, kb_name))
    if kb is None:
        raise NotFound(f"no knowledge base named {kb_name!r} (tenant {tenant_id!r})")
    if not kb.embedding_dim:
        return []  # nothing embedded yet
    embedder = query_encoder(settings)
    if embedder.dim != kb.embedding_dim or (kb.embedding_model and kb.embedding_model != embedder.identity):
        raise PermanentError(
            f"knowledge base {kb_name!r} was embedded with {kb.embedding_model} (dimension "
            f"{kb.embedding_dim}); set INGEST_EMBEDDING_MODEL to that model to search it "
            f"(now {embedder.identity}, dimension {embedder.dim})"
        )
    query_vector = embedder.encode([query])[0]
    top = top_k(vector_blocks(kb.id, embedder.dim, block_rows), query_vector, k)
    return _hits(top)


def vector_blocks(
    kb_id: str, dim: int, block_rows: int = BLOCK_ROWS
) -> Iterator[tuple[list[str], np.ndarray]]:
    """``(chunk ids, float32 matrix)`` blocks of the knowledge base's current chunks, by id."""
    current = (Document.id == ChunkRow.doc_id) & (Document.generation == ChunkRow.generation)
    query = (
        ChunkRow.select(ChunkRow.id, ChunkRow.vector)
        .join(Document, on=current)
        .where((ChunkRow.kb_id == kb_id) & ChunkRow.vector.is_null(False))
    )
    return keyset_vector_blocks(query, ChunkRow.id, dim, block_rows)


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
        good = [(rid, bytes(vec)) for rid, vec in rows if vec is not None and len(vec) == dim * 4]
        if good:
            matrix = np.frombuffer(b"".join(v for _, v in good), dtype=np.float32).reshape(len(good), dim)
            yield [rid for rid, _ in good], matrix
        if len(rows) < block_rows:
            return


def top_k(
    blocks: Iterable[tuple[list[str], np.ndarray]], query_vector: np.ndarray, k: int
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


def _hits(top: list[tuple[str, float]]) -> list[Hit]:
    if not top:
        return []
    with connection():
        rows = {
            row[0]: row
            for row in ChunkRow.select(
                ChunkRow.id, ChunkRow.doc_id, Document.name, ChunkRow.page, ChunkRow.content
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
            page=rows[cid][3],
            score=score,
            content=rows[cid][4],
        )
        for cid, score in top
        if cid in rows
    ]
