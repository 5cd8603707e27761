"""An executor never reads more entries than it has free slots; the rest wait for others."""

from __future__ import annotations

import trio

from db.gate import Gate
from db.models import QUEUED, RUNNING
from tests.executor.support import enqueue, running_daemon, statuses, task_spec
from tests.helpers import await_until, waiting
from tests.lifecycle import rule


@rule("read.new-entries-free-slots")
async def test_never_more_entries_read_than_free_slots(xsettings, streams, rclient, keys, db):
    ids = enqueue(streams, [task_spec("hang") for _ in range(6)])
    async with running_daemon(xsettings.replace(max_concurrent_tasks=2), "host_1") as daemon:
        await await_until(lambda: list(statuses(ids).values()).count(RUNNING) == 2, 10)
        await trio.sleep(0.5)  # time for a wrong extra read
        summary = rclient.xpending(keys.queue(0), keys.group)
        assert summary["pending"] == 2 and summary["consumers"] == [{"name": "host_1", "pending": 2}]
        assert sorted(statuses(ids).values()) == [QUEUED] * 4 + [RUNNING] * 2
        assert daemon.statistics().running == 2
    # the two running were handed back at shutdown: queued again, nothing pending
    assert sorted(statuses(ids).values()) == [QUEUED] * 6
    assert waiting(rclient, keys) == 6


@rule("read.new-entries-free-slots")
async def test_a_sweep_while_the_read_waits_does_not_let_the_read_pass_the_free_slots(
    xsettings, streams, rclient, keys, db
):
    """An idle executor waits on the wake-up stream with every slot free; a sweep meanwhile
    takes over a dead executor's entries into those slots. The publish that wakes the read
    must not admit as many again: the read counts the slots free when it reads."""
    s = xsettings.replace(max_concurrent_tasks=2, redelivery_timeout_s=1.0)
    ghosts = enqueue(streams, [task_spec("hang") for _ in range(2)])
    rclient.set(keys.limits_mirrored, "1")
    got = Gate(rclient, keys).dispatch(keys.group, "ghost", 2, default_max_running=5, slot_ms=60_000)
    assert sum(len(es) for _, es in got.reply) == 2  # pending under an executor that died
    async with running_daemon(s, "host_1"):
        await await_until(lambda: list(statuses(ghosts).values()).count(RUNNING) == 2, 10)
        later = enqueue(streams, [task_spec("hang") for _ in range(2)])  # wakes the waiting read
        await trio.sleep(1.0)  # time for a wrong read
        assert sorted(statuses(later).values()) == [QUEUED, QUEUED]
        summary = rclient.xpending(keys.queue(0), keys.group)
        assert summary["consumers"] == [{"name": "host_1", "pending": 2}], summary
