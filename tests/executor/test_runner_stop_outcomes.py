"""A run whose scope is cancelled (a stop, a cancel, the deadline) ends as that stop says even
when its handler turns the cancellation into an error of its own (a clean-up that fails), or
swallows it and returns after a user's cancel: a hand-back stays a hand-back, a timeout a
timeout, a cancel a cancel. A handler that returns after a hand-back request or its deadline
finished its work (a last step that cannot be cancelled): it is done."""

from __future__ import annotations

import time

import trio

from db.database import unit
from db.models import CANCELLED, DONE, FAILED, QUEUED, RUNNING, Task
from executor.context import TaskContext, TaskResult
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until

ERROR = "session close failed while cancelling"


async def cleanup_raises(ctx: TaskContext) -> None:
    """A handler whose clean-up on cancellation fails (closing a remote session, say)."""
    try:
        await trio.sleep(60)
    except trio.Cancelled:
        raise RuntimeError(ERROR) from None


async def child_cleanup_raises(ctx: TaskContext) -> None:
    """The same error raised by a child of the handler's own nursery: it comes out beside the
    body's Cancelled, in a BaseExceptionGroup (not an Exception)."""

    async def child() -> None:
        await cleanup_raises(ctx)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)
        await trio.sleep(60)


async def swallows_cancel(ctx: TaskContext) -> TaskResult:
    """A handler that catches the cancellation and returns as if its work were done (a broad
    ``except BaseException`` around a call, say)."""
    try:
        await trio.sleep(60)
    except trio.Cancelled:
        return TaskResult(message="half the work")
    return TaskResult(message="half the work")


def _settings(xsettings, **kw):
    extra = (
        f"{xsettings.extra_handlers},cleanup_raises={__name__}:cleanup_raises,"
        f"child_cleanup_raises={__name__}:child_cleanup_raises,swallows_cancel={__name__}:swallows_cancel,"
        f"finishes_in_a_thread={__name__}:finishes_in_a_thread"
    )
    return xsettings.replace(extra_handlers=extra, **kw)


async def test_a_task_handed_back_at_a_stop_is_queued_again_when_its_handler_raises_as_it_stops(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("cleanup_raises")])
    async with running_daemon(_settings(xsettings, shutdown_grace_s=0.3)) as daemon:
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
    r = row(tid)
    assert r["status"] == QUEUED and r["handback_count"] == 1, r["progress_msg"]
    assert daemon.counters.handed_back == 1 and daemon.counters.failed == 0
    assert rclient.exists(keys.published(tid))  # a fresh entry for another executor
    for stream in (keys.queue(0), keys.backlog(0, "default")):  # nobody reads it here
        rclient.xtrim(stream, maxlen=0)
    rclient.delete(keys.published(tid))


async def test_a_task_past_its_timeout_fails_as_timed_out_when_its_handler_raises_as_it_stops(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("cleanup_raises")])
    async with running_daemon(_settings(xsettings, task_timeout_s=0.5)) as daemon:
        await await_until(lambda: row(tid)["status"] == FAILED, 10)
        await await_until(lambda: rclient.xlen(keys.queue(0)) == 0, 5)
        assert daemon.counters.timed_out == 1
    assert "timed out after 0.5 s" in row(tid)["progress_msg"]


async def test_a_cancelled_task_stays_cancelled_when_its_handler_raises_as_it_stops(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("cleanup_raises")])
    async with running_daemon(_settings(xsettings)) as daemon:
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
        with unit():  # as `ingest cancel` does: the row first, then the cancel key
            Task.update(status=CANCELLED, progress=-1.0).where(Task.id == tid).execute()
        rclient.set(keys.cancel(tid), "1", ex=60)
        await await_until(lambda: daemon.statistics().cancelled == 1 and rclient.xlen(keys.queue(0)) == 0, 5)
        assert daemon.counters.failed == 0
    r = row(tid)
    assert r["status"] == CANCELLED and ERROR not in r["progress_msg"]


async def test_an_error_beside_a_cancellation_in_a_handler_s_nursery_ends_the_task_not_the_daemon(
    xsettings, streams, rclient, keys, db
):
    """It ended the daemon: the group left the run's scope and its nursery. Now the task times
    out as any other, and the next task runs on the same executor."""
    (tid,) = enqueue(streams, [task_spec("child_cleanup_raises")])
    async with running_daemon(_settings(xsettings, task_timeout_s=0.5)) as daemon:
        await await_until(lambda: row(tid)["status"] == FAILED, 10)
        assert "timed out after 0.5 s" in row(tid)["progress_msg"]
        (after,) = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: row(after)["status"] == "done", 10)
        await await_until(lambda: rclient.xlen(keys.queue(0)) == 0, 5)
        assert daemon.counters.timed_out == 1
    (tid,) = enqueue(streams, [task_spec("child_cleanup_raises")])
    async with running_daemon(_settings(xsettings, shutdown_grace_s=0.3)) as daemon:
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
    assert row(tid)["status"] == QUEUED and daemon.counters.handed_back == 1
    for stream in (keys.queue(0), keys.backlog(0, "default")):  # nobody reads it here
        rclient.xtrim(stream, maxlen=0)
    rclient.delete(keys.published(tid))


async def test_a_handler_cancelled_by_the_user_stays_cancelled_when_it_swallows_the_cancellation(
    xsettings, streams, rclient, keys, db
):
    """What it returns says nothing about the work: the user's cancel decides."""
    (tid,) = enqueue(streams, [task_spec("swallows_cancel")])
    async with running_daemon(_settings(xsettings)) as daemon:
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
        with unit():
            Task.update(status=CANCELLED, progress=-1.0).where(Task.id == tid).execute()
        rclient.set(keys.cancel(tid), "1", ex=60)
        await await_until(lambda: daemon.statistics().cancelled == 1 and rclient.xlen(keys.queue(0)) == 0, 5)
        assert daemon.counters.done == 0
    assert row(tid)["status"] == CANCELLED


async def finishes_in_a_thread(ctx: TaskContext) -> TaskResult:
    """A last step that cannot be cancelled (the parse handler's chunk store in a thread)."""
    await trio.to_thread.run_sync(time.sleep, float(ctx.message.get("seconds", 1.0)))
    return TaskResult(message="stored")


async def test_work_finished_by_a_last_step_past_the_deadline_or_a_stop_is_written_done(
    xsettings, streams, rclient, keys, db
):
    """The deadline, or a stop's grace, ran out while the step that completes the work ran:
    the work is done, so the task is done (not failed, not run again from scratch)."""
    (tid,) = enqueue(streams, [task_spec("finishes_in_a_thread", seconds=1.0)])
    async with running_daemon(_settings(xsettings, task_timeout_s=0.5)) as daemon:
        await await_until(lambda: row(tid)["status"] == DONE, 10)
        assert daemon.counters.timed_out == 0
    (tid,) = enqueue(streams, [task_spec("finishes_in_a_thread", seconds=1.0)])
    async with running_daemon(_settings(xsettings, shutdown_grace_s=0.3)) as daemon:
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
    r = row(tid)
    assert r["status"] == DONE and r["handback_count"] == 0, r["progress_msg"]
    assert daemon.counters.handed_back == 0
