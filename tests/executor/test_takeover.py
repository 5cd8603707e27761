"""At start, an executor takes over its own pending entries (a previous life's) before new ones."""

from __future__ import annotations

from db.database import unit
from db.models import DEAD, DONE, RUNNING, Task
from tests import handlers
from tests.executor.support import all_in, enqueue, row, running_daemon, task_spec
from tests.helpers import admit, await_until
from tests.lifecycle import rule


def _left_by_a_crashed_life(rclient, keys, task_ids, name="host_1", extra_deliveries=0):
    """As if ``name`` had read these entries and died: pending under it, rows running."""
    admit(rclient, keys, name, 100)
    for _ in range(extra_deliveries):
        rclient.xreadgroup(keys.group, name, {keys.queue(0): "0"}, count=100)
    with unit():
        Task.update(status=RUNNING, owner=name, attempt=1).where(Task.id.in_(task_ids)).execute()


@rule("read.own-pending-at-start")
async def test_own_pending_entries_are_read_before_new_ones_after_a_restart_under_the_same_name(
    xsettings, streams, rclient, keys, db
):
    old = enqueue(streams, [task_spec("noop") for _ in range(3)])
    _left_by_a_crashed_life(rclient, keys, old)
    new = enqueue(streams, [task_spec("noop", priority=1) for _ in range(3)])  # even high priority
    handlers.CALLS.clear()
    async with running_daemon(xsettings.replace(max_concurrent_tasks=1), "host_1"):
        await await_until(lambda: all_in(old + new, DONE), 15)
    assert handlers.CALLS[:3] == old and sorted(handlers.CALLS[3:]) == sorted(new)
    assert all(row(t)["attempt"] == 2 and row(t)["owner"] == "host_1" for t in old)


@rule("read.own-pending-at-start")
async def test_an_own_pending_entry_delivered_too_often_is_dead_lettered_and_its_row_dead(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("noop")])
    _left_by_a_crashed_life(rclient, keys, [tid], extra_deliveries=2)  # delivered 3 times
    async with running_daemon(xsettings.replace(max_deliveries=3), "host_1"):
        await await_until(lambda: row(tid)["status"] == DEAD and rclient.xlen(keys.dead) == 1, 15)
    [(_, dead)] = rclient.xrange(keys.dead)
    assert dead["task_id"] == tid and dead["deliveries"] == "4"
    assert dead["reason"].startswith("gave up after 4 deliveries")
    assert "gave up after 4 deliveries" in row(tid)["progress_msg"] and row(tid)["progress"] == -1
    assert rclient.xlen(keys.queue(0)) == 0
