"""The tenants' limits mirror in Redis: only a complete copy of the table marks it complete, the
gate admits nobody while it is not, every executor makes that copy at start and after a loss,
and a copy that failed is repaired."""

from __future__ import annotations

import threading
import time

import pytest
import redis
import trio

from db.gate import Gate
from db.models import DONE, QUEUED
from executor import reconciler
from executor.context import Limiters
from executor.outage import Outage
from executor.reconciler import Reconciler
from ingest import tenants
from ingest.tenants import limits_of, set_limits
from tests.conftest import _delete_prefix
from tests.executor.support import all_in, enqueue, running_daemon, statuses, task_spec


def _reconciler(settings, streams):
    return Reconciler(settings, streams, Limiters.for_settings(settings), Outage("db"), Outage("redis"))


def _pass(settings, streams):
    """One reconciler pass (it makes the complete copy of the limits, and marks it)."""
    return _reconciler(settings, streams).reconcile(force=True)


def _admit(rclient, keys, consumer="c_1"):
    """What one dispatch admits and reads (acked at once: nobody runs them here)."""
    got = Gate(rclient, keys).dispatch(keys.group, consumer, 10, default_max_running=5, slot_ms=60_000)
    admitted = [
        (stream, eid, dict(zip(f[::2], f[1::2], strict=True))) for stream, es in got.reply for eid, f in es
    ]
    for stream, eid, _ in admitted:
        rclient.xack(stream, keys.group, eid)
        rclient.xdel(stream, eid)
    return [fields["tenant"] for _, _, fields in admitted]


def _message(n, tenant):
    return {"id": f"{n:032x}", "doc_id": "", "task_type": "noop", "priority": 0, "tenant_id": tenant}


def _lose_redis(rclient, keys, streams):
    _delete_prefix(rclient, keys.prefix)  # a restart without persistence: every key gone
    streams.ensure_group()  # as the executors' read loop makes it again


def test_a_tenant_limits_change_after_a_loss_leaves_the_others_to_the_complete_copy(
    xsettings, streams, rclient, keys, db
):
    set_limits(xsettings, "paused", {"max_running": 0})
    set_limits(xsettings, "capped", {"max_running": 1})
    _pass(xsettings, streams)
    _lose_redis(rclient, keys, streams)
    set_limits(xsettings, "other", {"max_queued": 10})  # before any executor looked
    assert not rclient.exists(keys.limits_mirrored)  # one tenant's copy is no complete one
    report = _pass(xsettings, streams)
    assert report.limits_mirrored == 2  # paused and capped; other's copy was right
    assert rclient.hget(keys.limits("paused"), "max_running") == "0"
    assert rclient.hget(keys.limits("capped"), "max_running") == "1"
    assert rclient.exists(keys.limits_mirrored)
    streams.publish_many([_message(1, "paused"), _message(2, "capped"), _message(3, "capped")])
    assert _admit(rclient, keys) == ["capped"]  # the paused tenant waits, capped runs one
    rclient.delete(keys.backlog(0, "paused"), keys.backlog(0, "capped"))


def test_the_gate_admits_nobody_while_the_mirror_is_incomplete_then_obeys_the_copy(
    xsettings, streams, rclient, keys, db
):
    set_limits(xsettings, "paused", {"max_running": 0})
    _pass(xsettings, streams)
    _lose_redis(rclient, keys, streams)
    streams.publish_many([_message(1, "paused"), _message(2, "other")])  # submits after the loss
    assert _admit(rclient, keys) == []
    got = Gate(rclient, keys).dispatch(keys.group, "c_1", 10, default_max_running=5, slot_ms=60_000)
    assert got.reply == [] and got.limits_missing and not got.more
    direct = rclient.xadd(keys.queue(0), {"message": "{}", "tenant": "x"})  # outside the gate
    got = Gate(rclient, keys).dispatch(keys.group, "c_1", 10, default_max_running=5, slot_ms=60_000)
    assert [eid for _, es in got.reply for eid, _ in es] == [direct]  # still read
    rclient.xack(keys.queue(0), keys.group, direct)
    assert _pass(xsettings, streams).limits_mirrored == 1  # paused
    assert _admit(rclient, keys) == ["other"]
    assert Gate(rclient, keys).tenant("paused", 0).parked
    rclient.delete(keys.backlog(0, "paused"))


