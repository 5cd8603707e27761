"""A retryable service error during a task's terminal write never turns the task into a failure
(LIFECYCLE, "Errors"): a vector engine that cannot forget an older generation's vectors leaves a
warning (``ingest reindex`` repairs what it kept) and the task done; any other retryable error of
the write makes the finisher back off and write the batch again, as a lost database would."""

from __future__ import annotations

import logging
from typing import Any

from db.database import unit
from db.models import DONE, Chunk, Document
from executor import finisher
from ingest import vectors
from ingest.milvus import VectorStoreUnavailable
from tests.executor.support import all_in, enqueue, make_document, row, running_daemon, task_spec
from tests.helpers import await_until

OLD_CHUNK = "old" + "0" * 29


def _resubmitted_document() -> tuple[str, str]:
    """A document in its second generation, with one chunk of the first left to remove."""
    kb_id, doc_id = make_document()
    with unit():
        Document.update(generation=2).where(Document.id == doc_id).execute()
        Chunk.insert(
            id=OLD_CHUNK,
            kb_id=kb_id,
            doc_id=doc_id,
            task_id="x" * 32,
            generation=1,
            position=0,
            content="old",
        ).execute()
    return kb_id, doc_id


async def test_a_done_task_stays_done_when_the_engine_cannot_forget_the_older_generation(
    xsettings, streams, db, monkeypatch, caplog
):
    kb_id, doc_id = _resubmitted_document()
    asked: list[dict[str, Any]] = []

    def unreachable(**kw: Any) -> None:
        asked.append(kw)
        raise VectorStoreUnavailable("vector engine at milvus://x: connection refused")

    monkeypatch.setattr(vectors, "forget", unreachable)
    (tid,) = enqueue(streams, [task_spec("noop", doc_id=doc_id, kb_id=kb_id, generation=2)])
    with caplog.at_level(logging.WARNING, logger="ingest.documents"):
        async with running_daemon(xsettings, "host_1"):
            await await_until(lambda: all_in([tid], "done", "failed"), 20)
    task = row(tid)
    assert task["status"] == DONE, task["progress_msg"]
    assert asked == [{"ids": [OLD_CHUNK]}]
    with unit():
        assert not Chunk.select().where(Chunk.id == OLD_CHUNK).exists()  # the rows are the record
        assert Document.get_by_id(doc_id).run == DONE
    assert any(
        "not removed from the engine" in r.getMessage() and "VectorStoreUnavailable" in r.getMessage()
        for r in caplog.records
    )


async def test_a_retryable_error_of_the_terminal_write_is_retried_never_written_as_failed(
    xsettings, streams, db, monkeypatch, caplog
):
    kb_id, doc_id = make_document()
    real = finisher.recompute_documents
    calls: list[list[str]] = []

    def away_twice(doc_ids: list[str]) -> None:
        calls.append(list(doc_ids))
        if len(calls) <= 2:  # the batch's write, then (before the fix) the one-by-one write
            raise VectorStoreUnavailable("vector engine at milvus://x: connection refused")
        real(doc_ids)

    monkeypatch.setattr(finisher, "recompute_documents", away_twice)
    (tid,) = enqueue(streams, [task_spec("noop", doc_id=doc_id, kb_id=kb_id)])
    with caplog.at_level(logging.WARNING, logger="executor.outage"):
        async with running_daemon(xsettings, "host_1"):
            await await_until(lambda: all_in([tid], "done", "failed"), 20)
    task = row(tid)
    assert task["status"] == DONE and "could not write the outcome" not in task["progress_msg"], task
    assert len(calls) == 3
    messages = [r.getMessage() for r in caplog.records]
    assert any("unreachable, backing off: VectorStoreUnavailable" in m for m in messages), messages
    assert any("back after 2 failed call(s)" in m for m in messages), messages
