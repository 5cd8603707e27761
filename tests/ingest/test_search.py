"""Search: the right document first on a corpus with known answers, only current generations,
and reading vectors in blocks gives exactly the full in-memory result."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from db.database import close_database, init_database, unit
from db.models import Chunk as ChunkRow
from db.models import Document, KnowledgeBase
from db.schema import init_schema
from ingest import vectors
from ingest.chunking import ChunkConfig, chunk_document
from ingest.errors import NotFound, PermanentError
from ingest.keywords import fuse
from ingest.parsers import parse_document
from ingest.search import FUSE_DEPTH, search, top_k
from ingest.store import record_embedding_model, store_chunks
from tests.conftest import VECTOR_BACKENDS, _drop_database, make_settings, vector_store_url
from tests.fixtures_docs import add_document, embedder  # noqa: F401 - the session's one model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_DOCUMENTS = (
    "beekeeping.md",
    "bicycle_maintenance.pdf",
    "chess_openings.md",
    "coffee.html",
    "composting.txt",
    "knots.json",
    "lighthouses.md",
    "orbital_mechanics.md",
    "origami_basics.docx",
    "railway_milestones.csv",
    "sourdough.txt",
    "tides.txt",
    "volcanoes.html",
)
KNOWN_ANSWERS = [
    ("How do honeybees tell each other how far away the flowers are?", "beekeeping.md"),
    ("What pressure is used to brew espresso?", "coffee.html"),
    ("Where is the largest tidal range in the world?", "tides.txt"),
    ("What tyre pressure should a mountain bike use?", "bicycle_maintenance.pdf"),
    ("What is a senbazuru?", "origami_basics.docx"),
    ("Which knot joins two ropes of different thickness?", "knots.json"),
    ("When was the first transcontinental railroad completed?", "railway_milestones.csv"),
    ("What is the escape velocity of the Earth?", "orbital_mechanics.md"),
    ("What is the deadliest volcanic hazard?", "volcanoes.html"),
]


def index(settings, embedder, name: str, data: bytes, generation: int = 1, task_id: str | None = None):  # noqa: F811
    """Parse, chunk, embed and store one document the way the parse handler does."""
    task, doc, kb = add_document(settings, name, data, generation=generation, task_id=task_id)
    config = ChunkConfig()
    chunks = chunk_document(parse_document(data, doc["doc_type"]), config, embedder.model)
    record_embedding_model(kb["id"], embedder.identity, embedder.dim)
    vectors = embedder.encode([c.content for c in chunks])
    store_chunks(
        kb_id=kb["id"],
        doc_id=doc["id"],
        task_id=task["id"],
        generation=generation,
        chunks=chunks,
        vectors=vectors,
    )
    return task, doc, kb


@pytest.fixture(scope="module", params=VECTOR_BACKENDS)
def corpus(request, embedder, tmp_path_factory):  # noqa: F811
    """The demo documents indexed once for this module and backend, in a database of its own."""
    folder = tmp_path_factory.mktemp("vectors")
    settings = make_settings(
        f"it_search_{uuid.uuid4().hex[:8]}", vector_store=vector_store_url(request.param, folder)
    )
    init_schema(settings.db_url)
    vectors.use(settings)
    try:
        for name in DEMO_DOCUMENTS:
            index(settings, embedder, name, (EXAMPLES / name).read_bytes())
        yield settings
    finally:
        vectors.close_all()
        close_database()
        _drop_database(settings.db_url)


@pytest.mark.parametrize(("question", "answer"), KNOWN_ANSWERS)
def test_the_document_holding_the_answer_comes_first(corpus, question, answer):
    init_database(corpus.db_url)
    hits = search(corpus, "kb", question, k=3)
    assert hits[0].doc_name == answer, [(h.doc_name, round(h.score, 3)) for h in hits]
    assert hits[0].score > hits[-1].score or len(hits) == 1


def test_hits_carry_name_page_score_and_text(corpus):
    hits = search(corpus, "kb", "How do I repair a puncture in a bicycle tyre?", k=5)
    assert len(hits) == 5 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    top = hits[0]
    assert (top.doc_name, top.page) == ("bicycle_maintenance.pdf", 2)
    assert "tyre levers" in top.content and 0 < top.score <= 1 and len(top.chunk_id) == 32


def test_a_format_without_pages_shows_no_page(corpus):
    hits = search(corpus, "kb", "How do honeybees tell each other how far away the flowers are?", k=1)
    assert hits[0].doc_name == "beekeeping.md" and hits[0].page is None and hits[0].last_page is None


def test_reading_in_blocks_equals_the_full_computation(corpus, embedder):  # noqa: F811
    init_database(corpus.db_url)
    query = "fermentation of dough with wild yeast"
    small_blocks = search(corpus, "kb", query, k=7, block_rows=3, mode="dense")
    one_block = search(corpus, "kb", query, k=7, block_rows=100_000, mode="dense")
    with unit():
        ids, blobs = zip(*ChunkRow.select(ChunkRow.id, ChunkRow.vector).tuples(), strict=True)
    scores = np.stack([np.frombuffer(b, dtype=np.float32) for b in blobs]) @ embedder.encode([query])[0]
    expected = [ids[i] for i in np.argsort(-scores)[:7]]
    assert [h.chunk_id for h in small_blocks] == [h.chunk_id for h in one_block] == expected
    assert np.allclose([h.score for h in small_blocks], np.sort(scores)[::-1][:7], atol=1e-5)


def test_top_k_breaks_ties_by_id_whatever_the_blocks():
    vectors = np.array([[1, 0], [1, 0], [0, 1], [1, 0]], dtype=np.float32)
    ids = ["d", "b", "c", "a"]
    full = top_k([(ids, vectors)], np.array([1, 0], dtype=np.float32), 2)
    blocks = top_k(
        [(ids[i : i + 1], vectors[i : i + 1]) for i in range(4)], np.array([1, 0], dtype=np.float32), 2
    )
    assert full == blocks == [("a", 1.0), ("b", 1.0)]


def test_only_the_current_generation_is_searched(vsettings, embedder):  # noqa: F811
    settings = vsettings
    index(settings, embedder, "notes.txt", b"Kepler's laws describe planetary orbits.", generation=1)
    _, doc, _ = index(
        settings, embedder, "notes.txt", b"Sourdough bread rises with wild yeast.", generation=2
    )
    with unit():
        assert ChunkRow.select().count() == 2  # the old generation is still stored …
        assert Document.get_by_id(doc["id"]).generation == 2
    hits = search(settings, "kb", "planetary orbits", k=5)
    assert [h.content for h in hits] == ["Sourdough bread rises with wild yeast."]  # … but not found


def test_an_unknown_knowledge_base_is_not_found(vsettings):
    settings = vsettings
    with pytest.raises(NotFound, match="no knowledge base named 'nope'"):
        search(settings, "nope", "anything")


def test_a_knowledge_base_with_nothing_embedded_returns_nothing(vsettings):
    settings = vsettings
    add_document(settings, "a.txt", b"text")
    assert search(settings, "kb", "anything") == []


def test_a_knowledge_base_of_another_model_is_refused(vsettings):
    settings = vsettings
    _, _, kb = add_document(settings, "a.txt", b"text")
    with unit():
        KnowledgeBase.update(embedding_model="BAAI/bge-base-en", embedding_dim=768).where(
            KnowledgeBase.id == kb["id"]
        ).execute()
    with pytest.raises(PermanentError, match="INGEST_EMBEDDING_MODEL"):
        search(settings, "kb", "anything")


def test_keyword_mode_finds_a_rare_word_by_the_full_text_index(corpus):
    hits = search(corpus, "kb", "senbazuru", k=3, mode="keyword")
    assert hits[0].doc_name == "origami_basics.docx" and "senbazuru" in hits[0].content.lower()
    assert search(corpus, "kb", "zzyzxqq", k=3, mode="keyword") == []  # no word matches: no hit


def test_hybrid_is_the_reciprocal_rank_fusion_of_dense_and_keyword(corpus):
    query = "Fresnel lens of a lighthouse"
    dense = search(corpus, "kb", query, k=FUSE_DEPTH, mode="dense")
    keyword = search(corpus, "kb", query, k=FUSE_DEPTH, mode="keyword")
    hybrid = search(corpus, "kb", query, k=5, mode="hybrid")
    expected = fuse([[(h.chunk_id, h.score) for h in dense], [(h.chunk_id, h.score) for h in keyword]], 5)
    assert [(h.chunk_id, round(h.score, 9)) for h in hybrid] == [(c, round(s, 9)) for c, s in expected]
    assert hybrid[0].doc_name == "lighthouses.md"
    with pytest.raises(ValueError, match="search mode"):
        search(corpus, "kb", query, mode="sparse")
