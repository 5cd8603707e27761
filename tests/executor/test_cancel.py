"""Cancel: the row is set cancelled and the cancel key set; the run stops within 2 s, its chunks go."""

from __future__ import annotations

import threading

import trio

from db.database import unit
from db.models import CANCELLED, RUNNING, Chunk, Document, Task
from tests.executor.support import enqueue, make_document, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


def _chunks(task_id: str) -> int:
    with unit():
        return Chunk.select().where(Chunk.task_id == task_id).count()


@rule("cancel.rows-then-keys")
async def test_cancel_stops_a_running_task_within_2_s_and_its_chunks_are_removed(
    xsettings, streams, rclient, keys, db
):
    kb_id, doc_id = make_document()
    (tid,) = enqueue(streams, [task_spec("chunks_then_hang", doc_id=doc_id, kb_id=kb_id, chunks=4)])
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: _chunks(tid) == 4 and row(tid)["status"] == RUNNING, 10)
        with unit():  # as `ingest cancel` does: the row first, then the cancel key
            Task.update(status=CANCELLED, progress=-1.0).where(Task.id == tid).execute()
        rclient.set(keys.cancel(tid), "1", ex=60)
        began = trio.current_time()
        await await_until(lambda: daemon.statistics().running == 0, 5)
        assert trio.current_time() - began < 2.0
        await await_until(lambda: _chunks(tid) == 0 and rclient.xlen(keys.queue(0)) == 0, 5)
        assert daemon.statistics().cancelled == 1
    assert row(tid)["status"] == CANCELLED
    with unit():
        assert Document.get_by_id(doc_id).run == CANCELLED


async def test_a_cancel_key_alone_stops_the_task_and_the_executor_records_the_cancel(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("hang")])
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: daemon.statistics().running == 1, 10)
        rclient.set(keys.cancel(tid), "1", ex=60)
        await await_until(lambda: row(tid)["status"] == CANCELLED and rclient.xlen(keys.queue(0)) == 0, 5)
    assert row(tid)["progress_msg"].endswith("cancelled\n") and row(tid)["progress"] == -1


@rule("publish.cancel-names-attempt")
async def test_hole1_a_stale_cancel_key_never_cancels_a_later_attempt(xsettings, streams, rclient, keys, db):
    """Issue 12 hole 1: cancel T, retry T, and its publish fails: the reconciler republishes
    through a path that never clears the cancel key. The cancel names attempt 1; attempt 2 runs."""
    from ingest.control import cancel

    (tid,) = enqueue(streams, [task_spec("hang")])
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: daemon.statistics().running == 1, 10)
        cancel(xsettings, tid)  # rows first, then the key naming attempt 1
        await await_until(lambda: row(tid)["status"] == CANCELLED and daemon.statistics().running == 0, 5)
        assert rclient.get(keys.cancel(tid)) == "1"
        with unit():  # a retry's row write, its publish lost
            Task.update(status="queued", progress=0.0, task_type="sleep", payload={"seconds": 1.5}).where(
                Task.id == tid
            ).execute()
        streams.publish_many([{"id": tid, "task_type": "sleep", "priority": 0}])  # the reconciler's publish
        await await_until(lambda: row(tid)["status"] == "done", 10)
    assert row(tid)["attempt"] == 2 and rclient.exists(keys.cancel(tid))  # the old key lived on, harmless


async def test_a_slow_row_check_does_not_hold_up_a_cancel_that_comes_by_its_key(
    xsettings, streams, rclient, keys, db, monkeypatch
):
    """The rows' read hangs (a pooled connection waiting out its read timeout after a
    failover, every database slot busy): the cancel keys are still read every half second."""
    from executor import cancel

    slow = threading.Event()

    def hanging_read_rows(ids):
        slow.wait(30)
        return {}

    monkeypatch.setattr(cancel, "read_rows", hanging_read_rows)
    (tid,) = enqueue(streams, [task_spec("hang")])
    try:
        async with running_daemon(xsettings) as daemon:
            await await_until(lambda: daemon.statistics().running == 1, 10)
            await trio.sleep(cancel.ROW_CHECK_S + 0.5)  # a row check has begun, and hangs
            rclient.set(keys.cancel(tid), "1", ex=60)
            began = trio.current_time()
            await await_until(lambda: daemon.statistics().running == 0, 5)
            assert trio.current_time() - began < 2.0
            slow.set()
    finally:
        slow.set()
