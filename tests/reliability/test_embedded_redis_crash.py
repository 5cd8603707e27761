"""The embedded Redis killed (kill -9, as the OOM killer does) under executors that run tasks,
with no other process to attach to it: the executors start it again (one server, never two),
stay up, and every task ends done."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from db.embedded import EmbeddedRedis, embedded_url
from db.keys import Keys
from db.streams import Streams, connect
from tests.db.embedded_support import own_home, servers_on
from tests.helpers import wait_until
from tests.reliability.support import (
    Fleet,
    count_done,
    count_ended,
    create_completion_table,
    enqueue_recorded,
    fleet_settings,
    stream_state,
)

__all__ = ["own_home"]

TASKS = 80
NAMES = ("host_1", "host_2")


def test_executors_start_a_killed_embedded_redis_again_and_finish_every_task(
    settings, db, tmp_path, own_home
):
    s = fleet_settings(settings, redis_url=embedded_url(own_home), home=own_home)
    assert s.embedded
    server = EmbeddedRedis(own_home)
    server.attach()  # this process holds it too, but never starts it again: only the executors do
    try:
        keys = Keys(s.key_prefix)
        client = connect(s)
        streams = Streams(client, keys)
        streams.ensure_group()
        create_completion_table()
        with Fleet(s, tmp_path) as fleet:
            for name in NAMES:
                fleet.start(name)
            ids = enqueue_recorded(streams, TASKS)
            wait_until(lambda: count_done(ids) >= 20, 60)
            (first,) = servers_on(own_home)
            assert int(Path(own_home, "redis.pid").read_text()) == first  # what an operator would kill
            os.kill(first, signal.SIGKILL)
            wait_until(lambda: server.answers(), 15)
            wait_until(lambda: count_ended(ids) == TASKS, 120)
            assert count_done(ids) == TASKS
            wait_until(lambda: stream_state(client, keys)["pending"] == 0, 60)
            fleet.assert_alive()
            (again,) = servers_on(own_home)  # one server on the append-only file, not two
            assert again != first
            restarted = fleet.log_count("the embedded Redis did not answer: started it again")
            codes = fleet.stop()
        client.close()
    finally:
        server.detach()
    assert restarted == 1  # by one executor; the other found it answering under the lock
    assert codes == dict.fromkeys(NAMES, 0)
    assert servers_on(own_home) == []  # the last holder stopped it
