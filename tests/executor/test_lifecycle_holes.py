"""Issue 12 holes 3, 4, 6 and 11, each reproduced on real Redis and MariaDB."""

from __future__ import annotations

import threading

from db.database import unit
from db.models import DEAD, DONE, FAILED, QUEUED, RUNNING, Document, Task
from ingest.control import cancel, retry
from tests.executor.support import enqueue, make_document, row, running_daemon, task_spec
from tests.helpers import admit, await_until, waiting
from tests.lifecycle import rule


@rule("validate.bad-messages")
async def test_hole3_a_dead_row_always_gets_its_dead_letter(xsettings, streams, rclient, keys, db):
    """The row was made dead (a bury committed) but its dead letter was never written (a crash,
    or a batch re-run after a retryable error): the entry's next delivery writes it, once."""
    (tid,) = enqueue(streams, [task_spec("noop", status=DEAD, progress=-1.0, progress_msg="x\ngave up")])
    async with running_daemon(xsettings):
        await await_until(lambda: waiting(rclient, keys) == 0, 10)
    [(_, letter)] = rclient.xrange(keys.dead)
    assert letter["task_id"] == tid and "gave up" in letter["reason"]
    # a second entry of the same dead task (a redelivery) adds no second letter
    streams.publish_many([{"id": tid, "task_type": "noop", "priority": 0}])
    async with running_daemon(xsettings):
        await await_until(lambda: waiting(rclient, keys) == 0, 10)
    assert rclient.xlen(keys.dead) == 1


async def test_hole4_retry_of_a_task_dead_from_hand_backs_runs_it_instead_of_burying_it(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("noop", handback_count=9)])
    async with running_daemon(xsettings.replace(max_deliveries=3)):
        await await_until(lambda: row(tid)["status"] == DEAD, 10)
        result = retry(xsettings, tid)
        assert result.task_ids == [tid] and row(tid)["handback_count"] == 0
        await await_until(lambda: row(tid)["status"] == DONE, 10)


def test_hole6_a_retry_racing_the_finisher_s_ack_leaves_the_task_an_entry(
    settings, streams, rclient, keys, db
):
    """The finisher wrote the row failed and is about to ack its entry; a retry re-queues the row
    and publishes (skipped before: "already live"); then the ack removes the entry and its key.
    Now the publish waits for that ack, which puts the message in the backlog."""
    (tid,) = enqueue(streams, [task_spec("noop")])
    [(stream, entry)] = admit(rclient, keys, "c1")
    with unit():
        Task.update(status=FAILED, progress=-1.0, owner="c1", attempt=1).where(Task.id == tid).execute()
    assert retry(settings, tid).task_ids == [tid]  # its publish finds the entry pending: deferred
    assert row(tid)["status"] == QUEUED and rclient.exists(keys.requeue(tid))
    from db.streams import AckItem

    assert streams.ack("c1", [AckItem(stream, entry, tid)]) == [True]  # the finisher's ack, late
    backlog = keys.backlog(0, "default")
    [(new_entry, _)] = rclient.xrange(backlog)
    assert rclient.get(keys.published(tid)) == f"{backlog} {new_entry}"  # one live entry, as it must
    assert not rclient.exists(keys.requeue(tid))


@rule("finish.one-transaction")
def test_hole11_cancel_recomputes_the_document_from_what_is_committed_now(
    settings, streams, rclient, keys, db
):
    """A cancel that read its rows, then locked the document, recomputed from its old snapshot:
    the other task finished meanwhile, both tasks terminal, the document left running."""
    kb_id, doc_id = make_document()
    a, b = enqueue(
        streams,
        [
            task_spec("noop", doc_id=doc_id, kb_id=kb_id, status=RUNNING),
            task_spec("noop", doc_id=doc_id, kb_id=kb_id),
        ],
    )
    with unit():
        Document.update(run=RUNNING).where(Document.id == doc_id).execute()
    from db.database import database
    from ingest.documents import lock_documents

    locked, release = threading.Event(), threading.Event()

    def finisher() -> None:  # holds the document's lock while it finishes task a
        with database.obj.connection_context(), database.obj.atomic():
            lock_documents([doc_id])
            locked.set()
            release.wait(10)
            Task.update(status=DONE, progress=1.0).where(Task.id == a).execute()

    t = threading.Thread(target=finisher)
    t.start()
    locked.wait(10)
    threading.Timer(0.5, release.set).start()
    cancel(settings, b)  # waits for the document's lock, then must see a done
    t.join()
    with unit():
        doc = Document.get_by_id(doc_id)
    assert (row(a)["status"], row(b)["status"]) == (DONE, "cancelled")
    assert doc.run != RUNNING, doc.run


@rule("publish.takeover-checks-owner")
async def test_hole2_an_orphan_entry_of_a_task_running_under_a_live_owner_never_takes_it_over(
    xsettings, streams, rclient, keys, db, monkeypatch
):
    """A task with two live entries (its published key lost while an entry lived): the orphan
    check re-read the second as reclaimed, skipped the live-owner check and took the task over,
    with no delivery counted: the owner flipped for ever. Now it is a duplicate and acked."""
    import orjson
    import trio

    import executor.collector as collector

    monkeypatch.setattr(collector, "ORPHAN_CHECK_S", 0.3)
    (tid,) = enqueue(streams, [task_spec("hang")])
    async with running_daemon(xsettings, "host_1"):
        await await_until(lambda: row(tid)["status"] == RUNNING and row(tid)["owner"] == "host_1", 10)
        async with running_daemon(xsettings, "host_2") as other:
            await other.collector.taken_over.wait()
            pipe = rclient.pipeline(transaction=True)  # in one step: host_2's process never reads it
            pipe.xadd(keys.queue(0), {"message": orjson.dumps({"id": tid}).decode()})
            pipe.xreadgroup(keys.group, "host_2", {keys.queue(0): ">"}, count=1)
            second, _ = pipe.execute()  # an orphan of host_2: pending under its name, not held
            await await_until(
                lambda: not rclient.xpending_range(keys.queue(0), keys.group, second, second, 1), 5
            )
            await trio.sleep(0.5)
            assert (row(tid)["owner"], row(tid)["attempt"]) == ("host_1", 1)  # never taken over
