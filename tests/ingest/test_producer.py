"""submit_documents: bytes stored, rows written, then one message per task on its priority stream."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import QUEUED, Document, KnowledgeBase, Task
from ingest import ids
from ingest.parser_config import DEFAULT_PARSER_CONFIG
from ingest.producer import NO_PAGE_LIMIT, submit_documents
from ingest.storage import location_for, open_storage
from tests.helpers import waiting
from tests.ingest.factories import make_pdf, stream_messages
from tests.lifecycle import rule


def _tasks(doc_id: str) -> list[Task]:
    with unit():
        return list(Task.select().where(Task.doc_id == doc_id).order_by(Task.from_page))


@rule("publish.rows-first")
def test_rows_then_one_message_per_task_on_the_priority_stream(settings, rclient, keys):
    result = submit_documents(settings, [("notes.TXT", b"hello")], "kb1", priority=1)
    assert result.refused == [] and result.published == 1
    (doc,) = result.documents
    kb = ids.kb_id("default", "kb1")
    assert result.kb_id == kb and doc.id == ids.doc_id(kb, "notes.TXT")
    with unit():
        row = Document.get_by_id(doc.id)
        kb_row = KnowledgeBase.get_by_id(kb)
    digest = ids.content_hash(b"hello")
    assert (row.name, row.doc_type, row.size, row.content_hash, row.generation) == (
        "notes.TXT",
        "txt",
        5,
        digest,
        1,
    )
    assert row.location == location_for(kb, doc.id, digest) and row.run == QUEUED
    assert kb_row.name == "kb1" and kb_row.parser_config == DEFAULT_PARSER_CONFIG and kb_row.doc_num == 1
    (task,) = _tasks(doc.id)
    assert task.status == QUEUED and task.priority == 1 and task.task_type == "parse"
    assert stream_messages(rclient, keys, 0) == []
    assert stream_messages(rclient, keys, 1) == [
        {
            "id": task.id,
            "doc_id": doc.id,
            "task_type": "parse",
            "priority": 1,
            "kb_id": kb,
            "tenant_id": "default",
        }
    ]
    assert rclient.exists(keys.published(task.id))


def test_pdf_is_split_into_page_ranges_of_pages_per_task(settings, rclient, keys):
    s = settings.replace(pages_per_task=12)
    result = submit_documents(s, [("manual.pdf", make_pdf(30))], "kb1")
    (doc,) = result.documents
    assert doc.page_count == 30 and doc.doc_type == "pdf"
    tasks = _tasks(doc.id)
    assert [(t.from_page, t.to_page) for t in tasks] == [(0, 12), (12, 24), (24, 30)]
    with unit():
        incarnation = Document.get_by_id(doc.id).incarnation
    assert len(incarnation) == 32
    assert {t.id for t in tasks} == {
        ids.task_id(doc.id, t.from_page, t.to_page, 1, incarnation) for t in tasks
    }
    assert sorted(m["id"] for m in stream_messages(rclient, keys, 0)) == sorted(t.id for t in tasks)


def test_anything_but_a_pdf_is_one_whole_document_task(settings):
    result = submit_documents(settings, [("a.md", b"# title"), ("b.csv", b"x,y\n1,2\n")], "kb1")
    for doc in result.documents:
        assert [(t.from_page, t.to_page) for t in _tasks(doc.id)] == [(0, NO_PAGE_LIMIT)]


def test_a_pdf_pdfium_cannot_open_still_gets_one_task(settings):
    (doc,) = submit_documents(settings, [("broken.pdf", b"%PDF-1.7 not really")], "kb1").documents
    assert doc.page_count == 0
    assert [(t.from_page, t.to_page, t.status) for t in _tasks(doc.id)] == [(0, NO_PAGE_LIMIT, QUEUED)]


def test_each_task_records_its_digest(settings):
    s = settings.replace(pages_per_task=5)
    data = make_pdf(7)
    (doc,) = submit_documents(s, [("a.pdf", data)], "kb1").documents
    config = dict(DEFAULT_PARSER_CONFIG)
    expected = [
        ids.digest(ids.content_hash(data), ids.model_identity(s.embedding_model), config, a, b)
        for a, b in ((0, 5), (5, 7))
    ]
    assert [t.digest for t in _tasks(doc.id)] == expected


def test_a_priority_other_than_0_or_1_is_refused_before_anything_is_written(settings, rclient, keys):
    for bad in (2, -1, True, "1"):
        with pytest.raises(ValueError, match="priority must be 0"):
            submit_documents(settings, [("a.txt", b"x")], "kb1", priority=bad)
    with unit():
        assert Task.select().count() == 0 and KnowledgeBase.select().count() == 0
    assert waiting(rclient, keys) == 0


def test_a_folder_means_its_files_recursively_named_by_relative_path(settings, tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "sub" / "b.txt").write_text("b")
    (tmp_path / "sub" / "deeper" / "c.html").write_text("<p>c</p>")
    (tmp_path / ".hidden").write_text("skipped")
    result = submit_documents(settings, [tmp_path], "kb1")
    assert sorted(d.name for d in result.documents) == ["a.txt", "sub/b.txt", "sub/deeper/c.html"]
    assert result.refused == []


def test_dataflow_tasks_carry_dataflow_kb_and_tenant_in_their_message(settings, rclient, keys):
    result = submit_documents(settings, [("a.txt", b"x")], "kb1", tenant_id="t1", dataflow_id="flow-7")
    (message,) = stream_messages(rclient, keys, 0)
    assert message["task_type"] == "dataflow" and message["dataflow_id"] == "flow-7"
    assert message["kb_id"] == result.kb_id == ids.kb_id("t1", "kb1") and message["tenant_id"] == "t1"
    (task,) = _tasks(result.documents[0].id)
    assert task.payload == {"dataflow_id": "flow-7"}


def test_parser_config_of_a_new_kb_is_the_defaults_plus_what_is_given(settings):
    submit_documents(settings, [("a.txt", b"x")], "kb1", parser_config={"chunk_token_num": 64})
    submit_documents(settings, [("b.txt", b"y")], "kb1", parser_config={"overlap_percent": 0})
    with unit():
        kb = KnowledgeBase.get(KnowledgeBase.name == "kb1")
        docs = {d.name: d.parser_config for d in Document.select()}
    assert kb.parser_config == {**DEFAULT_PARSER_CONFIG, "chunk_token_num": 64}
    assert docs["b.txt"] == {**DEFAULT_PARSER_CONFIG, "chunk_token_num": 64, "overlap_percent": 0}


@rule("publish.rows-first")
def test_bytes_are_stored_before_the_rows_and_read_back(settings):
    (doc,) = submit_documents(settings, [("a.txt", b"some text")], "kb1").documents
    with unit():
        location = Document.get_by_id(doc.id).location
    assert open_storage(settings.storage_url).get(location) == b"some text"


def test_submit_works_on_sqlite_too(sqlite_settings):
    result = submit_documents(sqlite_settings, [("a.pdf", make_pdf(3)), ("b.txt", b"x")], "kb1")
    assert result.published == 2 and not result.refused
    again = submit_documents(sqlite_settings, [("b.txt", b"changed")], "kb1")
    assert again.documents[0].generation == 2 and again.cancelled == 1
