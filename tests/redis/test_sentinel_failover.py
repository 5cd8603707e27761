"""Failover without loss: a master, a replica and three Sentinels on private ports; two executors
reach Redis through ``redis+sentinel://``; the master is SIGKILLed in the middle of 500 tasks.
The fleet follows the promoted replica within a bounded time, tasks whose stream entries the
asynchronous replication lost are published again from their rows by the reconciler, and every
task ends done exactly once (its row, its completion, its chunks: none twice). The figures are
printed (``pytest -s``): the time to follow and the count re-published."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
import redis

from db.database import unit
from db.keys import Keys
from db.models import Task, now_ms
from db.streams import Streams, connect
from executor.reconciler import STAT_REPUBLISHED
from tests.executor.support import enqueue, make_document, task_spec
from tests.helpers import wait_until
from tests.redis_servers import SentinelGroup, require
from tests.reliability.support import (
    Fleet,
    count_done,
    count_ended,
    create_completion_table,
    exactly_once,
    fleet_settings,
    stream_state,
)

TASKS = 500
FIRST = 350  # enqueued before the kill; the rest while the master dies
NAMES = ("host_1", "host_2")
FOLLOW_BOUND_S = 30.0  # Sentinel's down-after (1 s) and election, then the executors' backoff


def _first_claim_after(ms: int) -> int | None:
    """The earliest claim (``begin_at``) later than ``ms``: a claim needs the new master."""
    with unit():
        row = Task.select(Task.begin_at).where(Task.begin_at > ms).order_by(Task.begin_at).first()
    return int(row.begin_at) if row else None


def test_the_fleet_follows_a_failover_and_every_task_ends_done_exactly_once(settings, db, tmp_path):
    require("redis-server")
    group = SentinelGroup(tmp_path / "sentinel", down_after_ms=1000)
    try:
        s = fleet_settings(settings, redis_url=group.url(), max_concurrent_tasks=8, reconcile_grace_s=3.0)
        keys = Keys(s.key_prefix)
        client = connect(s)
        streams = Streams(client, keys)
        streams.ensure_group()
        create_completion_table()
        rng = random.Random(18)
        doc_ids = [make_document()[1] for _ in range(25)]
        specs = [
            task_spec(
                "record",
                id=uuid.uuid4().hex,
                doc_id=doc_ids[i % 25],
                seconds=round(rng.uniform(0.05, 0.25), 3),
                chunks=2,
            )
            for i in range(TASKS)
        ]
        ids = [spec["id"] for spec in specs]
        refused: list[str] = []
        with Fleet(s, tmp_path) as fleet:
            for name in NAMES:
                fleet.start(name)
            enqueue(streams, specs[:FIRST])
            old_port = group.master_port()
            wait_until(lambda: count_done(ids) >= TASKS // 4, 90)
            # the rest keeps coming while the master dies: entries it took and had not sent to
            # the replica are lost, and a publish to no master fails after its rows were written
            feeder = threading.Thread(target=_feed, args=(streams, specs[FIRST:], refused), daemon=True)
            feeder.start()
            time.sleep(0.3)
            done_at_kill = count_done(ids)
            killed_ms = now_ms()
            group.master.kill()  # SIGKILL: whatever the replica had not received is gone
            failover_s = wait_until_changed(group, old_port, 60)
            promoted_ms = now_ms()
            feeder.join(60)
            # the first claim after the promotion: it read its entry from the new master
            first = wait_until(lambda: _first_claim_after(promoted_ms), 60)
            follow_s = (first - killed_ms) / 1000
            wait_until(lambda: count_ended(ids) == TASKS, 120)
            wait_until(lambda: stream_state(client, keys)["pending"] == 0, 60)
            fleet.assert_alive()
            counts = exactly_once(ids, crashed=set())
            counts.update(stream_state(client, keys))
            republished = int(client.hget(keys.stats, STAT_REPUBLISHED) or 0)
            codes = fleet.stop()
        client.close()
    finally:
        group.close()
    print(
        f"\nsentinel failover: master SIGKILLed with {done_at_kill}/{TASKS} done; Sentinel promoted "
        f"the replica {failover_s:.1f} s later; first claim on the new master {follow_s:.1f} s after "
        f"the kill (the first claim after the promotion); {len(refused)} task(s) whose publish failed "
        f"during the outage; {republished} task(s) re-published by the reconciler; counts {counts}"
    )
    assert codes == dict.fromkeys(NAMES, 0)
    assert follow_s <= FOLLOW_BOUND_S
    assert republished >= len(refused)  # every task whose publish failed came back from its row
    assert counts["pending"] == 0 and counts["stream_entries"] == 0 and counts["dead_letters"] == 0
    assert counts["done"] == TASKS and counts["chunk_rows"] == 2 * TASKS


def _feed(streams: Streams, specs: list[dict], refused: list[str]) -> None:
    """Enqueue ``specs`` ten at a time, every 20 ms; a batch whose publish fails (no master) is
    left to the reconciler (its rows are written first), its ids noted in ``refused``."""
    for start in range(0, len(specs), 10):
        batch = specs[start : start + 10]
        try:
            enqueue(streams, batch)
        except redis.RedisError:
            refused.extend(spec["id"] for spec in batch)
        time.sleep(0.02)


def wait_until_changed(group: SentinelGroup, old_port: int, timeout_s: float) -> float:
    """Seconds until the Sentinels name another master than ``old_port``."""
    began = time.monotonic()

    def moved() -> bool:
        try:
            return group.master_port() != old_port
        except Exception:  # noqa: BLE001 - a Sentinel busy electing may not answer yet
            return False

    wait_until(moved, timeout_s, 0.1)
    return time.monotonic() - began


def test_a_bounded_sentinel_pool_waits_for_a_connection_like_a_plain_one(settings, tmp_path):
    """The HTTP API's pool (``max_connections``, ``pool_timeout_s``) on a Sentinel URL: a caller
    past the limit waits for a connection to come back, and fails only after the timeout."""
    require("redis-server")
    group = SentinelGroup(tmp_path / "sentinel")
    try:
        s = settings.replace(redis_url=group.url())
        waiting = connect(s, max_connections=2, pool_timeout_s=5.0)
        short = connect(s, max_connections=2, pool_timeout_s=0.2)
        for client in (waiting, short):
            holders = [threading.Thread(target=client.blpop, args=(["no:such:list"], 1)) for _ in range(2)]
            for t in holders:
                t.start()
            time.sleep(0.3)  # both connections held by the blocked pops
            began = time.monotonic()
            if client is waiting:
                assert client.ping() and 0.3 < time.monotonic() - began < 3  # got one as a pop ended
            else:
                with pytest.raises(redis.exceptions.MaxConnectionsError):
                    client.ping()
                assert time.monotonic() - began >= 0.2
            for t in holders:
                t.join(5)
            client.close()
    finally:
        group.close()
