"""Finishing: terminal rows, the document recomputed in the same transaction, then acks and events."""

from __future__ import annotations

import time

import orjson
import trio

from db.database import unit
from db.models import DONE, FAILED, Document
from tests.executor.support import enqueue, make_document, row, rows, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


def _listen(rclient, channel):
    pubsub = rclient.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1.0)
    return pubsub


def _events(pubsub, n, timeout_s=10.0):
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message:
            out.append(orjson.loads(message["data"]))
    return out


@rule("finish.one-transaction", "finish.ack-script")
async def test_finished_tasks_update_their_document_and_announce_themselves(
    xsettings, streams, rclient, keys, db
):
    kb_id, doc_id = make_document()
    ids = enqueue(streams, [task_spec("chunks", doc_id=doc_id, kb_id=kb_id, chunks=3) for _ in range(3)])
    pubsub = _listen(rclient, keys.updates)
    async with running_daemon(xsettings):
        await await_until(lambda: all(r["status"] == DONE for r in rows(ids).values()), 10)
        events = await trio.to_thread.run_sync(_events, pubsub, 3)
    pubsub.close()
    assert sorted(e["task_id"] for e in events) == sorted(ids)
    assert all(e["doc_id"] == doc_id and e["status"] == DONE and e["progress"] == 1.0 for e in events)
    for tid in ids:
        done = row(tid)
        assert len(done["chunk_ids"].split()) == 3 and done["result"] == {"chunks": 3}
        assert done["progress"] == 1.0 and done["process_duration"] >= 0
    with unit():
        doc = Document.get_by_id(doc_id)
    assert (doc.run, doc.progress, doc.chunk_num) == (DONE, 1.0, 9)
    assert rclient.xlen(keys.queue(0)) == 0 and not any(rclient.exists(keys.published(t)) for t in ids)


@rule("finish.one-transaction")
async def test_a_failed_task_fails_its_document_once_all_are_finished(xsettings, streams, db):
    kb_id, doc_id = make_document()
    ok, bad = enqueue(
        streams, [task_spec("chunks", doc_id=doc_id, kb_id=kb_id), task_spec("fail", doc_id=doc_id)]
    )
    async with running_daemon(xsettings):
        await await_until(lambda: row(ok)["status"] == DONE and row(bad)["status"] == FAILED, 10)
    with unit():
        doc = Document.get_by_id(doc_id)
    assert doc.run == FAILED and doc.progress == -1.0
