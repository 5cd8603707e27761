"""Reclaim: entries idle past the redelivery timeout are taken over by any live executor (never
by name), no more than its free slots, counted as deliveries, capped, one sweeper at a time."""

from __future__ import annotations

import time

import trio

from db.database import unit
from db.models import DEAD, DONE, RUNNING, Task
from db.streams import Streams, connect
from executor.book import Book
from executor.context import Limiters
from executor.outage import Outage
from executor.sweeper import START_CURSOR, Sweeper
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import admit, await_until, waiting
from tests.lifecycle import rule
from tests.procs import PrivateRedis


def _left_by(rclient, keys, task_ids, name, rereads=0, status=RUNNING):
    """As if consumer ``name`` had read these entries (and re-read them) and then died."""
    admit(rclient, keys, name, 1000)
    for _ in range(rereads):
        rclient.xreadgroup(keys.group, name, {keys.queue(0): "0"}, count=1000)
    with unit():
        Task.update(status=status, owner=name, attempt=1).where(Task.id.in_(task_ids)).execute()


def _pending_of(rclient, keys, consumer):
    return [
        p
        for p in rclient.xpending_range(keys.queue(0), keys.group, "-", "+", 1000)
        if p["consumer"] == consumer
    ]


def _sweeper(settings, streams, capacity=10):
    async def dispatch(entries):
        raise AssertionError("not used")

    book = Book(capacity)
    return Sweeper(
        settings, "host_1", streams, book, Limiters.for_settings(settings), Outage("redis"), dispatch
    )


@rule("lease.reclaim")
async def test_entries_of_a_dead_consumer_are_taken_over_by_a_live_one_under_another_name(
    xsettings, streams, rclient, keys, db
):
    ids = enqueue(streams, [task_spec("noop") for _ in range(3)])
    _left_by(rclient, keys, ids, "ghost_1")
    async with running_daemon(xsettings.replace(redelivery_timeout_s=0.5), "host_1") as daemon:
        await await_until(lambda: all(row(t)["status"] == DONE for t in ids), 15)
    assert all(row(t)["owner"] == "host_1" and row(t)["attempt"] == 2 for t in ids)
    assert daemon.sweeper.statistics().reclaimed == 3
    assert _pending_of(rclient, keys, "ghost_1") == [] and rclient.xlen(keys.dead) == 0


@rule("lease.reclaim")
async def test_a_sweep_takes_no_more_than_the_free_slots_and_follows_its_cursor(
    xsettings, streams, rclient, keys, db
):
    ids = enqueue(streams, [task_spec("noop") for _ in range(7)])
    _left_by(rclient, keys, ids, "ghost_1")
    sweeper = _sweeper(xsettings.replace(redelivery_timeout_s=0.2), streams)
    await trio.sleep(0.3)
    first = sweeper.reclaim(3)
    assert len(first) == 3 and all(e.reclaimed and e.deliveries == 2 for e in first)
    assert sweeper.cursors[keys.queue(0)] != START_CURSOR
    second = sweeper.reclaim(3)
    third = sweeper.reclaim(3)
    taken = [e.entry_id for e in first + second + third]
    assert [len(first), len(second), len(third)] == [3, 3, 1]
    assert taken == sorted(taken) and len(set(taken)) == 7  # walked in order, each once
    assert sweeper.cursors[keys.queue(0)] == START_CURSOR  # the pending list is walked
    assert len(_pending_of(rclient, keys, "host_1")) == 7
    rclient.xack(keys.queue(0), keys.group, *taken)


async def test_one_sweeper_of_the_fleet_at_a_time(xsettings, streams, rclient, keys, db):
    ids = enqueue(streams, [task_spec("noop")])
    _left_by(rclient, keys, ids, "ghost_1")
    sweeper = _sweeper(xsettings.replace(redelivery_timeout_s=0.2), streams)
    await trio.sleep(0.3)
    rclient.set(keys.lock("sweep"), "another executor", px=5000)
    assert sweeper.reclaim(5) is None and sweeper.statistics().skipped_busy == 1
    rclient.delete(keys.lock("sweep"))
    [entry] = sweeper.reclaim(5)
    assert not rclient.exists(keys.lock("sweep"))  # released after the pass
    rclient.xack(keys.queue(0), keys.group, entry.entry_id)


