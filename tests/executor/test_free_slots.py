"""An executor never reads more entries than it has free slots; the rest wait for others."""

from __future__ import annotations

import trio

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
