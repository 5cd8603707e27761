"""SIGTERM: stop reading, let short tasks finish, hand long ones back, exit 0."""

from __future__ import annotations

import signal
import time

from db.models import DONE, QUEUED, RUNNING
from tests.executor.support import enqueue, row, statuses, task_spec
from tests.helpers import wait_until
from tests.lifecycle import rule
from tests.procs import ExecutorProcess


@rule("lease.hand-back")
def test_sigterm_finishes_short_task_and_hands_long_one_back_to_another_executor(
    xsettings, streams, db, tmp_path
):
    settings = xsettings.replace(shutdown_grace_s=2.0)
    short, long_ = enqueue(
        streams, [task_spec("sleep", seconds=1.0), task_spec("sleep_first_attempt", seconds=60)]
    )
    with ExecutorProcess(settings, "host_1", tmp_path / "a.log") as first:
        first.wait_ready()
        wait_until(lambda: statuses([short, long_]) == {short: RUNNING, long_: RUNNING}, 15)
        first.signal(signal.SIGTERM)
        assert first.wait(15) == 0
        log = first.log()
    assert row(short)["status"] == DONE and row(short)["owner"] == "host_1"
    back = row(long_)
    assert back["status"] == QUEUED and back["handback_count"] == 1 and back["owner"] == ""
    assert "draining" in log and "handed back" in log
    with ExecutorProcess(settings, "host_2", tmp_path / "b.log") as second:
        second.wait_ready()
        wait_until(lambda: row(long_)["status"] == DONE, 15)
        assert second.stop() == 0
    done = row(long_)
    assert done["owner"] == "host_2" and done["attempt"] == 2 and done["handback_count"] == 1


def test_a_second_signal_skips_the_rest_of_the_grace_period(xsettings, streams, db, tmp_path):
    (tid,) = enqueue(streams, [task_spec("hang")])
    with ExecutorProcess(xsettings.replace(shutdown_grace_s=60.0), "host_1", tmp_path / "a.log") as proc:
        proc.wait_ready()
        wait_until(lambda: row(tid)["status"] == RUNNING, 15)
        proc.signal(signal.SIGINT)
        wait_until(lambda: "draining" in proc.log(), 10)
        proc.signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert row(tid)["status"] == QUEUED and row(tid)["handback_count"] == 1


def test_sigterm_during_the_start_up_takeover_hands_the_taken_over_task_back_within_the_grace(
    xsettings, streams, rclient, keys, db, tmp_path
):
    settings = xsettings.replace(shutdown_grace_s=1.0)
    (tid,) = enqueue(streams, [task_spec("sleep_first_attempt", seconds=60)])
    # host_1's previous life read the entry and died before its claim: pending under host_1
    rclient.xreadgroup(keys.group, "host_1", {keys.queue(0): ">"}, count=10)
    with ExecutorProcess(settings, "host_1", tmp_path / "a.log") as first:
        first.wait_ready()
        wait_until(lambda: row(tid)["status"] == RUNNING, 15)  # taken over: runs alone, 60 s
        asked = time.monotonic()
        first.signal(signal.SIGTERM)
        assert first.wait(30) == 0
        exit_s = time.monotonic() - asked
        log = first.log()
    assert exit_s < settings.shutdown_grace_s + 5, log
    back = row(tid)
    assert back["status"] == QUEUED and back["handback_count"] == 1 and back["attempt"] == 1, log
    assert "handed back: row queued, entry re-published" in log
    with ExecutorProcess(settings, "host_2", tmp_path / "b.log") as second:
        second.wait_ready()
        wait_until(lambda: row(tid)["status"] == DONE, 15)
        assert second.stop() == 0
    done = row(tid)
    assert done["owner"] == "host_2" and done["attempt"] == 2 and done["handback_count"] == 1


async def test_hole16_a_teardown_that_hangs_is_abandoned_after_its_bound(xsettings, monkeypatch, db):
    """Issue 12 hole 16: the teardown's 5 s bound wrapped a thread that could not be abandoned,
    so a close hanging on an unreachable server held the exit for as long as it hung."""
    import trio

    import executor.daemon as daemon_module
    from executor.daemon import Daemon

    monkeypatch.setattr(daemon_module, "TEARDOWN_WAIT_S", 0.5, raising=False)
    monkeypatch.setattr(Daemon, "_teardown", lambda self: time.sleep(20))
    daemon = Daemon(xsettings, "host_1")
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        daemon.request_stop()
    assert trio.current_time() - began < 10
