"""The fair gate in a running executor: round robin between tenants, caps, pausing, results."""

from __future__ import annotations

import time

import orjson
import trio

from db.gate import Gate
from db.models import DONE, QUEUED
from db.results import Results
from ingest.tenants import set_limits
from tests import handlers
from tests.executor.support import all_in, enqueue, running_daemon, statuses, task_spec
from tests.helpers import await_until


def _specs(tenant: str, n: int, task_type: str = "noop", **fields: object) -> list[dict[str, object]]:
    return [task_spec(task_type, tenant_id=tenant, **fields) for _ in range(n)]


async def test_a_small_tenant_starts_within_its_round_behind_a_large_backlog(
    xsettings, streams, rclient, keys, db
):
    big = enqueue(streams, _specs("big", 2000))
    small = enqueue(streams, _specs("small", 3))  # published after all 2,000
    handlers.CALLS.clear()
    async with running_daemon(xsettings.replace(max_concurrent_tasks=1)):
        await await_until(lambda: all_in(small, DONE), 30)
    starts = list(handlers.CALLS)
    positions = sorted(starts.index(t) for t in small)
    assert positions[-1] < 3 * 2, positions  # within the first 3 × (number of tenants) admissions
    assert len(set(starts) & set(big)) >= 2  # and the big tenant was served in between


async def test_a_tenant_never_runs_more_than_its_cap_and_a_cap_of_one_never_runs_two(
    xsettings, streams, rclient, keys, db
):
    set_limits(xsettings, "one", {"max_running": 1})
    set_limits(xsettings, "two", {"max_running": 2})
    ids = {t: enqueue(streams, _specs(t, 6, "sleep", seconds=0.15)) for t in ("one", "two")}
    peaks = {"one": 0, "two": 0}
    async with running_daemon(xsettings.replace(max_concurrent_tasks=6)):
        while not all(all_in(v, DONE) for v in ids.values()):
            now = int(rclient.time()[0]) * 1000
            for t in peaks:
                peaks[t] = max(peaks[t], int(rclient.zcount(keys.running(t), now, "+inf")))
                running = sum(s == "running" for s in statuses(ids[t]).values())
                assert running <= {"one": 1, "two": 2}[t]
            await trio.sleep(0.02)
    assert peaks == {"one": 1, "two": 2}  # the caps were reached, never passed
    assert all(rclient.zcard(keys.running(t)) == 0 for t in peaks)  # every slot went with its ack


async def test_a_paused_tenant_waits_and_runs_once_its_cap_is_raised(xsettings, streams, rclient, keys, db):
    set_limits(xsettings, "paused", {"max_running": 0})
    held = enqueue(streams, _specs("paused", 2))
    other = enqueue(streams, _specs("other", 2))
    async with running_daemon(xsettings):
        await await_until(lambda: all_in(other, DONE), 10)
        await trio.sleep(0.3)
        assert set(statuses(held).values()) == {QUEUED}
        assert Gate(rclient, keys).tenant("paused", 0).parked
        set_limits(xsettings, "paused", {"max_running": None})  # back to the default
        await await_until(lambda: all_in(held, DONE), 10)


async def test_a_finished_task_writes_its_result_and_one_completion_event(
    xsettings, streams, rclient, keys, db
):
    pubsub = rclient.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.updates)
    ok, bad = enqueue(streams, [task_spec("noop", tenant_id="t1"), task_spec("permanent", tenant_id="t1")])
    async with running_daemon(xsettings):
        await await_until(lambda: all_in([ok], DONE) and statuses([bad])[bad] == "failed", 10)
        await trio.sleep(0.2)
    events = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        m = pubsub.get_message(timeout=0.1)
        if m is not None:
            events.append(orjson.loads(m["data"]))
    pubsub.close()
    ends = [e for e in events if e.get("result_key")]
    assert sorted(e["task_id"] for e in ends) == sorted([ok, bad])  # one each
    results = Results(rclient, keys)
    got = results.fetch(ok, tenant_id="t1", single_use=False, removal_delay_s=1)
    assert got is not None and got["kind"] == "success" and got["status"] == DONE and got["tenant_id"] == "t1"
    failed = results.fetch(bad, tenant_id="t1", single_use=False, removal_delay_s=1)
    assert failed is not None and failed["kind"] == "failure" and failed["error"]
    assert results.fetch(ok, tenant_id="someone-else", single_use=False, removal_delay_s=1) is None
    ttl = rclient.ttl(keys.result(ok))
    assert xsettings.results_ttl_s - 60 < ttl <= xsettings.results_ttl_s  # unfetched: lives its TTL
