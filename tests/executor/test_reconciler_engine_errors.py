"""A vector engine that refuses while the reconciler removes a cancelled task's chunks, or
prunes finished tasks past their retention: the rows are the record (their removal stands), the
engine's leftovers are logged for ``ingest reindex``, and the pass, and with it the executor,
goes on."""

from __future__ import annotations

import logging

from db.database import unit
from db.models import CANCELLED, DONE, Chunk, Task, now_ms
from executor.context import Limiters
from executor.outage import Outage
from executor.reconciler import Reconciler
from ingest import vectors
from ingest.milvus import VectorStoreUnavailable
from tests.executor.support import enqueue, make_document, task_spec

DAY_MS = 86_400_000


async def test_an_engine_that_refuses_to_forget_a_cancelled_tasks_vectors_ends_no_pass(
    xsettings, streams, rclient, keys, db, monkeypatch, caplog
):
    kb_id, doc_id = make_document()
    (tid,) = enqueue(
        streams, [task_spec("noop", doc_id=doc_id, kb_id=kb_id, status=CANCELLED)], publish=False
    )
    with unit():
        Task.update(update_time=1).where(Task.id == tid).execute()
        Chunk.insert(id="c" * 32, kb_id=kb_id, doc_id=doc_id, task_id=tid, position=0, content="x").execute()

    def refuse(**kw: object) -> None:
        raise VectorStoreUnavailable("vector engine at milvus://x: connection refused")

    monkeypatch.setattr(vectors, "forget", refuse)
    s = xsettings.replace(reconcile_grace_s=1.0)
    rec = Reconciler(s, streams, Limiters.for_settings(s), Outage("db"), Outage("redis"))
    with caplog.at_level(logging.WARNING, logger="executor.reconciler"):
        report = await rec.reconcile_once()
    assert report is not None and report.chunks_removed == 1
    with unit():
        assert Chunk.select().where(Chunk.task_id == tid).count() == 0
    assert any(
        "vectors not removed from the engine" in r.getMessage() and "VectorStoreUnavailable" in r.getMessage()
        for r in caplog.records
    )


async def test_an_engine_that_refuses_to_forget_pruned_vectors_ends_no_pass(
    xsettings, streams, rclient, keys, db, monkeypatch, caplog
):
    (tid,) = enqueue(streams, [task_spec("noop", status=DONE, generation=1)], publish=False)  # no document
    with unit():
        Task.update(update_time=now_ms() - 40 * DAY_MS).where(Task.id == tid).execute()
        Chunk.insert(
            id="p" * 32, kb_id="", doc_id="", task_id=tid, generation=1, position=0, content="x"
        ).execute()

    def refuse(**kw: object) -> None:
        raise VectorStoreUnavailable("vector engine at milvus://x: connection refused")

    monkeypatch.setattr(vectors, "forget", refuse)
    s = xsettings.replace(reconcile_grace_s=1.0, task_retention_s=30 * 86400.0)
    rec = Reconciler(s, streams, Limiters.for_settings(s), Outage("db"), Outage("redis"))
    with caplog.at_level(logging.WARNING):
        report = await rec.reconcile_once()  # the hourly prune runs at the first pass
    assert report is not None and report.tasks_pruned == 1
    with unit():
        assert not Task.select().where(Task.id == tid).exists()
        assert Chunk.select().where(Chunk.task_id == tid).count() == 0
    assert any("vectors not removed from the engine" in r.getMessage() for r in caplog.records)
