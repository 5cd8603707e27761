"""Entries with nothing to run are acked and dropped: no row, a finished row, a live duplicate."""

from __future__ import annotations

import orjson

from db.database import unit
from db.models import DONE, FAILED, RUNNING, Task
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until, waiting
from tests.lifecycle import rule


def _drained(rclient, keys):
    return waiting(rclient, keys) == 0


@rule("validate.drop-rules")
async def test_an_entry_whose_task_row_is_missing_is_acked_and_dropped(xsettings, streams, rclient, keys, db):
    streams.publish_many([{"id": "0" * 32, "task_type": "noop", "priority": 0}])
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: _drained(rclient, keys), 10)
        assert daemon.statistics().started == 0
    assert rclient.xlen(keys.dead) == 0 and not rclient.exists(keys.published("0" * 32))


@rule("validate.drop-rules")
async def test_an_entry_of_a_finished_task_is_acked_and_the_row_left_alone(
    xsettings, streams, rclient, keys, db
):
    done, failed = enqueue(
        streams,
        [task_spec("noop", status=DONE, progress=1.0), task_spec("noop", status=FAILED, progress=-1.0)],
    )
    before = {t: row(t) for t in (done, failed)}
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: _drained(rclient, keys), 10)
        assert daemon.statistics().started == 0
    assert {t: row(t) for t in (done, failed)} == before


@rule("validate.duplicates")
async def test_a_new_entry_of_a_task_running_under_a_live_executor_is_a_duplicate(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("noop", status=RUNNING, owner="host_9", attempt=4)])
    rclient.set(keys.executor("host_9"), orjson.dumps({"host": "elsewhere", "pid": 1}), ex=30)
    async with running_daemon(xsettings) as daemon:
        await await_until(lambda: _drained(rclient, keys), 10)
        assert daemon.statistics().started == 0
    after = row(tid)
    assert (after["status"], after["owner"], after["attempt"]) == (RUNNING, "host_9", 4)


@rule("validate.duplicates")
async def test_a_task_running_under_a_dead_executor_is_taken_over(xsettings, streams, rclient, keys, db):
    (tid,) = enqueue(streams, [task_spec("noop", status=RUNNING, owner="host_8", attempt=4)])
    async with running_daemon(xsettings):
        await await_until(lambda: row(tid)["status"] == DONE, 10)
    with unit():
        after = Task.get_by_id(tid)
    assert (after.owner, after.attempt) == ("host_1", 5)
