"""Documents' bytes are stored where every executor can read them: database parts or file://."""

from __future__ import annotations

import os

from db.database import unit
from db.models import Document, DocumentBlob
from ingest.producer import submit_documents
from ingest.storage import PART_BYTES, open_storage


def _location(doc_id: str) -> str:
    with unit():
        return Document.get_by_id(doc_id).location


def test_bytes_are_stored_in_database_parts_and_read_back(settings):
    big = os.urandom(PART_BYTES * 2 + 123)
    result = submit_documents(settings, [("big.bin", big), ("small.txt", b"small")], "kb1")
    big_doc, small_doc = result.documents
    with unit():
        parts = DocumentBlob.select().where(DocumentBlob.location == _location(big_doc.id)).count()
    assert parts == 3
    storage = open_storage("")
    assert storage.get(_location(big_doc.id)) == big
    assert storage.get(_location(small_doc.id)) == b"small"


def test_bytes_are_stored_as_files_under_file_storage_and_read_back(settings, tmp_path):
    s = settings.replace(storage_url=f"file://{tmp_path}")
    (doc,) = submit_documents(s, [("a.txt", b"on a shared disk")], "kb1").documents
    location = _location(doc.id)
    assert (tmp_path / location).read_bytes() == b"on a shared disk"
    assert open_storage(s.storage_url).get(location) == b"on a shared disk"
    with unit():
        assert DocumentBlob.select().count() == 0


def test_the_submitted_file_may_be_deleted_after_submit(settings, tmp_path):
    path = tmp_path / "gone.txt"
    path.write_bytes(b"still here")
    (doc,) = submit_documents(settings, [path], "kb1").documents
    path.unlink()
    assert open_storage(settings.storage_url).get(_location(doc.id)) == b"still here"
