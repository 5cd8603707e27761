"""A task queued again (retry, a re-save) while or right after it ran here is run again, once."""

from __future__ import annotations

from db.database import unit
from db.models import DONE, QUEUED, RUNNING, Task
from tests import handlers
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until


def _requeue(streams, tid, task_type, *, key_lost=False):
    """What a producer does to run a task again: the row queued, then a fresh message (while
    the task's entry lives, only once its published key is gone: lost, or expired)."""
    with unit():
        # the row says what runs: its type and context, as a producer's upsert writes them
        Task.update(status=QUEUED, progress=0.0, task_type=task_type, payload={"seconds": 0}).where(
            Task.id == tid
        ).execute()
    if key_lost:
        streams.client.delete(streams.keys.published(tid))
    assert streams.publish_many([{"id": tid, "task_type": task_type, "priority": 0, "seconds": 0}])[0]


async def test_a_task_requeued_right_after_its_run_here_ends_runs_again(xsettings, streams, db):
    (tid,) = enqueue(streams, [task_spec("sleep", seconds=0.3)])
    async with running_daemon(xsettings):
        # the next read is blocked waiting for entries while this run ends: it must not take
        # the task's new entry for a duplicate of the run it saw going
        await await_until(lambda: row(tid)["status"] == DONE, 10)
        _requeue(streams, tid, "sleep")
        await await_until(lambda: row(tid)["status"] == DONE and row(tid)["attempt"] == 2, 10)


async def test_a_task_requeued_while_it_runs_here_waits_for_that_run_then_runs_again(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("hang")])
    handlers.CALLS.clear()
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
        _requeue(streams, tid, "noop", key_lost=True)  # the hanging run lost its row: it stops
        await await_until(lambda: daemon.statistics().lost == 1, 10)
        await await_until(lambda: row(tid)["status"] == DONE and row(tid)["attempt"] == 2, 15)
    assert [tid, tid] == handlers.CALLS and rclient.xlen(keys.queue(0)) == 0


async def test_a_task_requeued_while_its_entry_lives_runs_again_soon_after_the_lost_run(
    xsettings, streams, rclient, keys, db
):
    """A retry while the run is going: the row queued, the message waiting for the live entry's
    ack (``requeue``). The run loses its row and, as a lost run, acks nothing: its entry is looked
    at again within seconds (not at the next 30 s orphan check) and the task runs."""
    (tid,) = enqueue(streams, [task_spec("hang")])
    handlers.CALLS.clear()
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
        with unit():
            Task.update(status=QUEUED, progress=0.0, task_type="noop").where(Task.id == tid).execute()
        assert streams.publish_many([{"id": tid, "task_type": "noop", "priority": 0}], requeue=True) == [
            "deferred"
        ]
        await await_until(lambda: daemon.statistics().lost == 1, 10)
        await await_until(lambda: row(tid)["status"] == DONE and row(tid)["attempt"] == 2, 8)
        # the re-queued message, published by the last ack, is read and acked too ("task already
        # done") before the stop: one read as the stop begins would stay pending to the next start
        await await_until(
            lambda: (
                not rclient.exists(keys.requeue(tid))
                and rclient.xlen(keys.backlog(0, "default")) == 0
                and rclient.xpending(keys.queue(0), keys.group)["pending"] == 0
            ),
            5,
        )
    assert [tid, tid] == handlers.CALLS
