"""Submitting a document again: same document id, a new generation, older unfinished tasks
cancelled (rows first, then cancel keys), and the superseded bytes removed."""

from __future__ import annotations

from db.database import unit
from db.models import CANCELLED, DONE, QUEUED, RUNNING, Document, Task
from ingest.producer import submit_documents
from ingest.storage import open_storage
from tests.ingest.factories import finish_task, make_pdf, stream_messages
from tests.lifecycle import rule


@rule("publish.generations")
def test_resubmit_is_a_new_generation_of_the_same_document(settings, rclient, keys):
    s = settings.replace(pages_per_task=2)
    first = submit_documents(s, [("a.pdf", make_pdf(4))], "kb1")
    (old,) = first.documents
    with unit():  # one task runs somewhere, one already finished
        Task.update(status=RUNNING, owner="host_0", attempt=1).where(Task.id == old.task_ids[0]).execute()
    finish_task(old.task_ids[1])

    second = submit_documents(s, [("a.pdf", make_pdf(6))], "kb1")
    (new,) = second.documents
    assert new.id == old.id and new.generation == 2 and len(new.task_ids) == 3
    assert not set(new.task_ids) & set(old.task_ids)
    assert second.cancelled == 1
    with unit():
        doc = Document.get_by_id(old.id)
        rows = {t.id: t for t in Task.select()}
    assert doc.generation == 2 and doc.run == QUEUED and doc.page_count == 6
    cancelled = rows[old.task_ids[0]]
    assert cancelled.status == CANCELLED and cancelled.progress == -1.0
    assert "submitted again" in cancelled.progress_msg
    assert cancelled.attempt == 1  # kept: a stale run stays fenced out
    assert rows[old.task_ids[1]].status == DONE  # a finished task is left as it was
    assert 0 < rclient.ttl(keys.cancel(old.task_ids[0])) <= int(s.task_timeout_s)
    assert not rclient.exists(keys.cancel(old.task_ids[1]))
    assert all(rows[t].status == QUEUED and rows[t].generation == 2 for t in new.task_ids)
    published = [m["id"] for m in stream_messages(rclient, keys, 0)]
    assert set(new.task_ids) <= set(published)


@rule("publish.generations")
def test_resubmit_of_queued_tasks_cancels_all_of_them(settings, rclient, keys):
    first = submit_documents(settings, [("a.txt", b"v1")], "kb1")
    second = submit_documents(settings, [("a.txt", b"v1")], "kb1")
    (old_task,) = first.documents[0].task_ids
    with unit():
        assert Task.get_by_id(old_task).status == CANCELLED
    assert rclient.exists(keys.cancel(old_task))
    assert second.documents[0].generation == 2 and second.published == 1


def test_changed_content_is_stored_anew_and_the_superseded_bytes_removed(settings):
    storage = open_storage(settings.storage_url)
    first = submit_documents(settings, [("a.txt", b"version one")], "kb1")
    with unit():
        old_location = Document.get_by_id(first.documents[0].id).location
    submit_documents(settings, [("a.txt", b"version two")], "kb1")
    with unit():
        new_location = Document.get_by_id(first.documents[0].id).location
    assert new_location != old_location
    assert storage.get(new_location) == b"version two"
    try:
        storage.get(old_location)
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("superseded bytes are still stored")
