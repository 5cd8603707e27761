"""Retryable errors are tried again in place, with a line on the row for each try, up to a cap."""

from __future__ import annotations

from db.models import DONE, FAILED
from tests.executor.support import FAST_RETRIES, enqueue, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


@rule("errors.retryable")
async def test_a_retryable_error_is_retried_with_a_line_per_try_then_succeeds(xsettings, streams, db):
    (tid,) = enqueue(streams, [task_spec("flaky", failures=2)])
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: row(tid)["status"] == DONE, 10)
        assert daemon.statistics().retried == 2
    done = row(tid)
    lines = done["progress_msg"].splitlines()
    assert sum("try 1/5 failed: RetryableError: transient failure number 1" in line for line in lines) == 1
    assert sum("try 2/5 failed: RetryableError: transient failure number 2" in line for line in lines) == 1
    assert "succeeded on try 3" in lines[-1]
    assert done["retry_count"] == 2 and done["attempt"] == 1


@rule("errors.retryable")
async def test_retries_stop_at_the_cap_and_the_row_fails_with_the_last_error(xsettings, streams, db):
    (tid,) = enqueue(streams, [task_spec("flaky", failures=99)])
    async with running_daemon(xsettings):
        await await_until(lambda: row(tid)["status"] == FAILED, 10)
    failed = row(tid)
    assert failed["retry_count"] == FAST_RETRIES.max_tries - 1
    assert (
        failed["progress_msg"]
        .splitlines()[-1]
        .endswith(f"failed: RetryableError: transient failure number {FAST_RETRIES.max_tries}")
    )
