"""Leases: a running task's entry is renewed; an entry another consumer took stops this copy of
the task (nothing written, nothing acked); an entry Redis lost lets the task run on and finish."""

from __future__ import annotations

from db.database import unit
from db.models import DONE, RUNNING, Task
from tests.executor.support import enqueue, row, running_daemon, statuses, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


def _pending(rclient, keys, stream):
    return {p["message_id"]: p["consumer"] for p in rclient.xpending_range(stream, keys.group, "-", "+", 100)}


@rule("lease.renew-own")
async def test_a_running_task_keeps_its_entry_idle_time_low(xsettings, streams, rclient, keys, db):
    (tid,) = enqueue(streams, [task_spec("sleep", seconds=2.0)])
    async with running_daemon(xsettings.replace(redelivery_timeout_s=0.4), "host_1") as daemon:
        await await_until(lambda: statuses([tid])[tid] == RUNNING, 10)
        await await_until(lambda: daemon.leases.statistics().renewed >= 5, 10)
        [p] = rclient.xpending_range(keys.queue(0), keys.group, "-", "+", 10)
        assert p["time_since_delivered"] < 400 and p["times_delivered"] == 1  # JUSTID adds no delivery
        await await_until(lambda: row(tid)["status"] == DONE, 10)
    assert daemon.sweeper.statistics().reclaimed == 0


@rule("lease.renew-own")
async def test_a_task_whose_entry_another_consumer_took_stops_and_writes_and_acks_nothing(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("hang")])
    stream = keys.queue(0)
    async with running_daemon(xsettings.replace(redelivery_timeout_s=1.0), "host_1") as daemon:
        await await_until(lambda: "started on host_1" in row(tid)["progress_msg"], 10)
        before = row(tid)
        [eid] = _pending(rclient, keys, stream)
        rclient.xclaim(stream, keys.group, "thief_1", 0, [eid], justid=True)  # it stalled; another took it
        await await_until(lambda: not daemon.book.running, 5)
        assert daemon.leases.statistics().taken == 1 and daemon.counters.lost == 1
        await daemon.finisher.drain()
        after = row(tid)
        assert _pending(rclient, keys, stream) == {eid: "thief_1"}  # not acked by the lost copy
        assert {k: after[k] for k in ("status", "attempt", "owner", "progress_msg", "update_time")} == {
            k: before[k] for k in ("status", "attempt", "owner", "progress_msg", "update_time")
        }
        # the thief finishes the task (before its own entry could be swept back)
        with unit():
            Task.update(status=DONE, progress=1.0).where(Task.id == tid).execute()
        rclient.xack(stream, keys.group, eid)


@rule("lease.renew-own")
async def test_a_task_whose_entry_redis_lost_runs_on_and_finishes(xsettings, streams, rclient, keys, db):
    (tid,) = enqueue(streams, [task_spec("sleep", seconds=1.5)])
    stream = keys.queue(0)
    async with running_daemon(xsettings.replace(redelivery_timeout_s=0.4), "host_1") as daemon:
        await await_until(lambda: statuses([tid])[tid] == RUNNING, 10)
        [eid] = _pending(rclient, keys, stream)
        rclient.xack(stream, keys.group, eid)  # as if Redis lost the entry and its published key
        rclient.xdel(stream, eid)
        rclient.delete(keys.published(tid))
        await await_until(lambda: row(tid)["status"] == DONE, 10)
        assert daemon.leases.statistics().gone == 1
        assert daemon.counters.lost == 0 and daemon.counters.done == 1