async def test_an_executor_on_a_fresh_redis_runs_its_first_task_without_waiting_for_a_pass(
    xsettings, streams, rclient, keys, db
):
    assert not rclient.exists(keys.limits_mirrored)  # a fresh install: nothing copied yet
    async with running_daemon(xsettings):
        began = time.monotonic()
        (tid,) = enqueue(streams, [task_spec("noop")])
        with trio.fail_after(10):
            while not all_in([tid], DONE):
                await trio.sleep(0.02)
        took = time.monotonic() - began
    assert rclient.exists(keys.limits_mirrored)
    assert took < 1.5, took  # under the read's 2 s block: the copy woke the read


async def test_after_a_redis_loss_a_running_executor_copies_the_limits_before_admitting_anyone(
    xsettings, streams, rclient, keys, db
):
    set_limits(xsettings, "paused", {"max_running": 0})
    async with running_daemon(xsettings):  # its pass is a minute away (reconcile_grace_s)
        with trio.fail_after(5):
            while not rclient.exists(keys.limits_mirrored):
                await trio.sleep(0.02)
        _lose_redis(rclient, keys, streams)
        held = enqueue(streams, [task_spec("noop", tenant_id="paused") for _ in range(2)])
        ran = enqueue(streams, [task_spec("noop", tenant_id="other") for _ in range(2)])
        with trio.fail_after(10):
            while not all_in(ran, DONE):
                await trio.sleep(0.02)
        await trio.sleep(0.3)
        assert set(statuses(held).values()) == {QUEUED}
        assert rclient.hget(keys.limits("paused"), "max_running") == "0"
        set_limits(xsettings, "paused", {"max_running": None})
        with trio.fail_after(10):
            while not all_in(held, DONE):
                await trio.sleep(0.02)


async def test_a_dispatch_that_finds_the_mark_missing_has_its_executor_copy_the_limits_at_once(
    xsettings, streams, rclient, keys, db, monkeypatch
):
    """The gate says in every dispatch whether the mark is missing, and the executor whose
    dispatch says so copies the limits at once: no look at the mark every half second per
    executor while nothing is lost."""
    monkeypatch.setattr(reconciler, "LIMITS_FALLBACK_S", 60.0, raising=False)  # only the wake-ups
    looks: list[float] = []
    real = Reconciler.mirror_limits_if_missing

    async def counted(self):
        looks.append(time.monotonic())
        return await real(self)

    monkeypatch.setattr(Reconciler, "mirror_limits_if_missing", counted)
    set_limits(xsettings, "paused", {"max_running": 0})
    async with running_daemon(xsettings):  # its pass is a minute away (reconcile_grace_s)
        with trio.fail_after(5):
            while not rclient.exists(keys.limits_mirrored):
                await trio.sleep(0.02)
        await trio.sleep(0.5)  # a dispatch before the start-up copy asked for one more look
        idle_since = time.monotonic()
        await trio.sleep(2.5)  # idle, nothing lost: the executor's dispatches say the mark is there
        assert [t for t in looks if t > idle_since] == []
        _lose_redis(rclient, keys, streams)  # nothing published: an idle read blocks ≤ 2 s
        with trio.fail_after(3):
            while not rclient.exists(keys.limits_mirrored):
                await trio.sleep(0.02)
        assert rclient.hget(keys.limits("paused"), "max_running") == "0"
        _lose_redis(rclient, keys, streams)
        lost = time.monotonic()
        (tid,) = enqueue(streams, [task_spec("noop", tenant_id="other")])  # the publish wakes it
        with trio.fail_after(10):
            while not rclient.exists(keys.limits_mirrored):
                await trio.sleep(0.01)
        copied = time.monotonic() - lost
        with trio.fail_after(10):
            while not all_in([tid], DONE):
                await trio.sleep(0.02)
    assert copied < 1.0, copied
    assert rclient.hget(keys.limits("paused"), "max_running") == "0"


