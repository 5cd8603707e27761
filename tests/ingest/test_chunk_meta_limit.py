"""A chunk's metadata is held to ``MAX_META_BYTES`` of JSON: ``chunk.meta`` is a MySQL TEXT
(65,535 bytes). A valid dataflow could build more (an Extractor matching every character, a
named group capturing CJK text, a long Markdown heading path): MariaDB then refused the
Indexer's write with a raw ``DataError (1406, "Data too long for column 'meta'")`` after all the
parsing and embedding, while SQLite took it. Now the component that builds such metadata fails
the run there with a :class:`BadDocument` naming itself and the limit, and the store refuses it
on every database before writing anything."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import trio

from db.config import Settings
from db.database import init_database, unit
from db.models import RUNNING, KnowledgeBase, Task
from db.models import Chunk as ChunkRow
from ingest.chunking import Chunk
from ingest.dataflow.components import (
    REGISTRY,
    ChunkSet,
    FileInput,
    IndexTarget,
    Runtime,
    run_worker_stage,
)
from ingest.dataflow.dsl import parse_dsl
from ingest.dataflow.runner import run_graph
from ingest.errors import BadDocument
from ingest.parsers import Section
from ingest.store import MAX_META_BYTES, store_chunks

MODEL = Settings().embedding_model
LIMIT = f"over the limit of {MAX_META_BYTES} bytes"


def params(type_name: str, **given: object) -> dict[str, object]:
    return {**{name: p.default for name, p in REGISTRY[type_name].params.items()}, **given}


def one_chunk(text: str) -> ChunkSet:
    return ChunkSet([Chunk(text, 0, 1, 0)], [{}])


def test_the_limit_fits_the_column():
    assert MAX_META_BYTES < 65_535


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("\\w", "a" * 20_000),  # every character of a chunk of max_chunk_chars, each a list item
        ("(?P<whole>(?P<part>\\pL+))", "漢" * 12_000),  # two named groups of CJK (3 bytes a character)
    ],
    ids=["every-character", "cjk-named-groups"],
)
def test_an_extractor_whose_fields_pass_the_limit_fails_naming_itself(pattern: str, text: str):
    steps = [("grab", "Extractor", params("Extractor", method="regex", pattern=pattern, all=True), ("in",))]
    with pytest.raises(BadDocument) as refused:
        run_worker_stage(steps, {"in": one_chunk(text)}, MODEL, {})
    message = str(refused.value)
    assert message.startswith("component 'grab' (Extractor): chunk 0's metadata is ") and LIMIT in message


def test_keywords_that_pass_the_limit_are_refused_too():
    # a run of letters is one "word": a CJK chunk's one keyword is the whole chunk
    steps = [
        ("kw", "Extractor", params("Extractor"), ("in",)),
        ("kw2", "Extractor", params("Extractor", field="again"), ("kw",)),
    ]
    with pytest.raises(BadDocument, match="component 'kw2' \\(Extractor\\): chunk 0's metadata"):
        run_worker_stage(steps, {"in": one_chunk("字" * 12_000)}, MODEL, {})


def test_a_heading_path_that_passes_the_limit_fails_the_splitter():
    lines = [f"{'#' * level} {'見' * 4_000}" for level in range(1, 7)]
    sections = [Section("\n".join([*lines, "the body under six long headings"]))]
    steps = [("split", "Splitter", params("Splitter", method="headings"), ("in",))]
    with pytest.raises(BadDocument) as refused:
        run_worker_stage(steps, {"in": sections}, MODEL, {})
    message = str(refused.value)
    assert message.startswith("component 'split' (Splitter): chunk ") and LIMIT in message


def test_metadata_under_the_limit_is_kept():
    out = run_worker_stage(
        [("grab", "Extractor", params("Extractor", method="regex", pattern="\\w", all=True), ("in",))],
        {"in": one_chunk("a" * 5_000)},
        MODEL,
        {},
    )["grab"]
    assert out.meta == [{"match": ["a"] * 5_000}]


@pytest.fixture(params=["mysql", "sqlite"])
def any_db(request):
    s = request.getfixturevalue("settings" if request.param == "mysql" else "sqlite_settings")
    init_database(s.db_url)
    with unit():
        KnowledgeBase.create(id="kb1", name="kb")
        Task.insert(id="t1", doc_id="d1", status=RUNNING, attempt=1).execute()
    return s


def _meta_of(size: int) -> dict[str, str]:
    """Metadata of exactly ``size`` bytes as JSON, in CJK (3 bytes a character) and ASCII."""
    cjk = (size - len(b'{"k":""}')) // 3
    meta = {"k": "中" * cjk + "x" * (size - len(b'{"k":""}') - 3 * cjk)}
    assert len(orjson.dumps(meta)) == size
    return meta


def _store(meta: list[dict[str, str]]) -> list[str]:
    chunks = [Chunk(f"chunk {i}", 0, 2, i) for i in range(len(meta))]
    vectors = np.zeros((len(meta), 8), np.float32)
    return store_chunks(
        kb_id="kb1",
        doc_id="d1",
        task_id="t1",
        generation=1,
        chunks=chunks,
        vectors=vectors,
        meta=meta,
        attempt=1,
    )


def test_the_store_refuses_metadata_over_the_limit_on_every_database_and_writes_nothing(any_db):
    with pytest.raises(BadDocument) as refused:
        _store([{"ok": "small"}, _meta_of(MAX_META_BYTES + 1)])
    assert str(refused.value).startswith("chunk 1's metadata is ") and LIMIT in str(refused.value)
    with unit():
        assert ChunkRow.select().where(ChunkRow.task_id == "t1").count() == 0


def test_the_store_keeps_metadata_at_the_limit_on_every_database(any_db):
    meta = _meta_of(MAX_META_BYTES)
    (cid,) = _store([meta])
    with unit():
        assert ChunkRow.get_by_id(cid).meta == meta


class _Embedder:
    identity, dim = "test-model", 8


class _Service:
    """The embedding service's two calls an Embedder and an Indexer make."""

    async def embed(self, texts: list[str], on_progress: object = None) -> np.ndarray:
        return np.ones((len(texts), 8), np.float32)

    async def embedder(self) -> _Embedder:
        return _Embedder()


