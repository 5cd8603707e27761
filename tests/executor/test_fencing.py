"""Every write of a run is fenced by its attempt: once another attempt owns the row, nothing lands."""

from __future__ import annotations

import trio

from db.database import unit
from db.models import DONE, FAILED, RUNNING, Task
from db.streams import Entry
from executor.book import Claimed
from executor.finisher import Outcome, write_outcomes
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


@rule("claim.fenced")
async def test_a_run_whose_row_moved_to_a_newer_attempt_writes_nothing_more_and_stops(
    xsettings, streams, rclient, keys, db
):
    steps = [round(0.05 * i, 2) for i in range(1, 19)]
    (tid,) = enqueue(streams, [task_spec("progress", steps=steps, pause=0.15)])
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: row(tid)["progress"] >= 0.1, 10)
        with unit():  # another executor claims the row: a newer attempt
            Task.update(attempt=Task.attempt + 1, owner="host_9").where(Task.id == tid).execute()
        snapshot = row(tid)
        await await_until(lambda: daemon.statistics().lost == 1, 5)
        await trio.sleep(0.6)  # a late progress or terminal write would land now
        assert row(tid) == snapshot and daemon.statistics().running == 0
    # this run lost the task: it acked nothing (the entry is the new owner's business)
    [pending] = rclient.xpending_range(keys.queue(0), keys.group, "-", "+", 10)
    rclient.xack(keys.queue(0), keys.group, pending["message_id"])


def _claimed(tid: str, attempt: int) -> Claimed:
    row_ = {"id": tid, "doc_id": "", "retry_count": 0}
    return Claimed(Entry("s", "1-1", "{}"), {"id": tid}, "noop", row_, None, None, attempt)


@rule("finish.lost-write")
def test_a_terminal_write_fenced_by_an_old_attempt_changes_nothing(xsettings, streams, db):
    (tid,) = enqueue(streams, [task_spec("noop", status=RUNNING, attempt=2, owner="host_9")], publish=False)
    before = row(tid)
    with unit():
        assert write_outcomes([Outcome(_claimed(tid, 1), DONE, "done", 0.1)]) == [None]
    assert row(tid) == before


@rule("finish.lost-write")
def test_a_terminal_write_already_committed_under_my_attempt_counts_as_written(xsettings, streams, db):
    (tid,) = enqueue(streams, [task_spec("noop", status=FAILED, attempt=3, owner="host_1")], publish=False)
    with unit():  # e.g. the commit went through but its reply was lost, and the write is retried
        assert write_outcomes([Outcome(_claimed(tid, 3), FAILED, "failed: x", 0.1)]) == [FAILED]
    assert row(tid)["status"] == FAILED
