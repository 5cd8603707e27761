"""An outcome or a progress write the database refuses for good (not a lost connection) costs
that task, never the daemon: the outcome is written as failed with the error and acked, the
progress dropped; the other tasks of the batch are written as usual."""

from __future__ import annotations

import trio

from db.database import unit
from db.models import DONE, FAILED, TERMINAL_STATES
from executor.context import TaskContext, TaskResult
from tests.executor.support import enqueue, row, running_daemon, statuses, task_spec
from tests.helpers import await_until

HANDLERS = ",".join(
    f"{name}=tests.executor.test_unwritable_outcomes:{name}"
    for name in ("not_json", "refused_when_done", "refused_while_running")
)

# The database refuses (a data error, as for a value a column cannot take) an UPDATE that
# writes a marked line while the row is running, or another marked line with the row done.
REFUSING_TRIGGER = """
CREATE TRIGGER refuse_marked_lines BEFORE UPDATE ON task FOR EACH ROW
BEGIN
  IF (NEW.status = 'running' AND LOCATE('refuse while running', NEW.progress_msg) > 0)
     OR (NEW.status = 'done' AND LOCATE('refuse when done', NEW.progress_msg) > 0) THEN
    SIGNAL SQLSTATE '22007' SET MYSQL_ERRNO = 1366, MESSAGE_TEXT = 'Incorrect string value';
  END IF;
END
"""


async def not_json(ctx: TaskContext) -> TaskResult:
    """Succeeds with a result orjson cannot encode (a set)."""
    return TaskResult(message="tagged", extra={"tags": {"a", "b"}})


async def refused_when_done(ctx: TaskContext) -> None:
    ctx.progress(0.5, "refuse when done")


async def refused_while_running(ctx: TaskContext) -> None:
    ctx.progress(0.5, "refuse while running")
    await trio.sleep(float(ctx.message.get("seconds", 1.0)))


def _refuse_marked_lines() -> None:
    with unit() as db:
        db.execute_sql(REFUSING_TRIGGER)


async def test_an_outcome_the_database_refuses_fails_its_task_while_the_others_finish(xsettings, streams, db):
    _refuse_marked_lines()
    settings = xsettings.replace(extra_handlers=f"{xsettings.extra_handlers},{HANDLERS}")
    bad = enqueue(streams, [task_spec("not_json"), task_spec("refused_when_done")])
    good = enqueue(streams, [task_spec("chunks") for _ in range(3)])
    async with running_daemon(settings) as daemon:
        await await_until(lambda: all(s in TERMINAL_STATES for s in statuses(bad + good).values()), 15)
        later = enqueue(streams, [task_spec("noop") for _ in range(2)])  # the daemon still runs
        await await_until(lambda: all(s == DONE for s in statuses(later).values()), 15)
        await await_until(lambda: not daemon.finisher.backlog, 5)
    not_json_row, refused_row = row(bad[0]), row(bad[1])
    assert not_json_row["status"] == FAILED and not_json_row["progress"] == -1
    assert not_json_row["result"] is None
    assert "failed: could not write the outcome: TypeError" in not_json_row["progress_msg"]
    assert refused_row["status"] == FAILED and refused_row["progress"] == -1
    assert "failed: could not write the outcome: DataError" in refused_row["progress_msg"]
    assert all(row(t)["status"] == DONE and len(row(t)["chunk_ids"].split()) == 3 for t in good)


async def test_progress_the_database_refuses_is_dropped_while_the_others_are_written(xsettings, streams, db):
    _refuse_marked_lines()
    settings = xsettings.replace(
        extra_handlers=f"{xsettings.extra_handlers},{HANDLERS}", progress_interval_s=0.1
    )
    (refused,) = enqueue(streams, [task_spec("refused_while_running", seconds=1.5)])
    (fine,) = enqueue(streams, [task_spec("progress", steps=[0.25, 0.5], pause=0.6)])
    async with running_daemon(settings) as daemon:
        await await_until(lambda: row(fine)["progress"] == 0.5, 10)  # written beside the refused one
        assert row(refused)["progress"] == 0  # dropped
        await await_until(lambda: all(s == DONE for s in statuses([refused, fine]).values()), 15)
        (later,) = enqueue(streams, [task_spec("noop")])  # the daemon still runs
        await await_until(lambda: row(later)["status"] == DONE, 15)
        await await_until(lambda: not daemon.finisher.backlog, 5)
    assert "step 1 at 0.5" in row(fine)["progress_msg"]
    assert "refuse while running" in row(refused)["progress_msg"]  # written with the terminal state


async def test_hole9_a_done_run_written_as_failed_is_counted_failed_in_the_metrics(xsettings, streams, db):
    """Issue 12 hole 9: the metrics counted a run done when it ended; its outcome was then
    rewritten as failed (the database refused it) and it stayed counted as done."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = xsettings.replace(extra_handlers=f"{xsettings.extra_handlers},{HANDLERS}", metrics_port=port)
    (bad,) = enqueue(streams, [task_spec("not_json")])
    async with running_daemon(settings) as daemon:
        await await_until(lambda: row(bad)["status"] == FAILED, 15)
        counts = daemon.metrics._of("not_json").counts
    assert counts["succeeded"] == 0 and counts["failed"] == 1