async def test_the_indexer_names_itself_when_the_store_refuses_metadata(any_db):
    """The last guard: metadata a worker stage let through (here a stand-in for the worker that
    gives it) is refused by the store, named by the Indexer, and nothing is written."""
    graph = parse_dsl(
        {
            "components": [
                {"id": "file", "type": "File"},
                {"id": "parse", "type": "Parser", "inputs": ["file"]},
                {"id": "split", "type": "Splitter", "inputs": ["parse"]},
                {"id": "embed", "type": "Embedder", "inputs": ["split"]},
                {"id": "index", "type": "Indexer", "inputs": ["embed"]},
            ]
        }
    )

    async def worker(fn: object, *args: object, steps: int) -> dict[str, object]:
        return {"parse": [Section("text")], "split": ChunkSet([Chunk("text", 0, 1, 0)], [_meta_of(70_000)])}

    rt = Runtime(
        model=MODEL,
        service=_Service(),  # type: ignore[arg-type]
        db_limiter=trio.CapacityLimiter(1),
        target=IndexTarget("kb1", "d1", "t1", 1, attempt=1),
    )
    with pytest.raises(BadDocument) as refused:
        await run_graph(graph, FileInput("a.txt", "txt", b"text"), rt, lambda f, m: None, run_worker=worker)
    message = str(refused.value)
    assert message.startswith("component 'index' (Indexer): chunk 0's metadata is ") and LIMIT in message
    with unit():
        assert ChunkRow.select().count() == 0
