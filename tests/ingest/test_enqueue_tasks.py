"""enqueue_tasks: rows then messages for any task type; the type's context kept in the payload."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import DONE, QUEUED, RUNNING, Document, KnowledgeBase, Task
from ingest.client import Client
from ingest.errors import IdInUse, NotFound
from ingest.producer import enqueue_tasks, task_message
from tests.ingest.factories import stream_messages


def test_context_is_kept_in_the_payload_so_a_republish_rebuilds_the_message(settings, rclient, keys):
    message_dict = {"role": "user", "content": "hello"}
    (task_id,) = enqueue_tasks(
        settings,
        [
            {
                "task_type": "memory",
                "priority": 1,
                "memory_id": "m1",
                "source_id": "s1",
                "message_dict": message_dict,
            }
        ],
    )
    (message,) = stream_messages(rclient, keys, 1)
    assert message == {
        "id": task_id,
        "doc_id": "",
        "task_type": "memory",
        "priority": 1,
        "kb_id": "",
        "tenant_id": "default",
        "memory_id": "m1",
        "source_id": "s1",
        "message_dict": message_dict,
    }
    with unit():
        row = Task.select().where(Task.id == task_id).dicts().get()
    assert row["status"] == QUEUED and row["payload"] == {
        "memory_id": "m1",
        "source_id": "s1",
        "message_dict": message_dict,
    }
    assert task_message(row) == message


def test_a_given_id_of_an_unfinished_task_is_left_alone_and_a_finished_one_requeued(settings, rclient, keys):
    enqueue_tasks(
        settings, [{"id": "a" * 32, "task_type": "memory"}, {"id": "b" * 32, "task_type": "memory"}]
    )
    with unit():
        Task.update(status=RUNNING, owner="c1", attempt=1).where(Task.id == "a" * 32).execute()
        Task.update(status=DONE, progress=1.0).where(Task.id == "b" * 32).execute()
    for stream in [*keys.queues, keys.backlog(0, "default")]:  # as acks would
        rclient.delete(stream)
    rclient.delete(keys.published("b" * 32))
    enqueue_tasks(
        settings, [{"id": "a" * 32, "task_type": "memory"}, {"id": "b" * 32, "task_type": "memory"}]
    )
    with unit():
        a, b = Task.get_by_id("a" * 32), Task.get_by_id("b" * 32)
    assert (a.status, a.owner, a.attempt) == (RUNNING, "c1", 1)
    assert b.status == QUEUED
    assert [m["id"] for m in stream_messages(rclient, keys, 0)] == ["b" * 32]  # a's entry is still live


def test_the_same_id_twice_or_a_bad_priority_is_a_value_error(settings):
    with pytest.raises(ValueError, match="same task id twice"):
        enqueue_tasks(settings, [{"id": "x" * 32}, {"id": "x" * 32}])
    with pytest.raises(ValueError, match="priority"):
        enqueue_tasks(settings, [{"priority": 5}])


def test_a_payload_given_is_merged_into_the_message_not_nested(settings, rclient, keys):
    (task_id,) = enqueue_tasks(
        settings,
        [
            {
                "task_type": "dataflow",
                "payload": {"dataflow_id": "df1", "source_id": "old"},
                "source_id": "s1",  # beside the payload: wins
            }
        ],
    )
    (message,) = stream_messages(rclient, keys, 0)
    assert message["dataflow_id"] == "df1" and message["source_id"] == "s1" and "payload" not in message
    with unit():
        row = Task.select().where(Task.id == task_id).dicts().get()
    assert row["payload"] == {"dataflow_id": "df1", "source_id": "s1"}
    assert task_message(row) == message  # a re-publish rebuilds it
    with pytest.raises(ValueError, match="payload is a mapping"):
        enqueue_tasks(settings, [{"task_type": "memory", "payload": '{"memory_id": "m"}'}])


def test_another_tenant_s_task_id_document_or_knowledge_base_is_refused_and_nothing_written(
    settings, rclient, keys
):
    """Every caller (the Client, the CLI, the HTTP API) goes through enqueue_tasks: a finished
    task of another tenant is not taken over by naming its id, whatever the case of the name."""
    (theirs,) = enqueue_tasks(settings, [{"task_type": "memory", "tenant_id": "globex", "memory_id": "m"}])
    with unit():
        Task.update(status=DONE, progress=1.0).where(Task.id == theirs).execute()
    with unit():
        kb = KnowledgeBase.create(
            id="k" * 32, name="theirs", tenant_id="globex", create_time=0, update_time=0
        )
        doc = Document.create(
            id="d" * 32, kb_id=kb.id, tenant_id="globex", name="t.txt", create_time=0, update_time=0
        )
    for tenant in ("acme", "GLOBEX"):
        with pytest.raises(IdInUse, match="already in use"):
            enqueue_tasks(
                settings, [{"id": theirs, "task_type": "memory", "tenant_id": tenant, "memory_id": "x"}]
            )
        with pytest.raises(NotFound, match="no such document"):
            enqueue_tasks(settings, [{"doc_id": doc.id, "tenant_id": tenant}])
        with pytest.raises(NotFound, match="no such knowledge base"):
            enqueue_tasks(settings, [{"kb_id": kb.id, "task_type": "memory", "tenant_id": tenant}])
    # nor one that does not exist yet: document ids are derived from names, and a task waiting
    # for another tenant's next document would count in that document's state
    with pytest.raises(NotFound, match="no such document"):
        enqueue_tasks(settings, [{"doc_id": "n" * 32, "tenant_id": "acme"}])
    with pytest.raises(NotFound, match="no such knowledge base"):
        enqueue_tasks(settings, [{"kb_id": "n" * 32, "task_type": "memory", "tenant_id": "acme"}])
    with unit():
        row = Task.get_by_id(theirs)
        assert (row.tenant_id, row.status, row.payload) == ("globex", DONE, {"memory_id": "m"})
        assert Task.select().count() == 1
    client = Client(settings, tenant="acme")
    try:
        with pytest.raises(IdInUse):
            client.submit_tasks([{"id": theirs, "task_type": "memory", "memory_id": "evil"}])
    finally:
        client.close()
    # its own tenant may run it again
    assert enqueue_tasks(settings, [{"id": theirs, "task_type": "memory", "tenant_id": "globex"}]) == [theirs]
