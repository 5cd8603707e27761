"""Recycling: after ``max_tasks_per_child`` tasks, or above ``max_rss_mb``, an executor stops
reading, drains and exits 0; ``entrypoint.sh`` starts a fresh one; nothing is lost."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import trio

from db.database import unit
from db.models import DONE, QUEUED, Task
from executor.recycle import Recycler
from executor.runner import Counters
from tests.executor.support import all_in, enqueue, task_spec
from tests.helpers import wait_until
from tests.procs import ROOT, ExecutorProcess, settings_env


def _done_by(consumer: str) -> int:
    with unit():
        return Task.select().where((Task.status == DONE) & (Task.owner == consumer)).count()


def test_after_max_tasks_per_child_an_executor_drains_and_exits_0(xsettings, streams, db, tmp_path):
    s = xsettings.replace(max_tasks_per_child=3, max_concurrent_tasks=1)
    ids = enqueue(streams, [task_spec("sleep", seconds=0.1) for _ in range(8)])
    with ExecutorProcess(s, "host_1", tmp_path / "a.log") as first:
        assert first.wait(30) == 0
        log = first.log()
    assert "recycling: 3 tasks run (max_tasks_per_child 3)" in log
    assert 3 <= _done_by("host_1") <= 4  # a task already read when the limit was reached runs too
    with unit():
        assert {t.status for t in Task.select().where(Task.id.in_(ids))} <= {DONE, QUEUED}
    with ExecutorProcess(s.replace(max_tasks_per_child=0), "host_2", tmp_path / "b.log") as second:
        wait_until(lambda: all_in(ids, DONE), 30)
        assert second.stop() == 0


def test_above_max_rss_mb_an_executor_drains_and_exits_0(xsettings, streams, db, tmp_path):
    with ExecutorProcess(xsettings.replace(max_rss_mb=1), "host_1", tmp_path / "a.log") as proc:
        assert proc.wait(30) == 0
        assert re.search(r"recycling: RSS \d+ MB over max_rss_mb 1", proc.log())


async def test_the_recycler_asks_for_a_stop_once_when_due():
    stops: list[int] = []
    counters = Counters()
    recycler = Recycler(5, 0, counters, lambda: stops.append(1))
    with trio.move_on_after(0.5):
        await recycler.run()
    assert stops == []
    counters.done, counters.failed = 3, 2
    with trio.fail_after(2):
        await recycler.run()
    assert stops == [1] and recycler.reason.startswith("5 tasks run")
    assert Recycler(0, 0, counters, lambda: None).enabled is False


def test_entrypoint_starts_a_fresh_executor_after_each_recycle(xsettings, streams, db, tmp_path):
    s = xsettings.replace(max_tasks_per_child=2, max_concurrent_tasks=1)
    ids = enqueue(streams, [task_spec("noop") for _ in range(6)])
    env = settings_env(
        s, INGEST_EXECUTOR_CMD=f"{sys.executable} -m executor", RESTART_BACKOFF_MIN_S="0.1", WS="1"
    )
    log_path = tmp_path / "entrypoint.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(ROOT / "entrypoint.sh"), "--host-id", "cyc"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_until(lambda: all_in(ids, DONE), 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log_path.read_text()
    # 6 tasks, 2 a process (a third read while the second ended runs too): at least 2 processes
    assert text.count("started executor cyc_0") >= 2 and "exited cleanly" in text
    assert "restarting in" not in text  # no crash backoff for a clean exit


async def test_hole7_a_recycle_lets_a_long_task_finish_instead_of_handing_it_back(xsettings, streams, db):
    """Issue 12 hole 7: a recycle used the SIGTERM grace, and hand-backs count toward the
    delivery cap, so a recycling fleet could bury a long task without it ever failing."""
    from tests.executor.support import row, running_daemon

    s = xsettings.replace(max_tasks_per_child=1, max_concurrent_tasks=2, shutdown_grace_s=0.3)
    short, long = enqueue(streams, [task_spec("sleep", seconds=0.1), task_spec("sleep", seconds=2.0)])
    async with running_daemon(s) as daemon:
        await trio.sleep(0.5)  # the short one ended: the recycle is due, the long one still runs
        assert daemon.draining and row(long)["status"] == "running"
        with trio.fail_after(10):
            while row(long)["status"] != DONE:
                await trio.sleep(0.1)
    assert row(long)["handback_count"] == 0 and row(short)["status"] == DONE
