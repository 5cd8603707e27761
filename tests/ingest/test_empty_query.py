"""A blank query is refused (``ValueError("empty query")``) by search and memory search, and by
the CLI's verbs with exit status 1: every vector is about as close to it as any other, so its
hits would be arbitrary."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import RUNNING, Task
from ingest.chunking import ChunkConfig, chunk_document
from ingest.cli import main
from ingest.memory import check_message, search_memory, store_message
from ingest.parsers import parse_document
from ingest.search import MODES, search
from ingest.store import record_embedding_model, store_chunks
from tests.fixtures_docs import add_document, embedder  # noqa: F401 - the session's one model
from tests.ingest.factories import cli_args

BLANK = ["", "   ", "\n\t "]
TEXT = "Lighthouses guide ships past rocks at night. Tides rise and fall twice a day with the moon."


@pytest.fixture
def indexed(settings, db, embedder):  # noqa: F811
    """A knowledge base ``kb`` with one document's chunks, and memory ``m`` with one message."""
    data = TEXT.encode()
    task, doc, kb = add_document(settings, "notes.txt", data)
    chunks = chunk_document(parse_document(data, "txt"), ChunkConfig(), embedder.model)
    record_embedding_model(kb["id"], embedder.identity, embedder.dim)
    vectors = embedder.encode([c.content for c in chunks])
    store_chunks(
        kb_id=kb["id"], doc_id=doc["id"], task_id=task["id"], generation=1, chunks=chunks, vectors=vectors
    )
    with unit():
        Task.insert(id="t" * 32, task_type="memory", status=RUNNING, attempt=1).execute()
    raw = {"memory_id": "m", "source_id": "s1", "message_dict": {"role": "user", "content": TEXT}}
    store_message(check_message(raw), embedder.encode([TEXT])[0], "t" * 32, default_position=1)
    assert search(settings, "kb", "moon", k=1) and search_memory(settings, "m", "moon", k=1)
    return settings


@pytest.mark.parametrize("query", BLANK)
@pytest.mark.parametrize("mode", MODES)
def test_search_refuses_a_blank_query(indexed, query, mode):
    with pytest.raises(ValueError, match="^empty query$"):
        search(indexed, "kb", query, k=3, mode=mode)


@pytest.mark.parametrize("query", BLANK)
def test_memory_search_refuses_a_blank_query(indexed, query):
    with pytest.raises(ValueError, match="^empty query$"):
        search_memory(indexed, "m", query, k=3)


def test_the_cli_search_verbs_refuse_a_blank_query_with_exit_1(indexed, capsys):
    for argv in (["search", "--kb", "kb", "   "], ["memory", "search", "--memory", "m", "   "]):
        assert main([*argv, "--json", *cli_args(indexed)]) == 1, argv
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", "ingest: empty query\n")
