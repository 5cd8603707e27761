"""A task that runs past ``task_timeout_s`` is ended and fails with a timeout message."""

from __future__ import annotations

from db.models import FAILED
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until


async def test_a_task_exceeding_a_short_timeout_fails_with_a_timeout_message(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("hang")])
    async with running_daemon(xsettings.replace(task_timeout_s=0.5)) as daemon:
        await await_until(lambda: row(tid)["status"] == FAILED, 10)
        await await_until(lambda: rclient.xlen(keys.queue(0)) == 0, 5)
        assert daemon.statistics().timed_out == 1 and daemon.statistics().running == 0
    failed = row(tid)
    assert "timed out after 0.5 s" in failed["progress_msg"] and failed["progress"] == -1
    assert 0.4 < failed["process_duration"] < 3
