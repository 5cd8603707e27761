"""A Redis restart mid-run: running tasks go on, one warning for the outage, acks once it is back."""

from __future__ import annotations

import io
import logging
import signal
import time

import trio

from db.keys import Keys
from db.models import DONE, RUNNING
from db.streams import Streams, connect
from executor.logs import make_handler
from tests.executor.support import enqueue, rows, running_daemon, statuses, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule
from tests.procs import PrivateRedis


@rule("read.no-reread-after-reconnect")
async def test_running_tasks_finish_through_a_redis_kill_and_are_acked_when_it_returns(
    xsettings, db, tmp_path
):
    with PrivateRedis(tmp_path) as server:
        settings = xsettings.replace(redis_url=server.url)
        client = connect(server.url)
        keys = Keys(settings.key_prefix)
        streams = Streams(client, keys)
        streams.ensure_group()
        ids = enqueue(streams, [task_spec("sleep", seconds=1.5) for _ in range(3)])
        out = io.StringIO()
        handler = make_handler(settings, "host_1", out)
        logging.getLogger().addHandler(handler)
        try:
            async with running_daemon(settings, "host_1"):
                await await_until(lambda: list(statuses(ids).values()) == [RUNNING] * 3, 10)
                server.kill()
                await trio.sleep(1.0)
                server.start()
                await await_until(lambda: all(s == DONE for s in statuses(ids).values()), 15)
                await await_until(lambda: client.xpending(keys.queue(0), keys.group)["pending"] == 0, 15)
        finally:
            logging.getLogger().removeHandler(handler)
        assert client.xlen(keys.queue(0)) == 0
        client.close()
        runs = rows(ids)
    text = out.getvalue()
    assert text.count("redis unreachable") == 1, text
    assert text.count("redis back after") == 1, text
    # after the reconnect nothing was read again: each task was claimed once, and no entry came
    # back as a duplicate of what this executor was running
    assert [r["attempt"] for r in runs.values()] == [1, 1, 1] and "duplicate" not in text, text


async def test_stopping_the_read_loop_while_redis_hangs_does_not_block_the_trio_thread(
    xsettings, db, tmp_path
):
    with PrivateRedis(tmp_path) as server:
        settings = xsettings.replace(redis_url=server.url)
        async with running_daemon(settings, "host_1") as daemon:
            await await_until(lambda: daemon.collector.reads >= 1, 10)  # its reader blocks on XREADGROUP
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)  # Redis hangs: no reply, no refused connection
            try:
                began = time.monotonic()
                daemon.collector.stop()
                took_s = time.monotonic() - began
            finally:
                server.proc.send_signal(signal.SIGCONT)
        assert took_s < 0.5
