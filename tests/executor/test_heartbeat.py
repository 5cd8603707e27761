"""The heartbeat: written before the first read, refreshed, refused to a second live holder."""

from __future__ import annotations

import os
import socket

import orjson
import pytest
import trio

from db.models import DONE
from executor.daemon import Daemon
from executor.heartbeat import NameInUse
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until, wait_until
from tests.lifecycle import rule
from tests.procs import ExecutorProcess

FIELDS = {
    "host",
    "pid",
    "consumer",
    "boot_time",
    "now",
    "running",
    "done",
    "failed",
    "pending",
    "lag",
    "rss_mb",
    "cpu_percent",
    "draining",
    "task_types",
}


@rule("read.heartbeat-first")
async def test_heartbeat_is_written_before_the_first_read_and_refreshed(
    xsettings, streams, rclient, keys, db
):
    (tid,) = enqueue(streams, [task_spec("heartbeat_probe")])  # waiting before the executor starts
    async with running_daemon(xsettings.replace(heartbeat_s=0.3), "host_1"):
        await await_until(lambda: row(tid)["status"] == DONE, 10)
        first = orjson.loads(rclient.get(keys.executor("host_1")))
        await trio.sleep(0.7)
        later = orjson.loads(rclient.get(keys.executor("host_1")))
        assert 0 < rclient.pttl(keys.executor("host_1")) <= xsettings.heartbeat_ttl_s * 1000
    probed = row(tid)["progress_msg"].splitlines()[-1]
    assert f'"pid":{os.getpid()}' in probed and '"consumer":"host_1"' in probed
    assert set(later) >= FIELDS and later["now"] > first["now"] and later["done"] == 1
    assert later["host"] == xsettings.host_id and "heartbeat_probe" in later["task_types"]
    assert not rclient.exists(keys.executor("host_1"))  # a clean exit removes it


@rule("read.heartbeat-first")
async def test_a_second_executor_under_a_live_name_refuses_to_start(xsettings, streams, rclient, keys, db):
    async with running_daemon(xsettings, "host_1"):
        with pytest.raises(NameInUse):
            await Daemon(xsettings, "host_1").run()
    rclient.set(keys.executor("host_2"), orjson.dumps({"host": "another-host", "pid": 1}), ex=30)
    with pytest.raises(NameInUse, match="another-host"):
        await Daemon(xsettings, "host_2").run()


def test_a_stale_heartbeat_left_by_a_killed_executor_is_taken_over(
    xsettings, streams, rclient, keys, db, tmp_path
):
    settings = xsettings.replace(heartbeat_ttl_s=60.0, host_id=socket.gethostname())
    with ExecutorProcess(settings, "host_1", tmp_path / "a.log") as first:
        old = first.wait_ready()
        first.kill()  # kill -9: the heartbeat stays behind for its whole TTL
    assert orjson.loads(rclient.get(keys.executor("host_1")))["pid"] == old["pid"]
    with ExecutorProcess(settings, "host_1", tmp_path / "b.log") as second:
        new = second.wait_ready()
        assert new["pid"] == second.pid != old["pid"]
        assert "taking over the stale heartbeat" in second.log()
        assert second.stop() == 0
    wait_until(lambda: not rclient.exists(keys.executor("host_1")), 5)


async def test_hole9_a_beat_never_overwrites_another_process_that_took_the_name(xsettings, rclient, keys, db):
    """Issue 12 hole 9: this process stalled past its heartbeat's TTL, another process of the
    same name took the name; the next beat used to SET over it. Now this one stops instead."""
    import orjson
    import trio

    from tests.executor.support import running_daemon

    async with running_daemon(xsettings, "host_1") as daemon:
        other = {"pid": 1, "instance": "someone-else", "host": "elsewhere"}
        rclient.set(keys.executor("host_1"), orjson.dumps(other), px=30_000)
        with trio.fail_after(xsettings.heartbeat_s * 3 + 5):
            while not daemon.draining:
                await trio.sleep(0.1)
    assert orjson.loads(rclient.get(keys.executor("host_1")))["instance"] == "someone-else"