async def test_no_reclaim_right_after_a_redis_restart_or_an_outage(xsettings, keys, tmp_path):
    with PrivateRedis(tmp_path) as server:
        client = connect(server.url)
        streams = Streams(client, keys)
        streams.ensure_group()
        sweeper = _sweeper(xsettings.replace(redis_url=server.url, redelivery_timeout_s=5.0), streams)
        assert sweeper.reclaim(5) is None  # up for less than a redelivery timeout: owners renew first
        client.close()
    sweeper = _sweeper(
        xsettings.replace(redelivery_timeout_s=0.5), Streams(connect(xsettings.redis_url), keys)
    )
    sweeper.outage.failed(ConnectionError("down"))
    sweeper.outage.ok()
    assert await sweeper.sweep_once() == []  # quiet for a redelivery timeout after the outage
    assert sweeper.statistics().passes == 0
    sweeper.client.close()


@rule("lease.reclaim")
async def test_a_reclaimed_entry_past_the_cap_is_dead_lettered_and_one_of_a_done_row_just_acked(
    xsettings, streams, rclient, keys, db
):
    running, done = enqueue(streams, [task_spec("noop"), task_spec("noop")])
    _left_by(rclient, keys, [running, done], "ghost_1", rereads=2)  # delivered 3 times
    with unit():
        Task.update(status=DONE, progress=1.0).where(Task.id == done).execute()
    async with running_daemon(xsettings.replace(redelivery_timeout_s=0.3, max_deliveries=3), "host_1"):
        await await_until(lambda: row(running)["status"] == DEAD, 15)
        await await_until(lambda: waiting(rclient, keys) == 0, 15)
    [(_, letter)] = rclient.xrange(keys.dead)
    assert letter["task_id"] == running and letter["deliveries"] == "4"
    assert letter["reason"].startswith("gave up after 4 deliveries")
    assert "gave up after 4 deliveries" in row(running)["progress_msg"]
    assert row(done)["status"] == DONE


@rule("validate.duplicates")
async def test_a_reclaimed_entry_takes_over_a_row_whose_owner_still_has_a_heartbeat(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("noop")])
    _left_by(rclient, keys, [tid], "stalled_1")
    rclient.set(keys.executor("stalled_1"), "{}", ex=30)  # alive, but it stopped renewing
    started = time.monotonic()
    async with running_daemon(xsettings.replace(redelivery_timeout_s=0.5), "host_1"):
        await await_until(lambda: row(tid)["status"] == DONE, 15)
    assert row(tid)["owner"] == "host_1" and row(tid)["attempt"] == 2
    assert time.monotonic() - started >= 0.5


async def test_a_sweep_claims_nothing_once_the_drain_began_even_a_pass_in_flight(
    xsettings, streams, rclient, keys, db
):
    ids = enqueue(streams, [task_spec("noop") for _ in range(2)])
    _left_by(rclient, keys, ids, "ghost_1")
    settings = xsettings.replace(redelivery_timeout_s=0.2)
    await trio.sleep(0.3)
    drained = _sweeper(settings, streams)  # its dispatch fails the test if called
    drained.book.stop_reading()
    assert await drained.sweep_once() == []
    assert len(_pending_of(rclient, keys, "ghost_1")) == 2  # not even taken from their owner

    in_flight = _sweeper(settings, streams)
    reclaim = in_flight.reclaim

    def reclaim_as_the_drain_begins(free):
        found = reclaim(free)
        trio.from_thread.run_sync(in_flight.book.stop_reading)
        return found

    in_flight.reclaim = reclaim_as_the_drain_begins
    assert await in_flight.sweep_once() == []  # taken, then left for another executor's sweep
    assert len(_pending_of(rclient, keys, "host_1")) == 2
    async with running_daemon(settings, "host_2"):
        await await_until(lambda: all(row(t)["status"] == DONE for t in ids), 15)
    assert all(row(t)["owner"] == "host_2" for t in ids)
