"""rm: a document or a whole knowledge base goes, with its tasks, chunks and bytes; its
unfinished tasks are told to stop."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import Chunk, Document, DocumentBlob, KnowledgeBase, Task
from ingest import vectors
from ingest.cli import main
from ingest.control import remove_document, remove_kb
from ingest.errors import NotFound
from ingest.milvus import VectorStoreUnavailable
from ingest.producer import submit_documents
from tests.ingest.factories import cli_args, finish_task


def test_rm_document_removes_rows_chunks_and_bytes_and_cancels_unfinished(settings, rclient, keys):
    result = submit_documents(settings, [("a.txt", b"a"), ("b.txt", b"b")], "kb1")
    a, b = result.documents
    finish_task(a.task_ids[0], chunks=3)
    removed = remove_document(settings, b.id)
    assert removed.doc_ids == [b.id] and removed.cancelled == b.task_ids and removed.tasks_removed == 1
    assert rclient.exists(keys.cancel(b.task_ids[0]))
    removed = remove_document(settings, a.id)
    assert removed.chunks_removed == 3 and removed.cancelled == []
    with unit():
        assert Document.select().count() == Task.select().count() == Chunk.select().count() == 0
        assert DocumentBlob.select().count() == 0
        assert KnowledgeBase.get_by_id(result.kb_id).doc_num == 0
    with pytest.raises(NotFound):
        remove_document(settings, a.id)


def test_cli_rm_kb_removes_that_knowledge_base_only(settings, capsys):
    one = submit_documents(settings, [("a.txt", b"a"), ("b.txt", b"b")], "kb1")
    two = submit_documents(settings, [("a.txt", b"a")], "kb2")
    finish_task(one.task_ids[0])
    assert main(["rm", "--kb", "kb1", *cli_args(settings)]) == 0
    assert "removed knowledge base kb1: 2 document(s), 2 task(s), 2 chunk(s)" in capsys.readouterr().out
    with unit():
        assert [k.name for k in KnowledgeBase.select()] == ["kb2"]
        assert [d.id for d in Document.select()] == [two.documents[0].id]
        assert [t.id for t in Task.select()] == two.task_ids
        assert DocumentBlob.select().count() == 1
    assert main(["rm", "--kb", "kb1", *cli_args(settings)]) == 1
    assert capsys.readouterr().err == "ingest: no knowledge base 'kb1' (tenant 'default')\n"


def test_remove_kb_of_another_tenant_is_not_found(settings):
    submit_documents(settings, [("a.txt", b"a")], "kb1", tenant_id="t1")
    with pytest.raises(NotFound):
        remove_kb(settings, "kb1")
    assert remove_kb(settings, "kb1", tenant_id="t1").doc_ids


def test_rm_with_an_engine_that_refuses_still_removes_the_bytes_and_cancels(
    settings, rclient, keys, monkeypatch
):
    """The rows are committed first and are the record: an engine that cannot forget the
    vectors leaves them for ``ingest reindex`` (logged), and the rest of the removal goes on."""
    result = submit_documents(settings, [("a.txt", b"a"), ("b.txt", b"b")], "kb1")
    a, b = result.documents

    def refuse(**kw: object) -> None:
        raise VectorStoreUnavailable("vector engine at milvus://x: connection refused")

    monkeypatch.setattr(vectors, "forget", refuse)
    removed = remove_document(settings, a.id)
    assert removed.cancelled == a.task_ids and rclient.exists(keys.cancel(a.task_ids[0]))
    with unit():
        assert DocumentBlob.select().count() == 1  # a's bytes went
    # the knowledge base's own vectors go before its row: refused, the row stays for a rerun
    # (reindex and status walk the rows), with everything else of it gone
    with pytest.raises(VectorStoreUnavailable):
        remove_kb(settings, "kb1")
    assert rclient.exists(keys.cancel(b.task_ids[0]))
    with unit():
        assert DocumentBlob.select().count() == Document.select().count() == 0
        assert KnowledgeBase.select().count() == 1
    monkeypatch.undo()
    assert remove_kb(settings, "kb1").doc_ids == []
    with unit():
        assert KnowledgeBase.select().count() == 0
