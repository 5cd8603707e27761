"""Rebuilding a vector engine from the chunk rows, and telling when it has lost them.

``ingest reindex [--kb NAME]`` upserts every chunk row that has a vector into the bound engine
again, in keyset blocks of the ``(kb_id, id)`` index (the rows hold the vectors, so nothing is
embedded again), then removes the engine's ids of the knowledge base that have no row. Searches
go on answering throughout, and a reindex stopped half way (Ctrl-C, the engine away) loses
nothing: run it again. Writes that executors make meanwhile
are upserts of the same kind: run it when the fleet is quiet, or again after.
``ingest status`` compares each knowledge base's rows with the engine's count
(:func:`engine_counts`): an engine that lost its file, or was never filled, shows there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import peewee

from db.config import Settings
from db.database import connection, init_database
from db.models import Chunk as ChunkRow
from db.models import KnowledgeBase
from ingest import vectors
from ingest.errors import NotFound
from ingest.ids import kb_id as kb_id_of
from ingest.store import vector_from_bytes

BLOCK_ROWS = 2000
KBS_COUNTED = 200  # ``ingest status`` compares this many knowledge bases, the largest first


@dataclass(frozen=True)
class KbCount:
    kb_id: str
    name: str
    tenant_id: str
    rows: int  # chunk rows with a vector (every generation still stored)
    engine: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ref(kb: KnowledgeBase) -> vectors.KbRef:
    return vectors.KbRef(kb.tenant_id, kb.id, int(kb.embedding_dim), kb.embedding_model)


def _kbs(kb_name: str | None, tenant_id: str) -> list[KnowledgeBase]:
    with connection():
        query = KnowledgeBase.select().where(KnowledgeBase.embedding_dim > 0)
        if kb_name is not None:
            query = query.where(KnowledgeBase.id == kb_id_of(tenant_id, kb_name))
        found = list(query.order_by(KnowledgeBase.id))
    if kb_name is not None and not found:
        raise NotFound(f"no knowledge base {kb_name!r} with vectors (tenant {tenant_id!r})")
    return found


def row_count(kb_id: str) -> int:
    with connection():
        return int(
            ChunkRow.select().where((ChunkRow.kb_id == kb_id) & ChunkRow.vector.is_null(False)).count()
        )


def reindex(
    settings: Settings,
    kb_name: str | None = None,
    *,
    tenant_id: str = "default",
    on_progress: Callable[[str, int, int], None] | None = None,
) -> list[KbCount]:
    """Rebuild the engine's vectors of one knowledge base (or all) from the rows."""
    init_database(settings.db_url)
    store = vectors.use(settings)
    done: list[KbCount] = []
    for kb in _kbs(kb_name, tenant_id):
        total = row_count(kb.id)
        if on_progress:
            on_progress(kb.name, 0, total)
        if store.exact:
            done.append(KbCount(kb.id, kb.name, kb.tenant_id, total, total))
            continue
        pages = getattr(store, "chunk_id_pages", None)
        if pages is None:  # an engine that cannot list its ids: emptied first
            store.delete(kb_id=kb.id)
        written = _copy(store, kb, total, on_progress)
        if pages is not None:
            _drop_strays(store, kb, pages)
        flush = getattr(store, "flush", None)
        if flush is not None:
            flush()  # the bulk load into indexed segments
        done.append(KbCount(kb.id, kb.name, kb.tenant_id, written, store.count(_ref(kb))))
    return done


def _copy(
    store: vectors.VectorStore,
    kb: KnowledgeBase,
    total: int,
    on_progress: Callable[[str, int, int], None] | None,
) -> int:
    ref, last, written = _ref(kb), "", 0
    while True:
        with connection():
            rows = list(
                ChunkRow.select(ChunkRow.id, ChunkRow.doc_id, ChunkRow.task_id, ChunkRow.vector)
                .where((ChunkRow.kb_id == kb.id) & ChunkRow.vector.is_null(False) & (ChunkRow.id > last))
                .order_by(ChunkRow.id)
                .limit(BLOCK_ROWS)
                .tuples()
            )
        if not rows:
            return written
        last = rows[-1][0]
        good = [r for r in rows if len(r[3]) == ref.dim * 4]
        store.upsert(ref, [vectors.VectorRow(r[0], r[1], r[2], vector_from_bytes(bytes(r[3]))) for r in good])
        written += len(good)
        if on_progress:
            on_progress(kb.name, written, total)


def _drop_strays(store: vectors.VectorStore, kb: KnowledgeBase, pages: Any) -> int:
    """After the copy (the engine answered searches all along): remove the engine's ids of the
    knowledge base that have no chunk row with a vector (rows removed while the engine was
    away). Returns how many."""
    removed = 0
    for ids in pages(_ref(kb)):  # pages by primary key: removing ids already passed is safe
        with connection():
            kept = {
                cid
                for (cid,) in ChunkRow.select(ChunkRow.id)
                .where((ChunkRow.kb_id == kb.id) & ChunkRow.id.in_(ids) & ChunkRow.vector.is_null(False))
                .tuples()
            }
        strays = [cid for cid in ids if cid not in kept]
        if strays:
            store.delete(ids=strays)
            removed += len(strays)
    return removed


def engine_counts(settings: Settings) -> dict[str, Any]:
    """The bound store's name, and rows against engine count for the largest knowledge bases;
    ``differs`` lists those whose counts differ (``ingest reindex`` rebuilds them)."""
    init_database(settings.db_url)
    store = vectors.use(settings)
    with connection():
        sizes = list(
            ChunkRow.select(ChunkRow.kb_id, peewee.fn.COUNT(ChunkRow.id).alias("n"))
            .where(ChunkRow.vector.is_null(False))
            .group_by(ChunkRow.kb_id)
            .order_by(peewee.SQL("n DESC"))
            .limit(KBS_COUNTED)
            .tuples()
        )
        kbs = {kb.id: kb for kb in KnowledgeBase.select().where(KnowledgeBase.id.in_([k for k, _ in sizes]))}
    counts = []
    for kb_id, n in sizes:
        kb = kbs.get(kb_id)
        if kb is None or not kb.embedding_dim:
            continue
        engine = int(n) if store.exact else store.count(_ref(kb))
        counts.append(KbCount(kb.id, kb.name, kb.tenant_id, int(n), engine))
    differs = [c.to_dict() for c in counts if c.rows != c.engine]
    return {
        "store": store.name,
        "knowledge_bases": [c.to_dict() for c in counts],
        "differs": differs,
    }
