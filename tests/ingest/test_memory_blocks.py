"""Memory search reads a memory's vectors in keyset blocks (the reader search uses, on the
(memory_id, id) index): every vector of that memory once, no other memory's, whatever the block."""

from __future__ import annotations

import numpy as np
import pytest

from db.database import is_mysql, unit
from db.models import RUNNING, MemoryMessage, Task
from ingest.errors import PermanentError
from ingest.memory import check_message, memory_model, model_query, store_message, vector_blocks
from ingest.search import top_k

DIM = 4


def _save(memory_id: str, n: int, vector: np.ndarray) -> str:
    raw = {"memory_id": memory_id, "source_id": f"s{n}", "message_dict": {"role": "user", "content": f"m{n}"}}
    return store_message(check_message(raw), vector, "t" * 32, default_position=n)


@pytest.mark.parametrize("block_rows", [1, 3, 7, 4096])
def test_blocks_hold_each_vector_of_the_memory_once_in_id_order(db, block_rows):
    with unit():  # the task the messages are stored for: store_message is fenced on its row
        Task.insert(id="t" * 32, task_type="memory", status=RUNNING, attempt=1).execute()
    rng = np.random.default_rng(7)
    vectors = {}
    for n in range(7):
        vector = rng.standard_normal(DIM).astype(np.float32)
        vectors[_save("m1", n, vector)] = vector
        _save("m2", n, rng.standard_normal(DIM).astype(np.float32))  # another memory: never read
    store_message(
        check_message(
            {"memory_id": "m1", "source_id": "bad", "message_dict": {"role": "user", "content": "x"}}
        ),
        np.zeros(DIM + 1, dtype=np.float32),  # another dimension: left out
        "t" * 32,
        default_position=99,
    )
    blocks = list(vector_blocks("m1", DIM, block_rows))
    ids = [i for block_ids, _ in blocks for i in block_ids]
    assert ids == sorted(vectors) and all(len(b) <= block_rows for b, _ in blocks)
    for block_ids, matrix in blocks:
        assert matrix.shape == (len(block_ids), DIM)
        for i, row in zip(block_ids, matrix, strict=True):
            assert np.array_equal(row, vectors[i])
    query = rng.standard_normal(DIM).astype(np.float32)
    every = sorted(((i, float(v @ query)) for i, v in vectors.items()), key=lambda p: (-p[1], p[0]))[:3]
    assert [i for i, _ in top_k(vector_blocks("m1", DIM, block_rows), query, 3)] == [i for i, _ in every]


def test_a_memory_refuses_vectors_of_another_model(db):
    """A memory's vectors are of one model, as a knowledge base's: an executor embedding with
    another (INGEST_EMBEDDING_MODEL or _BACKEND changed) fails its task and writes nothing."""
    with unit():
        Task.insert(id="t" * 32, task_type="memory", status=RUNNING, attempt=1).execute()

    def save(source: str, model: str) -> str:
        raw = {"memory_id": "m1", "source_id": source, "message_dict": {"role": "user", "content": source}}
        return store_message(check_message(raw), np.ones(DIM, np.float32), "t" * 32, 0, model=model)

    save("a", "model-a")
    save("b", "model-a")
    with pytest.raises(PermanentError, match="holds messages embedded with model-a"):
        save("c", "model-b#onnx-int8")
    with unit():
        assert sorted(m.source_id for m in MemoryMessage.select()) == ["a", "b"]
        assert memory_model("default", "m1") == "model-a"
        assert memory_model("default", "m2") == ""


def test_the_model_check_reads_a_range_of_an_index_not_the_memory(db):
    """Every store asks whether the memory holds another model's vectors: on MySQL that is a
    range of the (memory_id, embedding_model) index, whatever the memory's size."""
    if not is_mysql():
        pytest.skip("EXPLAIN's plan is MySQL's")
    with unit():
        Task.insert(id="t" * 32, task_type="memory", status=RUNNING, attempt=1).execute()
    for n in range(50):
        raw = {"memory_id": "m1", "source_id": f"s{n}", "message_dict": {"role": "user", "content": "x"}}
        store_message(check_message(raw), np.ones(DIM, np.float32), "t" * 32, n, model="model-a")
    with unit() as conn:
        conn.execute_sql("ANALYZE TABLE memory_message")
        sql, params = model_query("default", "m1", besides="model-a").sql()
        cursor = conn.execute_sql("EXPLAIN " + sql, params)
        names = [d[0] for d in cursor.description]
        (plan,) = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    assert plan["key"] == "memory_message_memory_id_embedding_model" and plan["type"] == "range", plan
