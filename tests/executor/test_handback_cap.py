"""Hand-backs count toward the cap: a task handed back more than ``max_deliveries`` times is
dead-lettered as delivered that often; one handed back exactly that often still runs."""

from __future__ import annotations

from db.models import DEAD, DONE
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


@rule("lease.hand-back")
async def test_a_task_handed_back_more_often_than_the_cap_counts_as_delivered_that_often(
    xsettings, streams, rclient, keys, db
):
    over, at = enqueue(streams, [task_spec("noop", handback_count=4), task_spec("noop", handback_count=3)])
    async with running_daemon(xsettings.replace(max_deliveries=3), "host_1"):
        await await_until(lambda: row(over)["status"] == DEAD and row(at)["status"] == DONE, 15)
    [(_, letter)] = rclient.xrange(keys.dead)
    assert letter["task_id"] == over and letter["deliveries"] == "4"
    assert letter["reason"].startswith("gave up after 4 deliveries")
