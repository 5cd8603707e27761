"""Issue 12, hole 5: a run still in flight when its document is removed must not leave chunks
behind, and a document of the same name submitted again must not reuse the removed one's task
ids (so neither the late run's chunks nor its terminal write can attach to the new one)."""

from __future__ import annotations

import numpy as np

from db.database import unit
from db.models import RUNNING, Chunk, Task
from ingest.chunking import Chunk as TextChunk
from ingest.control import remove_document
from ingest.producer import submit_documents
from ingest.search import vector_blocks
from ingest.store import store_chunks
from tests.lifecycle import rule


def _claim(task_id: str) -> int:
    """What an executor's claim does to the row; returns the attempt it now runs under."""
    with unit():
        Task.update(status=RUNNING, owner="late-executor", attempt=Task.attempt + 1).where(
            Task.id == task_id
        ).execute()
        return Task.get_by_id(task_id).attempt


def _late_write(kb_id: str, doc_id: str, task_id: str, attempt: int) -> str:
    """The late run's chunk write, as the parse handler makes it; how it ended."""
    items = [TextChunk(f"stale chunk {i}", page=0, token_num=2, position=i) for i in range(3)]
    vectors = np.ones((3, 4), dtype=np.float32) / 2
    try:
        store_chunks(
            kb_id=kb_id,
            doc_id=doc_id,
            task_id=task_id,
            generation=1,
            chunks=items,
            vectors=vectors,
            attempt=attempt,
        )
    except TypeError:  # no fence to pass the attempt to: the handlers' call as it was
        try:
            store_chunks(
                kb_id=kb_id, doc_id=doc_id, task_id=task_id, generation=1, chunks=items, vectors=vectors
            )
        except Exception as exc:
            return type(exc).__name__
    except Exception as exc:
        return type(exc).__name__
    return "written"


def _chunks_of(task_id: str) -> int:
    with unit():
        return Chunk.select().where(Chunk.task_id == task_id).count()


@rule("publish.generations")
def test_a_late_run_of_a_removed_document_leaves_no_chunks_and_a_resubmit_gets_new_task_ids(settings):
    first = submit_documents(settings, [("a.txt", b"the first a")], "kb1")
    (doc,) = first.documents
    (old_task,) = doc.task_ids
    attempt = _claim(old_task)

    remove_document(settings, doc.id)  # while the run is parsing
    assert _late_write(first.kb_id, doc.id, old_task, attempt) != "written"
    assert _chunks_of(old_task) == 0

    again = submit_documents(settings, [("a.txt", b"the second a")], "kb1")
    (new_doc,) = again.documents
    assert new_doc.id == doc.id and new_doc.generation == 1  # same name: same document id
    assert set(new_doc.task_ids).isdisjoint(doc.task_ids)  # but never the removed one's runs
    with unit():
        assert Task.get_or_none(Task.id == old_task) is None

    # the late run wakes up again (its claim of the old id long gone) and tries once more
    assert _late_write(first.kb_id, doc.id, old_task, attempt) != "written"
    assert _chunks_of(old_task) == 0
    with unit():
        assert [ids for ids, _ in vector_blocks(first.kb_id, 4)] == []


def test_a_running_task_writes_its_chunks_and_a_cancelled_one_cannot(settings):
    result = submit_documents(settings, [("a.txt", b"a"), ("b.txt", b"b")], "kb1")
    a, b = result.documents
    attempt_a, attempt_b = _claim(a.task_ids[0]), _claim(b.task_ids[0])
    assert _late_write(result.kb_id, a.id, a.task_ids[0], attempt_a) == "written"
    assert _chunks_of(a.task_ids[0]) == 3
    with unit():
        Task.update(status="cancelled").where(Task.id == b.task_ids[0]).execute()
    assert _late_write(result.kb_id, b.id, b.task_ids[0], attempt_b) != "written"
    assert _chunks_of(b.task_ids[0]) == 0


@rule("claim.fenced")
def test_a_task_on_a_later_attempt_writes_under_that_attempt_and_not_under_an_older_one(settings):
    result = submit_documents(settings, [("a.txt", b"a")], "kb1")
    (doc,) = result.documents
    (tid,) = doc.task_ids
    _claim(tid)
    attempt = _claim(tid)  # reclaimed: a second run
    assert attempt == 2
    assert _late_write(result.kb_id, doc.id, tid, 1) == "TaskLost"  # the first run, fenced out
    assert _chunks_of(tid) == 0
    assert _late_write(result.kb_id, doc.id, tid, attempt) == "written"
    items = [TextChunk("no attempt given", page=0, token_num=2, position=0)]
    store_chunks(
        kb_id=result.kb_id, doc_id=doc.id, task_id=tid, generation=1, chunks=items, vectors=np.ones((1, 4))
    )
    assert _chunks_of(tid) == 1  # the handlers' call (no attempt): fenced on running only
