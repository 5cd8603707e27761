"""Prune with a vector engine that refuses to forget the pruned chunks' vectors: the rows are the
record, so they go all the same; what the engine kept is logged for ``ingest reindex``, and
prune raises nothing (the reconciler prunes in every executor's pass, once an hour)."""

from __future__ import annotations

import logging
from typing import Any

from db.database import unit
from db.models import DONE, Chunk, Task, now_ms
from ingest import vectors
from ingest.milvus import VectorStoreUnavailable
from ingest.producer import enqueue_tasks
from ingest.prune import prune_tasks

DAY_MS = 86_400_000


def test_prune_with_an_engine_that_refuses_removes_the_rows_and_raises_nothing(settings, monkeypatch, caplog):
    (tid,) = enqueue_tasks(settings, [{"task_type": "noop"}])  # a row of no document: prunable
    chunk_ids = [f"{tid[:24]}{i:08d}" for i in range(3)]
    with unit():
        Chunk.insert_many(
            [
                {"id": cid, "kb_id": "", "doc_id": "", "task_id": tid, "generation": 1}
                | {"position": i, "content": f"chunk {i}", "token_num": 2}
                for i, cid in enumerate(chunk_ids)
            ]
        ).execute()
        Task.update(status=DONE, progress=1.0, generation=1, update_time=now_ms() - 40 * DAY_MS).where(
            Task.id == tid
        ).execute()
    asked: list[dict[str, Any]] = []

    def refuse(**kw: Any) -> None:
        asked.append(kw)
        raise VectorStoreUnavailable("vector engine at milvus://x: connection refused")

    monkeypatch.setattr(vectors, "forget", refuse)
    with caplog.at_level(logging.WARNING):
        result = prune_tasks(settings, 30 * 86400)
    assert (result.tasks_removed, result.chunks_removed) == (1, 3)
    with unit():
        assert not Task.select().where(Task.id == tid).exists()
        assert Chunk.select().where(Chunk.task_id == tid).count() == 0
    assert [sorted(kw["ids"]) for kw in asked] == [chunk_ids]
    assert any(
        "vectors not removed from the engine" in r.getMessage()
        and "VectorStoreUnavailable" in r.getMessage()
        and "ingest reindex" in r.getMessage()
        for r in caplog.records
    )
