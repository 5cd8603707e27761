"""Issue 12, hole 16: ``rm --kb`` removes a large knowledge base in batches of documents, each its
own transaction with bounded IN lists (one list of every document id outgrew the packet limit
past ~450k documents, and one transaction held every lock)."""

from __future__ import annotations

import ingest.control
from db.database import unit
from db.models import Chunk, Document, DocumentBlob, KnowledgeBase, Task
from ingest.control import remove_kb
from ingest.producer import submit_documents
from tests.ingest.factories import finish_task

DOCS = 23
BATCH = 5


def test_rm_kb_removes_a_large_knowledge_base_in_bounded_batches(settings, monkeypatch):
    result = submit_documents(settings, [(f"d{i}.txt", f"text {i}".encode()) for i in range(DOCS)], "big")
    other = submit_documents(settings, [("keep.txt", b"keep")], "other")
    for tid in result.task_ids[:7]:
        finish_task(tid, chunks=2)
    monkeypatch.setattr(ingest.control, "BATCH", BATCH)
    sizes: list[int] = []
    lock = ingest.control.lock_documents

    def spy(doc_ids):
        doc_ids = list(doc_ids)
        sizes.append(len(doc_ids))
        return lock(doc_ids)

    monkeypatch.setattr(ingest.control, "lock_documents", spy)
    removed = remove_kb(settings, "big")
    assert sorted(removed.doc_ids) == sorted(d.id for d in result.documents)
    assert (
        removed.tasks_removed == DOCS and removed.chunks_removed == 14 and len(removed.cancelled) == DOCS - 7
    )
    assert sizes and max(sizes) <= BATCH  # never one IN list of every document
    with unit():
        assert [k.name for k in KnowledgeBase.select()] == ["other"]
        assert [d.id for d in Document.select()] == [other.documents[0].id]
        assert [t.id for t in Task.select()] == other.task_ids
        assert Chunk.select().count() == 0 and DocumentBlob.select().count() == 1