def test_a_failed_copy_of_one_tenant_marks_the_mirror_incomplete_and_the_next_look_repairs_it(
    xsettings, streams, rclient, keys, db, monkeypatch
):
    set_limits(xsettings, "acme", {"max_running": 3})
    _pass(xsettings, streams)
    real = tenants.mirror_limits

    def refused(*args, **kwargs):
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(tenants, "mirror_limits", refused)
    with pytest.raises(Exception, match="marked incomplete") as raised:
        set_limits(xsettings, "acme", {"max_running": 0})
    assert isinstance(raised.value, tenants.MirrorError)
    monkeypatch.setattr(tenants, "mirror_limits", real)
    assert limits_of(xsettings, "acme").max_running == 0  # the row changed all the same
    assert rclient.hget(keys.limits("acme"), "max_running") == "3"  # the copy did not
    assert not rclient.exists(keys.limits_mirrored)  # so the gate admits nobody, and
    assert trio.run(_reconciler(xsettings, streams).mirror_limits_if_missing) == 1  # the next look
    assert rclient.hget(keys.limits("acme"), "max_running") == "0"
    assert rclient.exists(keys.limits_mirrored)
    # "the next look": the mark's removal wakes the fleet, whose next dispatch finds it missing
    # and has its executor look at once (test_a_dispatch_that_finds_the_mark_missing_…)
    assert reconciler.LIMITS_LOOK_GAP_S <= 1.0


def test_a_copy_that_could_not_reach_redis_at_all_is_repaired_by_the_next_pass(
    xsettings, streams, rclient, keys, db
):
    from tests.procs import free_port

    set_limits(xsettings, "acme", {"max_running": 3})
    _pass(xsettings, streams)
    away = xsettings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(Exception, match="next pass") as raised:
        set_limits(away, "acme", {"max_running": 0})
    assert isinstance(raised.value, tenants.MirrorError)
    assert rclient.exists(keys.limits_mirrored)  # nobody could drop the mark
    assert rclient.hget(keys.limits("acme"), "max_running") == "3"
    report = _pass(xsettings, streams)
    assert report.limits_mirrored == 1 and rclient.hget(keys.limits("acme"), "max_running") == "0"
    assert _pass(xsettings, streams).limits_mirrored == 0


def test_a_limits_change_committed_during_a_complete_copy_is_not_overwritten_by_it(
    xsettings, streams, rclient, keys, db, monkeypatch
):
    set_limits(xsettings, "acme", {"max_running": 3})
    rclient.delete(keys.limits("acme"), keys.limits_mirrored)  # lost with Redis's data
    real = tenants.all_overrides
    reads = []

    def read_then_change():
        rows = real()
        if not reads:  # between the copy's first read and its write, another process changes
            # the limit and writes its copy (a thread: a connection of its own)
            change = threading.Thread(target=set_limits, args=(xsettings, "acme", {"max_running": 0}))
            change.start()
            change.join()
        reads.append(rows)
        return rows

    monkeypatch.setattr(tenants, "all_overrides", read_then_change)
    monkeypatch.setattr(reconciler, "all_overrides", read_then_change, raising=False)  # (before)
    _pass(xsettings, streams)
    assert rclient.hget(keys.limits("acme"), "max_running") == "0"
    assert rclient.exists(keys.limits_mirrored)
    assert len(reads) == 3  # read, changed meanwhile: copied again, read again (then equal)
