"""``redis+cluster://``: a Redis Cluster of three masters on private ports. The whole task path
runs on it with executors as real processes (``python -m executor``): a document submitted by
the producer and parsed, no-op and progress tasks, a cancel and a retry, a dead letter, a
tenant held to its cap by the fair gate, a hand-back on SIGTERM, a task taken over from an
executor killed under it (the reclaim sweep), ``ingest fleet`` and ``ingest status``. Then
every key the run made is found by SCAN on each master: all carry the prefix's one hash tag,
so all sit on one slot of one master."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from db.database import init_database
from db.keys import Keys
from db.models import CANCELLED, DONE, QUEUED, RUNNING
from db.results import Results
from db.streams import Streams, connect
from ingest.cli import main
from tests.executor.support import enqueue, rows, statuses, task_spec
from tests.helpers import wait_until
from tests.ingest.factories import cli_args
from tests.procs import ExecutorProcess
from tests.redis.conftest import settings_on
from tests.redis_servers import Cluster, require

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def cluster(tmp_path):
    require("redis-server", "redis-cli")
    c = Cluster(tmp_path / "cluster")
    yield c
    c.close()


def test_a_cluster_prefix_is_one_hash_tag(cluster, test_name):
    with settings_on(test_name, redis_url=cluster.url) as s:
        assert s.key_prefix == "{t:" + test_name + "}"
        assert s.replace(shutdown_grace_s=1.0).key_prefix == s.key_prefix  # wrapped once
        client = connect(s)
        try:
            assert isinstance(client, redis.RedisCluster)
            keys = Keys(s.key_prefix)
            names = [*keys.queues, keys.notify, keys.dead, keys.published("x"), keys.backlog(0, "acme")]
            assert len({client.keyslot(k) for k in names}) == 1
        finally:
            client.close()


def test_pipelined_publishes_go_to_the_prefix_master_and_survive_a_flushed_script_cache(cluster, test_name):
    with settings_on(test_name, redis_url=cluster.url) as s:
        client = connect(s)
        try:
            keys = Keys(s.key_prefix)
            streams = Streams(client, keys)
            first = [{"id": f"a{i}", "task_type": "noop"} for i in range(50)]
            assert all(streams.publish_many(first, chunk=20))
            assert streams.publish_many(first) == [None] * 50  # each task has its live entry already
            for n in cluster.nodes:  # as if each master restarted: its scripts are gone
                node = redis.Redis(port=n.port)
                node.script_flush()
                node.close()
            again = [{"id": f"b{i}", "task_type": "noop"} for i in range(50)]
            assert all(streams.publish_many(again, chunk=20))  # each refused call run again, once
            assert client.xlen(keys.backlog(0, "default")) == 100
            assert streams.live_entries([m["id"] for m in first + again]) == [True] * 100
        finally:
            client.close()


def test_the_task_path_runs_on_a_three_master_cluster(cluster, test_name, tmp_path, capsys):
    overrides = {
        "redis_url": cluster.url,
        "redelivery_timeout_s": 2.0,
        "heartbeat_s": 0.5,
        "heartbeat_ttl_s": 3.0,
        "tenant_max_running": 5,  # the product's default cap; one tenant gets its own below
    }
    with settings_on(test_name, **overrides) as s:
        init_database(s.db_url)
        cli = cli_args(s)

        def run(*argv: str) -> str:
            code = main([*argv, *cli])
            out, err = capsys.readouterr()
            assert code == 0, f"{argv}: {err}"
            return out

        client = connect(s)
        assert isinstance(client, redis.RedisCluster)
        keys = Keys(s.key_prefix)
        streams = Streams(client, keys)
        run("init")
        with ExecutorProcess(s, "host_1", tmp_path / "host_1.log") as host_1:
            host_1.wait_ready(60)
            # the producer: a document submitted, parsed (the real handler), its result fetched
            out = run(
                "submit",
                str(EXAMPLES / "sourdough.txt"),
                "--kb",
                "bread",
                "--wait",
                "--timeout",
                "120",
                "--json",
            )
            (parsed,) = json.loads(out)["documents"][0]["task_ids"]
            assert statuses([parsed])[parsed] == DONE, host_1.log()
            result = Results(client, keys).fetch(parsed, tenant_id=None, single_use=False, removal_delay_s=60)
            assert result and result["kind"] == "success" and result["chunk_count"] > 0
            # no-op tasks and one that reports progress
            noops = enqueue(streams, [task_spec("noop") for _ in range(30)])
            (step,) = enqueue(streams, [task_spec("progress", steps=[0.25, 0.5, 0.75], pause=0.1)])
            wait_until(lambda: set(statuses([*noops, step]).values()) == {DONE}, 60)
            assert "step 2 at 0.75" in rows([step])[step]["progress_msg"]
            # cancel, then retry (the second attempt is instant)
            (slow,) = enqueue(streams, [task_spec("sleep_first_attempt", seconds=60)])
            wait_until(lambda: statuses([slow])[slow] == RUNNING, 20)
            run("cancel", slow)
            wait_until(lambda: statuses([slow])[slow] == CANCELLED, 20)
            run("retry", slow)
            wait_until(lambda: statuses([slow])[slow] == DONE, 30)
            assert rows([slow])[slow]["attempt"] == 2
            # a dead letter: a message that is not JSON, put on the priority stream directly
            client.xadd(keys.queue(0), {"message": "not json"})
            wait_until(lambda: client.xlen(keys.dead) == 1, 20)
            assert len(json.loads(run("dead", "list", "--json"))) == 1
            # the fair gate: a tenant capped at one task at a time runs its three one by one
            run("tenant", "limits", "capped", "--max-running", "1")
            capped = enqueue(streams, [task_spec("sleep", seconds=0.5, tenant_id="capped") for _ in range(3)])
            most = _most_running_while(capped, timeout_s=30)
            assert most == 1, f"{most} of the capped tenant's tasks ran at once"
            # SIGTERM with a task running: it is handed back, its entry back in its backlog
            (held,) = enqueue(streams, [task_spec("sleep_first_attempt", seconds=60)])
            wait_until(lambda: statuses([held])[held] == RUNNING, 20)
            assert host_1.stop() == 0, host_1.log()
        assert statuses([held])[held] == QUEUED
        assert ":t:default " in (client.get(keys.published(held)) or ""), "handed back into its backlog"
        with ExecutorProcess(s, "host_2", tmp_path / "host_2.log") as host_2:
            host_2.wait_ready(60)
            wait_until(lambda: statuses([held])[held] == DONE, 30)  # the hand-back runs again
            # a crash: host_2 killed under a task, host_3 takes it over (XAUTOCLAIM) and runs it
            (crashed,) = enqueue(streams, [task_spec("sleep_first_attempt", seconds=60)])
            wait_until(lambda: statuses([crashed])[crashed] == RUNNING, 20)
            host_2.kill()
        with ExecutorProcess(s, "host_3", tmp_path / "host_3.log") as host_3:
            host_3.wait_ready(60)
            wait_until(lambda: statuses([crashed])[crashed] == DONE, 30)
            fleet = json.loads(run("fleet", "--json"))
            assert "host_3" in [b["consumer"] for b in fleet]
            status = json.loads(run("status", "--json"))
            assert "error" not in status["redis"], status["redis"]
            assert host_3.stop() == 0, host_3.log()
        client.close()
        # every key the run made: one slot, one master
        found = _keys_per_master(cluster)
        assert len(found) == 1, f"keys on several masters: { {p: len(k) for p, k in found.items()} }"
        ((port, names),) = found.items()
        must = {*keys.queues, keys.notify, keys.dead, keys.limits("capped"), keys.result(parsed)}
        assert must <= names, must - names
        assert all(k.startswith(s.key_prefix + ":") for k in names), sorted(names)
        node = redis.Redis(port=port, decode_responses=True)
        try:
            slots = {int(node.execute_command("CLUSTER", "KEYSLOT", k)) for k in names}
        finally:
            node.close()
        assert len(slots) == 1, slots
        print(
            f"\ncluster: {len(names)} keys of {s.key_prefix} on slot {slots.pop()} of the master at :{port}"
        )


def _most_running_while(task_ids: list[str], timeout_s: float) -> int:
    """The most of ``task_ids`` seen running at once, polled until all are done."""
    most = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = statuses(task_ids)
        most = max(most, sum(1 for st in states.values() if st == RUNNING))
        if set(states.values()) == {DONE}:
            return most
        time.sleep(0.02)
    raise AssertionError(f"not all done in {timeout_s} s: {statuses(task_ids)}")


def _keys_per_master(cluster: Cluster) -> dict[int, set[str]]:
    """Every key on each master (SCAN of that node alone), masters without keys left out."""
    out: dict[int, set[str]] = {}
    for n in cluster.nodes:
        node = redis.Redis(port=n.port, decode_responses=True)
        try:
            names = set(node.scan_iter(count=1000))
        finally:
            node.close()
        if names:
            out[n.port] = names
    return out
