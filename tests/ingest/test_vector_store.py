"""The vector store on both backends: tenants apart, no orphan vectors after rm, regeneration
or a cancelled run, an engine rebuilt from the rows after its file is lost, and the mysql
backend's blocks reading the knowledge base's own index."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from db.database import unit
from db.models import Chunk as ChunkRow
from db.models import Document, KnowledgeBase, Task
from ingest import ids, vectors
from ingest.chunking import Chunk
from ingest.cli import main
from ingest.control import remove_document, remove_kb
from ingest.documents import lock_documents, recompute_documents
from ingest.milvus import VectorStoreUnavailable, lite_path
from ingest.reindex import engine_counts, reindex, row_count
from ingest.search import search
from ingest.store import delete_task_chunks, record_embedding_model, store_chunks
from tests.fixtures_docs import embedder  # noqa: F401 - the session's one model
from tests.ingest.factories import cli_args
from tests.ingest.test_search import index


def _kb_ref(kb_id: str) -> vectors.KbRef:
    with unit():
        kb = KnowledgeBase.get_by_id(kb_id)
    return vectors.KbRef(kb.tenant_id, kb.id, kb.embedding_dim, kb.embedding_model)


def engine_count(kb_id: str) -> int:
    """What the engine holds for the knowledge base (the rows, for mysql)."""
    return vectors.active().count(_kb_ref(kb_id))


def _tenant_chunks(tenant: str, embedder, texts: list[str]) -> tuple[str, list[str]]:  # noqa: F811
    """A knowledge base "kb" of ``tenant`` with one document of ``texts`` as chunks, indexed."""
    kb_id = ids.kb_id(tenant, "kb")
    doc_id = ids.doc_id(kb_id, "notes.txt")
    task_id = ids.task_id(doc_id, 0, 100_000_000, 1)
    with unit():
        KnowledgeBase.create(id=kb_id, tenant_id=tenant, name="kb")
        Document.create(
            id=doc_id, kb_id=kb_id, tenant_id=tenant, name="notes.txt", doc_type="txt", generation=1
        )
        Task.create(
            id=task_id,
            doc_id=doc_id,
            kb_id=kb_id,
            tenant_id=tenant,
            generation=1,
            status="running",
            attempt=1,
        )
    record_embedding_model(kb_id, embedder.identity, embedder.dim)
    chunks = [Chunk(t, 0, 5, i) for i, t in enumerate(texts)]
    stored = store_chunks(
        kb_id=kb_id,
        doc_id=doc_id,
        task_id=task_id,
        generation=1,
        chunks=chunks,
        vectors=embedder.encode(texts),
    )
    return kb_id, stored


def test_one_tenant_never_finds_another_s_chunks(vsettings, embedder):  # noqa: F811
    texts = ["Volcanoes erupt lava and ash.", "Tides follow the moon."]
    kb_a, chunks_a = _tenant_chunks("tenant-a", embedder, texts)
    kb_b, chunks_b = _tenant_chunks('tenant "b"', embedder, texts)  # same texts, same vectors
    hits = search(vsettings, "kb", "lava from a volcano", k=10, tenant_id="tenant-a")
    assert {h.chunk_id for h in hits} == set(chunks_a)
    hits = search(vsettings, "kb", "lava from a volcano", k=10, tenant_id='tenant "b"')
    assert {h.chunk_id for h in hits} == set(chunks_b)
    query = embedder.encode(["lava"])[0]  # the store itself, below the check against the rows
    assert {c for c, _ in vectors.active().search(_kb_ref(kb_a), query, 50)} == set(chunks_a)


def test_rm_and_regeneration_leave_no_orphan_vectors(vsettings, embedder):  # noqa: F811
    settings = vsettings
    _, doc, kb = index(settings, embedder, "a.txt", b"Sourdough rises with wild yeast. " * 80, generation=1)
    index(settings, embedder, "b.txt", b"Kepler's laws describe orbits. " * 80, generation=1)
    first = row_count(kb["id"])
    assert first > 2 and engine_count(kb["id"]) == first
    _, doc, _ = index(settings, embedder, "a.txt", b"Bees dance to tell distance.", generation=2)
    with unit():
        Task.update(status="done").where(Task.doc_id == doc["id"]).execute()
        lock_documents([doc["id"]])
        recompute_documents([doc["id"]])  # generation 2 is done: generation 1's chunks go
    assert engine_count(kb["id"]) == row_count(kb["id"]) < first
    remove_document(settings, doc["id"])
    assert engine_count(kb["id"]) == row_count(kb["id"]) > 0
    ref = _kb_ref(kb["id"])
    remove_kb(settings, "kb")
    assert vectors.active().count(ref) == 0


def test_a_cancelled_run_s_chunks_leave_the_engine(vsettings, embedder):  # noqa: F811
    task, _, kb = index(vsettings, embedder, "a.txt", b"The moon pulls the sea. " * 100)
    assert engine_count(kb["id"]) == row_count(kb["id"]) > 1
    delete_task_chunks(task["id"])  # what the executor does once a cancelled run has stopped
    assert engine_count(kb["id"]) == row_count(kb["id"]) == 0


def test_a_rewrite_that_rolls_back_keeps_its_vectors_in_the_engine(vsettings, embedder, monkeypatch):  # noqa: F811
    """Stale chunks leave the engine only after the transaction that deleted their rows commits:
    a rewrite that fails midway (here the engine upsert of its new rows) keeps rows and vectors."""
    from ingest import store

    texts = [f"Fact {i} about tides and the moon." for i in range(5)]
    kb_id, stored = _tenant_chunks("default", embedder, texts)
    assert engine_count(kb_id) == row_count(kb_id) == 5
    with unit():
        task_id = ChunkRow.get_by_id(stored[0]).task_id

    def failing(rows):
        raise RuntimeError("engine refused the upsert")

    monkeypatch.setattr(store, "_index", failing)
    with pytest.raises(
        RuntimeError, match="engine refused"
    ):  # 2 chunks now: 3 stale ones deleted, then the failure
        store_chunks(
            kb_id=kb_id,
            doc_id=ids.doc_id(kb_id, "notes.txt"),
            task_id=task_id,
            generation=1,
            chunks=[Chunk(t, 0, 5, i) for i, t in enumerate(texts[:2])],
            vectors=embedder.encode(texts[:2]),
        )
    assert row_count(kb_id) == 5 and engine_count(kb_id) == 5  # rolled back: nothing gone from either


def test_reindex_after_the_engine_s_file_is_lost_restores_the_same_results(
    settings,
    embedder,  # noqa: F811 - the fixture imported above
    tmp_path,
    capsys,
):
    settings = settings.replace(vector_store=f"milvus:///{tmp_path}/vectors.db")
    vectors.use(settings)
    try:
        for name, text in [
            ("a.txt", b"Espresso is brewed at nine bars. " * 40),
            ("b.txt", b"Knots join ropes. " * 40),
        ]:
            _, _, kb = index(settings, embedder, name, text)
        before = search(settings, "kb", "coffee brewing pressure", k=5)
        assert before and engine_counts(settings)["differs"] == []
        vectors.close_all()
        shutil.rmtree(lite_path(settings.vector_store))  # the engine's data is gone
        vectors.use(settings)
        assert search(settings, "kb", "coffee brewing pressure", k=5) == []
        lost = engine_counts(settings)["differs"]
        assert [(d["name"], d["engine"]) for d in lost] == [("kb", 0)]
        assert main(["status", *cli_args(settings), "--vector-store", settings.vector_store]) == 1
        assert "run `ingest reindex --kb kb`" in capsys.readouterr().out
        done = reindex(settings, "kb")
        assert [(c.rows, c.engine) for c in done] == [(row_count(kb["id"]), row_count(kb["id"]))]
        assert search(settings, "kb", "coffee brewing pressure", k=5) == before
    finally:
        vectors.close_all()


def test_the_mysql_blocks_read_only_the_knowledge_base_s_own_rows(settings):
    for n, kb_name in enumerate(("small", "large")):
        kb_id = ids.kb_id("default", kb_name)
        with unit():
            KnowledgeBase.create(id=kb_id, name=kb_name)
            for d in range(5):
                Document.create(id=f"{n}{d}".ljust(32, "d"), kb_id=kb_id, name=f"{d}.txt", generation=1)
            rows = [
                {"id": f"{n}{i:031x}", "kb_id": kb_id, "doc_id": f"{n}{i % 5}".ljust(32, "d"), "task_id": "t",
                 "generation": 1, "position": i, "content": "x", "vector": np.ones(4, dtype=np.float32).tobytes()}
                for i in range(50 if kb_name == "small" else 3000)
            ]  # fmt: skip
            for start in range(0, len(rows), 500):
                ChunkRow.insert_many(rows[start : start + 500]).execute()
        with unit() as db:
            db.execute_sql("ANALYZE TABLE chunk, document")
    small = ids.kb_id("default", "small")
    with unit() as db:
        cursor = db.execute_sql("EXPLAIN " + vectors.mysql_block_sql(small, "", 4096)[0], (small, "", 4096))
        columns = [c[0] for c in cursor.description]
        plan = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    assert [(p["table"], p["key"], p["type"]) for p in plan] == [("chunk", "chunk_kb_id_id", "range")], plan
    assert int(plan[0]["rows"]) < 200, plan  # the small kb's rows only, not the large one's
    assert "filesort" not in plan[0]["Extra"] and "temporary" not in plan[0]["Extra"], plan  # index order
    assert sum(len(i) for i, _ in vectors.vector_blocks(small, 4, block_rows=7)) == 50


def test_an_engine_s_hits_are_checked_by_primary_key(settings, monkeypatch):
    """The check of an engine's hits against the rows reads each by its primary key, whatever
    the statistics say (fresh ones had MariaDB read the whole knowledge base by ``kb_id``), and
    keeps only the knowledge base's own chunks of their document's current generation."""
    from ingest.search import _current, current_chunks_sql

    kb_id, other = ids.kb_id("default", "kb"), ids.kb_id("default", "other")
    with unit():
        KnowledgeBase.create(id=kb_id, name="kb")
        Document.create(id="d".ljust(32, "d"), kb_id=kb_id, name="a.txt", generation=2)
        rows = [
            {"id": f"{i:032x}", "kb_id": kb_id if i < 2900 else other, "doc_id": "d".ljust(32, "d"),
             "task_id": "t", "generation": 1 if i < 100 else 2, "position": i, "content": "x"}
            for i in range(3000)
        ]  # fmt: skip
        for start in range(0, len(rows), 500):
            ChunkRow.insert_many(rows[start : start + 500]).execute()
    asked = [f"{i:032x}" for i in range(0, 3000, 100)]  # 30: one old generation, one other kb
    statement, params = current_chunks_sql(kb_id, asked)
    assert "FORCE INDEX (PRIMARY)" in statement  # not left to the statistics of the moment
    with unit() as db:
        cursor = db.execute_sql("EXPLAIN " + statement, params)
        columns = [c[0] for c in cursor.description]
        plan = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    assert [(p["table"], p["key"], p["type"]) for p in plan] == [("chunk", "PRIMARY", "range")], plan
    assert int(plan[0]["rows"]) <= len(asked), plan
    assert _current(kb_id, asked) == set(asked[1:29])
    # every id through that statement, 1,000 at a time
    import ingest.search

    statements: list[int] = []
    real = ingest.search.current_chunks_sql

    def counted(kb: str, part: list[str]) -> tuple[str, list[str]]:
        statements.append(len(part))
        return real(kb, part)

    monkeypatch.setattr(ingest.search, "current_chunks_sql", counted)
    every = [f"{i:032x}" for i in range(3000)]
    assert _current(kb_id, every) == set(every[100:2900])
    assert statements == [1000, 1000, 1000]


def test_k_over_the_cap_is_refused(settings, capsys):
    with pytest.raises(ValueError, match="INGEST_SEARCH_MAX_K"):
        search(settings.replace(search_max_k=10), "kb", "anything", k=11)
    assert main(["search", "--kb", "kb", "x", "-k", "1001", *cli_args(settings)]) == 2
    assert "-k 1001 is more than the cap of 1000" in capsys.readouterr().err


def test_the_engine_s_search_breadth_is_a_setting(settings, embedder, tmp_path):  # noqa: F811
    url = f"milvus:///{tmp_path}/ef.db"
    store = vectors.use(settings.replace(vector_store=url))
    assert (store.ef(10), store.ef(30), store.ef(500)) == (64, 120, 2000)  # the rule: max(64, 4 x limit)
    env = {"INGEST_VECTOR_STORE": url, "INGEST_VECTOR_SEARCH_EF": "300"}
    tuned = settings.replace(vector_store=url, vector_search_ef=type(settings).from_env(env).vector_search_ef)
    assert vectors.use(tuned) is store  # one store per URL: the setting rebinds its breadth
    assert (store.ef(10), store.ef(500)) == (300, 500)  # never below the limit (Milvus refuses)
    try:
        kb_id, stored = _tenant_chunks("tenant-a", embedder, ["Volcanoes erupt lava and ash.", "Tides."])
        query = embedder.encode(["lava"])[0]
        assert [c for c, _ in store.search(_kb_ref(kb_id), query, 1)] == [stored[0]]  # the engine took it
    finally:
        vectors.close_all()
    with pytest.raises(ValueError, match="vector_search_ef"):
        type(settings).from_env({"INGEST_VECTOR_SEARCH_EF": "-1"})


def _indexes(store: vectors.VectorStore, kb: vectors.KbRef) -> dict[str, str]:
    from ingest.milvus import collection_name

    client, name = store._client, collection_name(kb.dim, kb.model)  # type: ignore[attr-defined]
    return {field: client.describe_index(name, field)["index_type"] for field in client.list_indexes(name)}


def test_the_fields_every_search_filters_on_are_indexed(settings, embedder, tmp_path):  # noqa: F811
    store = vectors.use(settings.replace(vector_store=f"milvus:///{tmp_path}/scalar.db"))
    try:
        kb_id, stored = _tenant_chunks("tenant-a", embedder, ["Volcanoes erupt lava and ash.", "Tides."])
        kb = _kb_ref(kb_id)
        assert _indexes(store, kb) == {"vector": "HNSW", "tenant_id": "INVERTED", "kb_id": "INVERTED"}
        vectors.close_all()  # another process opens it: loads it as it is, indexes unchanged
        store = vectors.use(settings.replace(vector_store=f"milvus:///{tmp_path}/scalar.db"))
        query = embedder.encode(["lava"])[0]
        assert [c for c, _ in store.search(kb, query, 1)] == [stored[0]]
        assert _indexes(store, kb) == {"vector": "HNSW", "tenant_id": "INVERTED", "kb_id": "INVERTED"}
    finally:
        vectors.close_all()


def test_a_collection_gets_the_indexes_it_lacks_only_before_a_load(settings, embedder, tmp_path):  # noqa: F811
    """A collection made without the scalar indexes (by an earlier version): loaded, it is used
    as it is (a 2.3 server will not reload one whose indexes changed while it was loaded); not
    loaded (released, or another process's new one), its missing indexes are made before the
    load."""
    from ingest.milvus import HNSW_PARAMS, collection_name, collection_schema

    store = vectors.use(settings.replace(vector_store=f"milvus:///{tmp_path}/old.db"))
    try:
        client = store._call(lambda c: c)  # type: ignore[attr-defined]
        name = collection_name(embedder.dim, embedder.identity)
        client.create_collection(name, schema=collection_schema(embedder.dim))
        params = client.prepare_index_params()
        params.add_index(field_name="vector", index_type="HNSW", metric_type="IP", params=HNSW_PARAMS)
        client.create_index(name, params)
        client.load_collection(name)
        kb_id, stored = _tenant_chunks("tenant-a", embedder, ["Volcanoes erupt lava and ash.", "Tides."])
        kb, query = _kb_ref(kb_id), embedder.encode(["lava"])[0]
        assert [c for c, _ in store.search(kb, query, 1)] == [stored[0]]
        assert _indexes(store, kb) == {"vector": "HNSW"}  # loaded: left so
        client.release_collection(name)
        store._known.clear()  # type: ignore[attr-defined]  # as a process that has not used it yet
        assert [c for c, _ in store.search(kb, query, 1)] == [stored[0]]
        assert _indexes(store, kb) == {"vector": "HNSW", "tenant_id": "INVERTED", "kb_id": "INVERTED"}
    finally:
        vectors.close_all()


def test_an_engine_that_refuses_a_scalar_index_type_gets_the_next(
    settings,
    embedder,  # noqa: F811
    tmp_path,
    monkeypatch,
    caplog,
):
    """Milvus 2.3 refuses INVERTED and takes Trie; Milvus Lite refuses Trie: the type is chosen
    by the engine's version, and one refused all the same gives way to the next."""
    import ingest.milvus

    assert ingest.milvus.scalar_index_types("v2.3.5-lite") == ("Trie", "INVERTED")
    assert ingest.milvus.scalar_index_types("v2.5.4") == ("INVERTED", "Trie")
    assert ingest.milvus.scalar_index_types("milvus_lite-3.2.2") == ("INVERTED", "Trie")
    monkeypatch.setattr(ingest.milvus, "scalar_index_types", lambda version: ("Trie", "INVERTED"))
    store = vectors.use(settings.replace(vector_store=f"milvus:///{tmp_path}/trie.db"))
    try:
        kb_id, _ = _tenant_chunks("tenant-a", embedder, ["Volcanoes erupt lava and ash."])
        assert _indexes(store, _kb_ref(kb_id))["kb_id"] == "INVERTED"
    finally:
        vectors.close_all()
    monkeypatch.setattr(ingest.milvus, "scalar_index_types", lambda version: ("Trie",))  # all refused
    store = vectors.use(settings.replace(vector_store=f"milvus:///{tmp_path}/none.db"))
    try:
        kb_id, stored = _tenant_chunks("tenant-b", embedder, ["Volcanoes erupt lava and ash.", "Tides."])
        kb = _kb_ref(kb_id)
        assert set(_indexes(store, kb)) == {"vector"}
        assert "no scalar index on" in caplog.text and "Trie" in caplog.text
        query = embedder.encode(["lava"])[0]
        assert [c for c, _ in store.search(kb, query, 1)] == [stored[0]]  # searches without it
    finally:
        vectors.close_all()


def test_reindex_keeps_searches_answering_and_removes_the_engine_s_ids_without_rows(
    settings,
    embedder,  # noqa: F811 - the fixture imported above
    tmp_path,
    monkeypatch,
):
    """Reindex upserts first, then removes strays: a run the engine fails half way leaves the
    engine as it was (searches unchanged), and a finished one leaves exactly the rows' ids."""
    settings = settings.replace(vector_store=f"milvus:///{tmp_path}/vectors.db")
    store = vectors.use(settings)
    try:
        _, _, kb = index(settings, embedder, "a.txt", b"Espresso is brewed at nine bars. " * 40)
        ref = _kb_ref(kb["id"])
        stray = vectors.VectorRow(
            "f" * 32, "d" * 32, "t" * 32, embedder.encode(["a row removed meanwhile"])[0]
        )
        store.upsert(ref, [stray])
        before = search(settings, "kb", "coffee brewing pressure", k=5)

        def refuse(*args: object, **kw: object) -> None:
            raise VectorStoreUnavailable("vector engine: connection refused")

        with monkeypatch.context() as m:
            m.setattr(store, "upsert", refuse)
            with pytest.raises(VectorStoreUnavailable):
                reindex(settings, "kb")
        assert search(settings, "kb", "coffee brewing pressure", k=5) == before
        done = reindex(settings, "kb")
        rows = row_count(kb["id"])
        assert [(c.rows, c.engine) for c in done] == [(rows, rows)]
        assert "f" * 32 not in store.chunk_ids(ref)
        assert search(settings, "kb", "coffee brewing pressure", k=5) == before
    finally:
        vectors.close_all()
