"""The reconciler: queued rows without an entry are published again after the grace period;
running rows of a dead owner without an entry go back to queued; chunks of cancelled tasks
nobody runs are removed; consumers with no pending entry and no heartbeat leave the group."""

from __future__ import annotations

import orjson

from db.database import unit
from db.models import CANCELLED, DONE, QUEUED, RUNNING, Chunk, Task, now_ms
from executor.context import Limiters
from executor.outage import Outage
from executor.reconciler import STAT_REPUBLISHED, STAT_REQUEUED, Reconciler
from tests.executor.support import enqueue, make_document, row, running_daemon, task_spec
from tests.helpers import admit, await_until, waiting
from tests.lifecycle import rule

OLD = 60_000  # ms: older than the grace period used here


def _reconciler(settings, streams):
    return Reconciler(
        settings.replace(reconcile_grace_s=1.0),
        streams,
        Limiters.for_settings(settings),
        Outage("db"),
        Outage("redis"),
    )


def _age(task_ids, **fields):
    with unit():
        Task.update(update_time=now_ms() - OLD, **fields).where(Task.id.in_(task_ids)).execute()


@rule("lease.reconciler")
async def test_a_queued_row_without_an_entry_is_published_once_the_grace_is_over(
    xsettings, streams, rclient, keys, db
):
    lost, fresh = enqueue(streams, [task_spec("noop"), task_spec("noop")], publish=False)
    live = enqueue(streams, [task_spec("noop")])
    _age([lost] + live)
    report = _reconciler(xsettings, streams).reconcile(force=True)
    assert report.republished == [lost] and report.requeued == []
    assert rclient.exists(keys.published(lost)) and not rclient.exists(keys.published(fresh))
    assert waiting(rclient, keys) == 2  # the live one kept its single entry
    assert rclient.hget(keys.stats, STAT_REPUBLISHED) == "1"
    assert _reconciler(xsettings, streams).reconcile(force=True).republished == []  # it has one now
    rclient.xtrim(keys.backlog(0, "default"), maxlen=0)  # nobody reads them here
    rclient.delete(keys.published(lost), *[keys.published(t) for t in live])


@rule("lease.reconciler")
async def test_a_running_row_of_a_dead_owner_without_an_entry_is_queued_again_and_finishes(
    xsettings, streams, rclient, keys, db
):
    kb, doc = make_document()
    (tid,) = enqueue(
        streams, [task_spec("noop", doc_id=doc, status=RUNNING, owner="ghost_1", attempt=1)], publish=False
    )
    _age([tid])
    async with running_daemon(xsettings.replace(reconcile_grace_s=1.0), "host_1"):
        await await_until(lambda: row(tid)["status"] == DONE, 15)
    done = row(tid)
    assert done["attempt"] == 2 and done["owner"] == "host_1"
    assert "re-queued by the reconciler: owner ghost_1 has no heartbeat" in done["progress_msg"]
    assert (
        rclient.hget(keys.stats, STAT_REQUEUED) == "1" and rclient.hget(keys.stats, STAT_REPUBLISHED) == "1"
    )


@rule("lease.reconciler")
async def test_a_running_row_whose_owner_lives_or_whose_entry_lives_is_left_alone(
    xsettings, streams, rclient, keys, db
):
    alive, entry = enqueue(
        streams,
        [
            task_spec("noop", status=RUNNING, owner="busy_1", attempt=1),
            task_spec("noop", status=RUNNING, owner="gone_1", attempt=1),
        ],
        publish=False,
    )
    rclient.set(keys.executor("busy_1"), "{}", ex=30)
    streams.publish_many([{"id": entry, "task_type": "noop", "priority": 0}])  # its entry lives
    _age([alive, entry])
    report = _reconciler(xsettings, streams).reconcile(force=True)
    assert report.republished == [] and report.requeued == []
    assert row(alive)["status"] == RUNNING and row(entry)["status"] == RUNNING
    rclient.delete(keys.published(entry), keys.backlog(0, "default"))


