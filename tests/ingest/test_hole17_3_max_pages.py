"""Issue 17 #3: a PDF with too many pages. A 100,000-page PDF became 8,334 tasks: nothing
capped the page count. Now a PDF with more pages than ``max_pages`` (``INGEST_MAX_PAGES``) is
refused at submit with a named reason, before its bytes are stored or any row is written;
the other documents of the same submit go in, and 0 turns the cap off."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import Document, Task
from ingest import ids
from ingest.producer import submit_documents
from ingest.storage import location_for, open_storage
from tests.fixtures_docs import pdf_bytes
from tests.ingest.factories import stream_messages


def _pdf(pages: int) -> bytes:
    return pdf_bytes([[f"Page {n} of the manual."] for n in range(1, pages + 1)])


def test_a_pdf_over_max_pages_is_refused_with_its_reason_and_nothing_written(settings, rclient, keys):
    s = settings.replace(max_pages=3, pages_per_task=1)
    huge = _pdf(5)
    result = submit_documents(s, [("huge.pdf", huge), ("small.pdf", _pdf(3)), ("notes.txt", b"text")], "kb")
    refused = dict(result.refused)
    assert list(refused) == ["huge.pdf"]
    assert refused["huge.pdf"] == "5 pages, more than the limit of 3 pages per document (INGEST_MAX_PAGES)"
    assert sorted(d.name for d in result.documents) == ["notes.txt", "small.pdf"]
    assert len(result.task_ids) == 4  # 3 one-page tasks and the text
    assert len(stream_messages(rclient, keys, 0)) == 4
    with unit():
        assert sorted(d.name for d in Document.select()) == ["notes.txt", "small.pdf"]
        assert Task.select().count() == 4
    kb = ids.kb_id("default", "kb")
    location = location_for(kb, ids.doc_id(kb, "huge.pdf"), ids.content_hash(huge))
    with pytest.raises(FileNotFoundError):  # its bytes were never stored
        open_storage(s.storage_url).get(location)


def test_no_cap_when_max_pages_is_zero(settings):
    s = settings.replace(max_pages=0, pages_per_task=2)
    result = submit_documents(s, [("huge.pdf", _pdf(5))], "kb")
    assert not result.refused and len(result.task_ids) == 3
