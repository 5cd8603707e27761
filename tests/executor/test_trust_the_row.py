"""Issue 17 hole 1: the executor believes the row, never the message. A message forged into a
stream can name a task; its type, tenant, context, document and location come from rows."""

from __future__ import annotations

import orjson
import pytest

from db.database import unit
from db.models import DONE, FAILED, Chunk, Document
from ingest.errors import NotFound
from ingest.producer import enqueue_tasks, submit_documents
from tests import handlers
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until


def _forge(rclient, keys, message: dict) -> None:
    """Anyone with the Redis password: an entry straight onto the priority stream."""
    rclient.xadd(keys.queue(0), {"message": orjson.dumps(message).decode()})


async def test_a_forged_message_s_type_and_context_are_not_believed(xsettings, streams, rclient, keys, db):
    (tid,) = enqueue(streams, [task_spec("noop")], publish=False)
    handlers.CALLS.clear()
    _forge(rclient, keys, {"id": tid, "task_type": "hang", "tenant_id": "other", "seconds": 999})
    async with running_daemon(xsettings):
        await await_until(lambda: row(tid)["status"] == DONE, 10)  # the row's noop ran, not a hang
    assert [tid] == handlers.CALLS


async def test_a_forged_message_cannot_point_a_task_at_another_tenant_s_document(
    xsettings, streams, rclient, keys, db
):
    from ingest.dataflow.catalog import create_dataflow

    victim = submit_documents(
        xsettings, [("secret.txt", b"the victim's secret")], "private", tenant_id="victim"
    )
    (secret,) = victim.documents
    with unit():
        location = Document.get_by_id(secret.id).location
    flow = create_dataflow(xsettings, "peek", _dsl(), tenant_id="attacker")
    mine = submit_documents(xsettings, [("mine.txt", b"my own words")], "mine", tenant_id="attacker")
    (task_id,) = mine.task_ids
    rclient.delete(keys.backlog(0, "attacker"), keys.published(task_id))  # only the forged entry is left
    forged = {
        "id": task_id,
        "doc_id": secret.id,
        "tenant_id": "attacker",
        "task_type": "dataflow",
        "dataflow_id": flow.id,
        "debug": True,
        "document": {"name": "secret.txt", "doc_type": "txt", "location": location},
    }
    _forge(rclient, keys, forged)
    async with running_daemon(xsettings):
        await await_until(lambda: row(task_id)["status"] in (DONE, FAILED), 60)
    got = row(task_id)
    assert got["status"] == DONE and got["task_type"] == "parse"  # the row's parse of its own document
    with unit():
        contents = [c for (c,) in Chunk.select(Chunk.content).where(Chunk.task_id == task_id).tuples()]
    assert contents and all("secret" not in c for c in contents)
    assert "secret" not in orjson.dumps(got["result"]).decode()


async def test_a_task_row_naming_another_tenant_s_document_fails_without_reading_it(
    xsettings, streams, rclient, keys, db
):
    """The producer refuses such a task (``enqueue_tasks``: not found); a row written some other
    way (a database edited by hand, an older producer) is refused again by the executor."""
    victim = submit_documents(
        xsettings, [("secret.txt", b"the victim's secret")], "private", tenant_id="victim"
    )
    (secret,) = victim.documents
    spec = {"task_type": "parse", "tenant_id": "attacker", "doc_id": secret.id, "kb_id": victim.kb_id}
    with pytest.raises(NotFound):
        enqueue_tasks(xsettings, [spec])
    (task_id,) = enqueue(streams, [spec])  # the row and its message, past the producer
    async with running_daemon(xsettings):
        await await_until(lambda: row(task_id)["status"] == FAILED, 60)
    assert "another tenant's document" in row(task_id)["progress_msg"]


async def test_a_debug_run_reads_only_its_own_upload(xsettings, streams, rclient, keys, db):
    victim = submit_documents(
        xsettings, [("secret.txt", b"the victim's secret")], "private", tenant_id="victim"
    )
    with unit():
        location = Document.get_by_id(victim.documents[0].id).location
    from ingest.dataflow.catalog import create_dataflow

    flow = create_dataflow(xsettings, "peek", _dsl(), tenant_id="attacker")
    (task_id,) = enqueue_tasks(
        xsettings,
        [
            {
                "task_type": "dataflow",
                "tenant_id": "attacker",
                "dataflow_id": flow.id,
                "debug": True,
                "document": {"name": "secret.txt", "doc_type": "txt", "location": location},
            }
        ],
    )
    async with running_daemon(xsettings):
        await await_until(lambda: row(task_id)["status"] == FAILED, 60)
    assert "reads only its own upload" in row(task_id)["progress_msg"]


def _dsl() -> dict:
    return {
        "components": [
            {"id": "file", "type": "File"},
            {"id": "parse", "type": "Parser", "inputs": ["file"]},
            {"id": "split", "type": "Splitter", "inputs": ["parse"]},
            {"id": "embed", "type": "Embedder", "inputs": ["split"]},
            {"id": "index", "type": "Indexer", "inputs": ["embed"]},
        ]
    }
