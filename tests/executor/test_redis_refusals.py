"""What Redis answers when it refuses writes is an outage, said in words; a programming error
(WRONGTYPE, a script's own error) is not, so it is raised, never retried for ever. Reads work
while Redis refuses writes, so only a write ends such an outage."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis

from db.streams import RETRYABLE_REDIS_ERRORS
from executor.outage import Outage, RefusalAwareProbe, refusal_of
from tests.helpers import wait_until
from tests.redis_servers import plain_redis, require


def _error(call: Callable[[], object]) -> Exception:
    try:
        call()
    except redis.RedisError as exc:
        return exc
    raise AssertionError("no error")


def test_refused_writes_are_outages_and_programming_errors_are_not(tmp_path):
    require("redis-server")
    master = plain_redis(tmp_path / "a")
    replica = plain_redis(tmp_path / "b", "--replicaof", "127.0.0.1", str(master.port))
    a = redis.Redis(port=master.port, decode_responses=True)
    b = redis.Redis(port=replica.port, decode_responses=True)
    try:
        a.set("plain", "1")
        wrongtype = _error(lambda: a.xadd("plain", {"f": "1"}))
        bad_script = _error(lambda: a.eval("return redis.call('NO_SUCH_COMMAND')", 0))
        wait_until(lambda: b.info("replication").get("master_link_status") == "up", 15)
        readonly = _error(lambda: b.eval("return redis.call('SET', KEYS[1], '1')", 1, "k"))
        a.config_set("maxmemory", "1")
        try:
            full = _error(lambda: a.eval("return redis.call('SET', KEYS[1], '1')", 1, "k"))
            assert a.get("plain") == "1"  # reads still work
        finally:
            a.config_set("maxmemory", "0")
    finally:
        a.close()
        b.close()
        replica.close()
        master.close()
    assert isinstance(full, RETRYABLE_REDIS_ERRORS) and refusal_of(full) == "Redis is full (maxmemory)"
    assert isinstance(readonly, RETRYABLE_REDIS_ERRORS) and refusal_of(readonly) == "Redis is a replica"
    for bug in (wrongtype, bad_script):
        assert not isinstance(bug, RETRYABLE_REDIS_ERRORS) and refusal_of(bug) == "", bug


def test_only_a_write_ends_a_refusal_with_one_line_each_way(caplog):
    outage = Outage("redis")
    probe = RefusalAwareProbe(outage=outage, ok=True, error="", checked_at=100.0)
    full = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    with caplog.at_level(logging.WARNING, logger="executor.outage"):
        for _ in range(3):
            assert 0 < outage.failed(full) <= outage.cap_s
            outage.ok()  # a read that worked (a GET answers on a full Redis)
        assert outage.active and outage.refused == "Redis is full (maxmemory)"
        assert probe.verdict(100.5, "redis") == (False, "redis: refuses writes: Redis is full (maxmemory)")
        outage.ok(wrote=True)
    assert not outage.active and not outage.refused and outage.outages == 1
    assert probe.verdict(100.5, "redis") == (True, "")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("redis refuses writes: Redis is full (maxmemory); backing off")
    assert lines[1].startswith("redis back after 3 failed call(s)") and "accepts writes again" in lines[1]


@pytest.mark.parametrize("first", [redis.ConnectionError("Connection refused"), None])
def test_a_refusal_after_a_lost_connection_is_said_too(caplog, first):
    outage = Outage("redis")
    with caplog.at_level(logging.WARNING, logger="executor.outage"):
        if first is not None:
            outage.failed(first)
        outage.failed(redis.exceptions.ReadOnlyError("You can't write against a read only replica."))
        outage.failed(redis.exceptions.ReadOnlyError("You can't write against a read only replica."))
    lines = [r.getMessage() for r in caplog.records]
    assert sum("redis refuses writes: Redis is a replica" in m for m in lines) == 1, lines
    assert len(lines) == (2 if first is not None else 1) and outage.outages == 1, lines
