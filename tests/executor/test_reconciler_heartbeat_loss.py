"""The reconciler re-queues a running row of an owner without a heartbeat only once the owner
has been seen without one for a heartbeat TTL: right after Redis lost its data (a restart
without persistence, a FLUSHALL) every heartbeat is gone, and a live owner writes its own again
only at its next tick, while its task runs on (LIFECYCLE: an entry Redis lost runs on and
finishes)."""

from __future__ import annotations

import time

import trio

from db.database import unit
from db.models import DONE, QUEUED, RUNNING, Task, now_ms
from executor.context import Limiters
from executor.outage import Outage
from executor.reconciler import Reconciler
from tests import handlers
from tests.conftest import _delete_prefix
from tests.executor.support import enqueue, row, running_daemon, statuses, task_spec
from tests.helpers import await_until

TTL_S = 0.5  # the heartbeat TTL of the unit tests here


def _reconciler(settings, streams):
    s = settings.replace(reconcile_grace_s=1.0, heartbeat_s=0.1, heartbeat_ttl_s=TTL_S)
    return Reconciler(s, streams, Limiters.for_settings(s), Outage("db"), Outage("redis"))


def _running_without_entry(streams, owner):
    (tid,) = enqueue(streams, [task_spec("noop", status=RUNNING, owner=owner, attempt=1)], publish=False)
    with unit():
        Task.update(update_time=now_ms() - 60_000).where(Task.id == tid).execute()
    return tid


def _forget_entry(rclient, keys, tid):
    """The re-published entry out of the way (nobody reads it here)."""
    for stream in (keys.queue(0), keys.backlog(0, "default")):
        rclient.xtrim(stream, maxlen=0)
    rclient.delete(keys.published(tid))


async def test_an_owner_without_a_heartbeat_is_given_a_ttl_to_write_one_before_its_row_is_requeued(
    xsettings, streams, rclient, keys, db
):
    tid = _running_without_entry(streams, "busy_1")
    rec = _reconciler(xsettings, streams)
    # Redis just lost its data: no heartbeat of the live owner yet
    assert rec.reconcile(force=True).requeued == []
    assert row(tid)["status"] == RUNNING
    rclient.set(keys.executor("busy_1"), "{}", ex=30)  # the owner's next tick
    time.sleep(TTL_S + 0.1)
    assert rec.reconcile(force=True).requeued == []
    assert row(tid)["status"] == RUNNING
    # now the owner dies: its absence is timed from the next pass that sees it, not the first
    rclient.delete(keys.executor("busy_1"))
    assert rec.reconcile(force=True).requeued == []
    time.sleep(TTL_S + 0.1)
    report = rec.reconcile(force=True)
    assert report.requeued == [tid] and report.republished == [tid]
    assert row(tid)["status"] == QUEUED
    assert "owner busy_1 has no heartbeat" in row(tid)["progress_msg"]
    _forget_entry(rclient, keys, tid)


async def test_a_redis_restart_between_two_sightings_restarts_the_wait(xsettings, streams, rclient, keys, db):
    tid = _running_without_entry(streams, "gone_1")
    rec = _reconciler(xsettings, streams)
    assert rec.reconcile(force=True).requeued == []
    time.sleep(TTL_S + 0.1)
    _delete_prefix(rclient, keys.prefix)  # Redis restarted just now, without its data
    streams.ensure_group()  # as the executors' read loop makes it again
    assert rec.reconcile(force=True).requeued == []  # the first sighting went with the data
    time.sleep(TTL_S + 0.1)
    assert rec.reconcile(force=True).requeued == [tid]  # a TTL since, still no heartbeat: dead
    _forget_entry(rclient, keys, tid)


async def test_the_fleets_passes_share_the_sightings_so_another_executors_pass_requeues(
    xsettings, streams, rclient, keys, db
):
    """The pass runs under a fleet lock that one executor wins at a time: the sighting one
    executor's pass made counts for the next pass, whichever executor makes it."""
    tid = _running_without_entry(streams, "gone_1")
    first, second = _reconciler(xsettings, streams), _reconciler(xsettings, streams)
    assert first.reconcile(force=True).requeued == []  # executor A: the first sighting
    time.sleep(TTL_S + 0.1)
    report = second.reconcile(force=True)  # executor B wins the lock a TTL later
    assert report.requeued == [tid] and report.republished == [tid]
    assert row(tid)["status"] == QUEUED


async def test_the_sightings_are_timed_by_redis_kept_in_one_expiring_hash_and_dropped_with_their_rows(
    xsettings, streams, rclient, keys, db
):
    tid = _running_without_entry(streams, "gone_1")
    rec = _reconciler(xsettings, streams)
    before_ms = int(rclient.time()[0]) * 1000
    assert rec.reconcile(force=True).requeued == []
    (seen,) = rclient.hgetall(keys.orphan_sightings).items()
    assert seen[0] == f"{tid}:1" and before_ms <= int(seen[1]) <= before_ms + 5000  # Redis's clock
    assert 0 < rclient.pttl(keys.orphan_sightings) <= rec.sightings_ttl_ms  # it expires
    rclient.set(keys.executor("gone_1"), "{}", ex=30)  # the owner was alive after all
    assert rec.reconcile(force=True).requeued == []
    assert not rclient.exists(keys.orphan_sightings)  # its row is no candidate now: the field went
    rclient.delete(keys.executor("gone_1"))
    assert rec.reconcile(force=True).requeued == []  # a fresh sighting: the wait starts again
    assert rclient.hkeys(keys.orphan_sightings) == [f"{tid}:1"]
    with unit():  # the run ended meanwhile (its owner finished it)
        Task.update(status=DONE).where(Task.id == tid).execute()
    assert rec.reconcile(force=True).requeued == []
    assert not rclient.exists(keys.orphan_sightings)  # no running row at all: none kept


async def test_a_task_whose_heartbeat_redis_lost_runs_once_and_finishes(
    xsettings, streams, rclient, keys, db
):
    # the owner's next heartbeat is up to 5 s away; the row is older than the grace at once
    s = xsettings.replace(
        max_concurrent_tasks=2, heartbeat_s=5.0, reconcile_grace_s=1.0, redelivery_timeout_s=30.0
    )
    handlers.CALLS.clear()
    (tid,) = enqueue(streams, [task_spec("sleep", seconds=3.0)])
    async with running_daemon(s, "host_1") as daemon:
        await await_until(lambda: statuses([tid])[tid] == RUNNING, 10)
        await trio.sleep(1.2)  # the row's update_time is older than the grace now
        _delete_prefix(rclient, s.key_prefix)  # Redis restarted without its data
        report = await trio.to_thread.run_sync(lambda: daemon.reconciler.reconcile(force=True))
        assert report is not None and report.requeued == []
        assert row(tid)["status"] == RUNNING and row(tid)["owner"] == "host_1"
        await await_until(lambda: statuses([tid])[tid] == DONE, 30)
    assert handlers.CALLS.count(tid) == 1 and row(tid)["attempt"] == 1
