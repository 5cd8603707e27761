"""A handler's exception fails the row with the error, and the message is acked."""

from __future__ import annotations

from db.models import FAILED
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


@rule("errors.permanent")
async def test_a_handler_exception_fails_the_row_and_the_message_is_acked(
    xsettings, streams, rclient, keys, db
):
    boom, bad = enqueue(
        streams, [task_spec("fail", error="boom"), task_spec("permanent", error="bad parameters")]
    )
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: row(boom)["status"] == FAILED and row(bad)["status"] == FAILED, 10)
        await await_until(lambda: rclient.xlen(keys.queue(0)) == 0, 5)
        assert daemon.statistics().retried == 0
    assert "failed: ValueError: boom" in row(boom)["progress_msg"]
    assert "failed: PermanentError: bad parameters" in row(bad)["progress_msg"]
    assert row(boom)["progress"] == -1 and row(boom)["retry_count"] == 0
    assert rclient.xlen(keys.dead) == 0
