"""Redis up but refusing every write: full under ``noeviction`` (OOM), or a replica now behind a
plain URL (READONLY). An executor treats either as an outage: it never exits (at start-up or
mid-run), backs off with one line that says what Redis said, answers its health check 503 with
that reason, keeps its tasks running, and resumes once Redis takes writes again (following the
failover the URL leads to); every task ends done exactly once."""

from __future__ import annotations

import re
import time

import redis

from db.keys import Keys
from db.streams import Streams, connect
from tests.helpers import wait_until
from tests.observe import TcpProxy, wait_health
from tests.procs import PrivateRedis, free_port
from tests.redis_servers import plain_redis, require
from tests.reliability.support import (
    Fleet,
    count_ended,
    create_completion_table,
    enqueue_recorded,
    exactly_once,
    fleet_settings,
    running_under,
    stream_state,
)

FULL = "redis refuses writes: Redis is full (maxmemory)"
REPLICA = "redis refuses writes: Redis is a replica"
BACK = re.compile(r"redis back after \d+ failed call\(s\) in [\d.]+ s \(it accepts writes again\)")


def _count(lines: list[str], needle: str | re.Pattern[str]) -> int:
    if isinstance(needle, str):
        return sum(needle in line for line in lines)
    return sum(bool(needle.search(line)) for line in lines)


def test_an_executor_started_while_redis_is_full_waits_for_it_instead_of_exiting(settings, db, tmp_path):
    (tmp_path / "redis").mkdir()
    with PrivateRedis(tmp_path / "redis") as server:
        s = fleet_settings(settings, redis_url=server.url)
        keys = Keys(s.key_prefix)
        client = connect(server.url)
        streams = Streams(client, keys)
        streams.ensure_group()
        create_completion_table()
        with Fleet(s, tmp_path) as fleet:
            client.config_set("maxmemory", "1")
            try:
                proc = fleet.start("host_1", wait=False)
                wait_until(lambda: proc.proc.poll() is not None or FULL in proc.log(), 60)
                time.sleep(1.0)  # backing off, not exiting (entrypoint.sh would start it again and again)
                fleet.assert_alive()
            finally:
                client.config_set("maxmemory", "0")
            proc.wait_ready(30)
            ids = enqueue_recorded(streams, 4, docs=2)
            wait_until(lambda: count_ended(ids) == len(ids), 30)
            wait_until(lambda: stream_state(client, keys)["pending"] == 0, 30)
            exactly_once(ids, crashed=set())
            codes = fleet.stop()
        client.close()
    lines = proc.log_lines()
    assert codes == {"host_1": 0}
    assert _count(lines, FULL) == 1 and _count(lines, BACK) == 1, "\n".join(lines)


def test_tasks_run_through_a_full_redis_and_end_done_once_when_it_takes_writes_again(settings, db, tmp_path):
    (tmp_path / "redis").mkdir()
    with PrivateRedis(tmp_path / "redis") as server:
        port = free_port()
        s = fleet_settings(settings, redis_url=server.url, healthcheck_port=port)
        keys = Keys(s.key_prefix)
        client = connect(server.url)
        streams = Streams(client, keys)
        streams.ensure_group()
        create_completion_table()
        with Fleet(s, tmp_path) as fleet:
            proc = fleet.start("host_1")
            ids = enqueue_recorded(streams, 16, docs=4)
            wait_until(lambda: running_under("host_1") >= 1, 30)
            client.config_set("maxmemory", "1")  # every write refused from now on
            try:
                body = wait_health(port, 503, "Redis is full")
                assert "redis: refuses writes: Redis is full (maxmemory)" in body["reasons"], body
                time.sleep(2.0)
                fleet.assert_alive()
            finally:
                client.config_set("maxmemory", "0")
            wait_health(port, 200)
            wait_until(lambda: count_ended(ids) == len(ids), 60)
            wait_until(lambda: stream_state(client, keys)["pending"] == 0, 30)
            fleet.assert_alive()
            counts = exactly_once(ids, crashed=set())
            counts.update(stream_state(client, keys))
            # the results that waited for Redis to take writes are written (one per task)
            wait_until(lambda: sum(client.exists(keys.result(t)) for t in ids) == len(ids), 10)
            codes = fleet.stop()
        client.close()
    lines = proc.log_lines()
    assert codes == {"host_1": 0}
    assert counts["stream_entries"] == 0 and counts["dead_letters"] == 0, counts
    # one line when the refusal began, saying what Redis said; one when Redis took writes again
    assert _count(lines, FULL) == 1 and _count(lines, BACK) == 1, "\n".join(lines)
    assert _count(lines, "Traceback") == 0, "\n".join(lines)
    # Redis acks while full (a script's first write, XACK, is not refused); only the events
    # wait: an acked entry is settled at once, not reported gone by the lease renewals, and
    # no hand-back or ack is sent twice
    assert _count(lines, "is gone from the stream") == 0, "\n".join(lines)
    assert _count(lines, "no longer ours") == 0, "\n".join(lines)


def test_an_executor_follows_a_failover_behind_a_plain_url(settings, db, tmp_path):
    """The URL leads (here through a proxy, as a DNS name or a virtual address would) to the
    master; FAILOVER makes it a replica and its replica the master, and the URL then leads
    there: connections answered READONLY (or whose blocked read the demotion ended) dial again."""
    require("redis-server")
    old = plain_redis(tmp_path / "a")
    new = plain_redis(tmp_path / "b", "--replicaof", "127.0.0.1", str(old.port))
    try:
        with TcpProxy(old.port) as proxy:
            url = f"redis://127.0.0.1:{proxy.port}/0"
            s = fleet_settings(settings, redis_url=url)
            keys = Keys(s.key_prefix)
            client = redis.Redis(port=old.port, decode_responses=True)
            streams = Streams(client, keys)
            streams.ensure_group()
            create_completion_table()
            wait_until(lambda: _replica_online(client), 15)
            with Fleet(s, tmp_path) as fleet:
                proc = fleet.start("host_1")
                ids = enqueue_recorded(streams, 16, docs=4)
                wait_until(lambda: running_under("host_1") >= 1, 30)
                client.execute_command("FAILOVER")  # no write lost: the replica catches up first
                wait_until(lambda: client.info("replication")["role"] == "slave", 15)
                proxy.target = ("127.0.0.1", new.port)  # where the URL leads now
                after = redis.Redis(port=new.port, decode_responses=True)
                wait_until(lambda: count_ended(ids) == len(ids), 60)
                wait_until(lambda: stream_state(after, keys)["pending"] == 0, 30)
                fleet.assert_alive()
                counts = exactly_once(ids, crashed=set())
                counts.update(stream_state(after, keys))
                codes = fleet.stop()
            client.close()
            after.close()
    finally:
        new.close()
        old.close()
    lines = proc.log_lines()
    assert codes == {"host_1": 0}
    assert counts["stream_entries"] == 0 and counts["dead_letters"] == 0, counts
    assert _count(lines, REPLICA) >= 1 and _count(lines, "Traceback") == 0, "\n".join(lines)


def _replica_online(client: redis.Redis) -> bool:
    return bool(client.info("replication").get("slave0", {}).get("state") == "online")