@rule("lease.reconciler")
async def test_chunks_of_a_cancelled_task_nobody_runs_are_removed(xsettings, streams, rclient, keys, db):
    kb, doc = make_document()
    idle, running = enqueue(
        streams,
        [
            task_spec("noop", doc_id=doc, kb_id=kb, status=CANCELLED, owner="gone_1"),
            task_spec("noop", doc_id=doc, kb_id=kb, status=CANCELLED, owner="busy_1"),
        ],
        publish=False,
    )
    rclient.set(keys.executor("busy_1"), orjson.dumps({"running": [running]}), ex=30)
    with unit():
        Chunk.insert_many(
            [
                {
                    "id": f"{t[:24]}{i:08d}",
                    "kb_id": kb,
                    "doc_id": doc,
                    "task_id": t,
                    "position": i,
                    "content": "x",
                }
                for t in (idle, running)
                for i in range(3)
            ]
        ).execute()
    _age([idle, running])
    report = _reconciler(xsettings, streams).reconcile(force=True)
    assert report.chunks_removed == 3
    with unit():
        left = {t for (t,) in Chunk.select(Chunk.task_id).tuples()}
    assert left == {running}  # its executor removes them when its run stops


@rule("lease.consumer-removal")
async def test_only_consumers_with_no_pending_entry_and_no_heartbeat_leave_the_group(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("noop")])
    stream = keys.queue(0)
    admit(rclient, keys, "holder_1", 1)  # has a pending entry
    for name in ("idle_1", "alive_1"):
        rclient.xgroup_createconsumer(stream, keys.group, name)  # no pending entry
    rclient.set(keys.executor("alive_1"), "{}", ex=30)
    report = _reconciler(xsettings, streams).reconcile(force=True)
    assert report.consumers_removed == ["idle_1"]
    names = {c["name"] for c in rclient.xinfo_consumers(stream, keys.group)}
    assert names == {"holder_1", "alive_1"}
    rclient.xack(
        stream,
        keys.group,
        *[p["message_id"] for p in rclient.xpending_range(stream, keys.group, "-", "+", 10)],
    )
    assert row(tid)["status"] == QUEUED


async def test_one_reconciler_of_the_fleet_per_interval(xsettings, streams, rclient, keys, db):
    first, second = _reconciler(xsettings, streams), _reconciler(xsettings, streams)
    assert first.reconcile() is not None
    assert second.reconcile() is None  # the fleet lock is held for the interval
    assert rclient.pttl(keys.lock("reconcile")) > 0


async def test_tenant_limits_lost_with_redis_are_mirrored_again_and_the_gate_obeys_them(
    xsettings, streams, rclient, keys, db
):
    from ingest.tenants import set_limits

    set_limits(xsettings, "acme", {"max_running": 0})
    rclient.delete(keys.limits("acme"), keys.limits_mirrored)  # as if Redis lost its data
    report = _reconciler(xsettings, streams).reconcile(force=True)
    assert report.limits_mirrored == 1 and rclient.hget(keys.limits("acme"), "max_running") == "0"
    assert _reconciler(xsettings, streams).reconcile(force=True).limits_mirrored == 0


async def test_hole2_a_queued_row_whose_entry_was_trimmed_is_published_again(
    xsettings, streams, rclient, keys, db
):
    """Issue 12 hole 2: the published key has no expiry now, so one whose entry went without an
    ack (an operator's XTRIM) must not hide the row from the reconciler for ever."""
    (tid,) = enqueue(streams, [task_spec("noop")])
    rclient.xtrim(keys.backlog(0, "default"), maxlen=0, approximate=False)
    _age([tid])
    report = _reconciler(xsettings, streams).reconcile(force=True)
    assert report.republished == [tid] and waiting(rclient, keys) == 1
    rclient.xtrim(keys.backlog(0, "default"), maxlen=0, approximate=False)
    rclient.delete(keys.published(tid))
