"""A database that stops answering without refusing (a proxy that holds every byte: no reset, no
refusal, the client waits for its read timeout, 60 s by default), then answers again.

An idle executor begins its claim's transaction before its read (``Collector.read_and_claim``),
so a stall catches it in database I/O a stop cannot wake. A stop gives such a hop up after
``HOPS_STOP_WAIT_S`` (what it read stays pending, and the next start runs it); a stop during
start-up does not wait for the strike rules' read. The health check names the database; a task
submitted during a stall runs once the database answers, after a stall shorter than the read
timeout on the same connections, and after a longer one through an outage."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pymysql

from db.database import DbUrl
from db.keys import Keys
from db.models import DONE, QUEUED, RUNNING, Task
from db.streams import connect
from executor.collector import HOPS_STOP_WAIT_S
from executor.daemon import FINISH_WAIT_S
from tests.executor.support import all_in, enqueue, row, task_spec
from tests.helpers import admit, wait_until
from tests.observe import TcpProxy, wait_health
from tests.procs import ExecutorProcess, free_port


def _through(db_url: str, port: int, read_timeout_s: float) -> str:
    u = DbUrl.parse(db_url)
    return f"mysql://{u.user}@127.0.0.1:{port}/{u.name}?read_timeout={read_timeout_s:g}&connect_timeout=2"


def _stalled(xsettings, proxy: TcpProxy, read_timeout_s: float):
    return xsettings.replace(
        db_url=_through(xsettings.db_url, proxy.port, read_timeout_s), healthcheck_port=free_port()
    )


def _pending(streams, consumer: str) -> int:
    keys = streams.keys
    return sum(
        c["pending"]
        for q in keys.queues
        for c in streams.client.xinfo_consumers(q, keys.group)
        if c["name"] == consumer
    )


def _wait_running(proc: ExecutorProcess) -> None:
    """Past its start-up: reading (the heartbeat is written before the last start-up reads),
    and the tenants' limits copied into Redis (the gate admits no backlog before: a database
    stalled first would keep every entry out of the pending list)."""
    proc.wait_ready()
    assert wait_until(lambda: " ready: task types " in proc.log(), 20), proc.log()
    client = connect(proc.settings)
    try:
        assert wait_until(lambda: client.exists(Keys(proc.settings.key_prefix).limits_mirrored), 10)
    finally:
        client.close()
    time.sleep(0.5)  # the copy wakes the idle read: its next hop's BEGIN went out, it blocks again


@contextlib.contextmanager
def _through_a_proxy(
    xsettings, tmp_path, read_timeout_s: float
) -> Iterator[tuple[TcpProxy, ExecutorProcess]]:
    """An executor ``host_1`` whose database is reached through a proxy, past its start-up."""
    u = DbUrl.parse(xsettings.db_url)
    with TcpProxy(u.port, u.host) as proxy:
        settings = _stalled(xsettings, proxy, read_timeout_s)
        with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
            _wait_running(proc)
            yield proxy, proc


def _the_next_start_runs(xsettings, tmp_path, ids: list[str], timeout_s: float = 20) -> None:
    """``host_1`` again, on the database directly: it takes its own pending entries over."""
    with ExecutorProcess(xsettings, "host_1", tmp_path / "next.log") as again:
        assert wait_until(lambda: all_in(ids, DONE), timeout_s), again.log()
        assert again.stop() == 0


def test_an_idle_executor_stops_within_the_bound_while_its_database_is_stalled(xsettings, db, tmp_path):
    with _through_a_proxy(xsettings, tmp_path, read_timeout_s=60) as (proxy, proc):
        port = proc.settings.healthcheck_port
        wait_health(port, 200)
        proxy.freeze()
        wait_health(port, 503, "database")
        time.sleep(2.5)  # a whole blocking read (2 s) with the database stalled: its COMMIT waits
        began = time.monotonic()
        assert proc.stop(timeout_s=30) == 0
        took = time.monotonic() - began
        # the hop's BEGIN waits for a 60 s read timeout; the stop gives it up after HOPS_STOP_WAIT_S
        assert took < HOPS_STOP_WAIT_S + 15, (took, proc.log())
        assert "stopping without 1 read-and-claim step(s)" in proc.log()


def test_a_task_submitted_while_the_database_is_stalled_runs_once_it_answers(
    xsettings, streams, db, tmp_path
):
    with _through_a_proxy(xsettings, tmp_path, read_timeout_s=60) as (proxy, proc):
        warm = enqueue(streams, [task_spec("noop")])
        assert wait_until(lambda: all_in(warm, DONE), 10)
        proxy.freeze()
        ids = enqueue(streams, [task_spec("noop") for _ in range(3)])  # the producer's own path
        time.sleep(3)
        assert not all_in(ids, DONE)
        proxy.thaw()  # the held bytes arrive: the statements waiting on them go on
        assert wait_until(lambda: all_in(ids, DONE), 15), proc.log()
        assert proc.stop() == 0
    assert "database unreachable" not in proc.log()  # a stall shorter than the read timeout


def test_a_stall_longer_than_the_read_timeout_is_an_outage_and_loses_nothing(
    xsettings, streams, db, tmp_path
):
    with _through_a_proxy(xsettings, tmp_path, read_timeout_s=2) as (proxy, proc):
        proxy.freeze()
        ids = enqueue(streams, [task_spec("noop") for _ in range(3)])
        assert wait_until(lambda: "database unreachable" in proc.log(), 15), proc.log()
        assert not all_in(ids, DONE)
        proxy.thaw()
        assert wait_until(lambda: all_in(ids, DONE), 30), proc.log()
        assert wait_until(lambda: "database back after" in proc.log(), 10), proc.log()
        assert proc.stop() == 0


def test_a_stop_gives_up_a_claim_stuck_on_the_stalled_database_and_the_next_start_runs_it(
    xsettings, streams, db, tmp_path
):
    with _through_a_proxy(xsettings, tmp_path, read_timeout_s=60) as (proxy, proc):
        proxy.freeze()
        ids = enqueue(streams, [task_spec("noop") for _ in range(2)])
        # read into this consumer's pending list: the hop's claim now waits on the database
        # (unless the freeze caught the idle hop in the few ms between two reads, its COMMIT
        # and next BEGIN: then nothing is read and this times out; rare)
        assert wait_until(lambda: _pending(streams, "host_1") == 2, 10)
        began = time.monotonic()
        assert proc.stop(timeout_s=30) == 0
        assert time.monotonic() - began < HOPS_STOP_WAIT_S + 15
    assert "stopping without 1 read-and-claim step(s)" in proc.log()
    assert all_in(ids, QUEUED)  # the claim never committed
    _the_next_start_runs(xsettings, tmp_path, ids)


def test_a_stop_during_start_up_does_not_wait_for_the_stalled_database(xsettings, db, tmp_path):
    u = DbUrl.parse(xsettings.db_url)
    with TcpProxy(u.port, u.host) as proxy:
        proxy.freeze()
        settings = _stalled(xsettings, proxy, read_timeout_s=60)
        with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
            proc.wait_ready()  # the heartbeat is written; the strike rules' read now waits
            time.sleep(1)
            began = time.monotonic()
            assert proc.stop(timeout_s=30) == 0
            assert time.monotonic() - began < 15, proc.log()
        assert " ready: task types " not in proc.log()


def test_a_stop_with_a_task_running_is_bounded_while_the_database_is_stalled_and_loses_nothing(
    xsettings, streams, db, tmp_path
):
    with _through_a_proxy(xsettings, tmp_path, read_timeout_s=60) as (proxy, proc):
        ids = enqueue(streams, [task_spec("sleep", seconds=8)])
        assert wait_until(lambda: all_in(ids, RUNNING), 10)
        proxy.freeze()  # the run's progress, its hand-back and the next read all wait now
        time.sleep(1)
        began = time.monotonic()
        assert proc.stop(timeout_s=60) == 0
        took = time.monotonic() - began
    # the hop given up, the hand-back's write waited for FINISH_WAIT_S, then abandoned: not the
    # 60 s read timeout of each stuck thread in turn (they queue for the pool's lock)
    assert took < HOPS_STOP_WAIT_S + FINISH_WAIT_S + 15, (took, proc.log())
    _the_next_start_runs(xsettings, tmp_path, ids, timeout_s=40)


# -- a claim held up by a row lock: a statement that waits, deterministically ---------------------


def _lock_row(db_url: str, task_id: str) -> pymysql.connections.Connection:
    """A transaction of the test's own holding the task row's lock (``FOR UPDATE``): a claim
    UPDATE of that row waits for it (up to innodb_lock_wait_timeout, 50 s by default)."""
    u = DbUrl.parse(db_url)
    conn = pymysql.connect(host=u.host, port=u.port, user=u.user, password=u.password, database=u.name)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"SELECT id FROM {Task._meta.table_name} WHERE id = %s FOR UPDATE", [task_id])  # noqa: S608
    return conn


def _publish(streams, task_id: str, task_type: str) -> None:
    streams.publish_many([{"id": task_id, "doc_id": "", "task_type": task_type, "priority": 0}])


def _task_started(proc: ExecutorProcess, task_id: str) -> bool:
    return any("task start" in line and task_id in line for line in proc.log_lines())


def test_a_claim_that_comes_back_after_the_stop_gave_its_hop_up_rolls_back(xsettings, streams, db, tmp_path):
    settings = xsettings.replace(shutdown_grace_s=10)  # the process lives on after the give-up
    with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
        _wait_running(proc)
        (runs,) = enqueue(streams, [task_spec("sleep_first_attempt")])
        assert wait_until(lambda: all_in([runs], RUNNING), 10)
        (held,) = enqueue(streams, [task_spec("noop")], publish=False)
        lock = _lock_row(xsettings.db_url, held)
        _publish(streams, held, "noop")
        assert wait_until(lambda: _pending(streams, "host_1") == 2, 10)  # read; its claim waits
        proc.signal(signal.SIGTERM)
        assert wait_until(lambda: "stopping without 1 read-and-claim step(s)" in proc.log(), 15), proc.log()
        lock.rollback()  # the claim UPDATE goes on now, and its hop hands the claim to trio
        lock.close()
        assert wait_until(lambda: "a claim came back after the stop gave its hop up" in proc.log(), 10), (
            proc.log()
        )
        assert proc.stop() == 0
    assert not _task_started(proc, held)
    after = row(held)
    assert after["status"] == QUEUED and after["attempt"] == 0, after  # the claim rolled back
    _the_next_start_runs(xsettings, tmp_path, [runs, held])


def test_a_stop_gives_up_a_take_over_held_up_by_the_database_within_the_bound_not_the_grace(
    xsettings, streams, db, tmp_path
):
    (held,) = enqueue(streams, [task_spec("noop")])
    # pending under host_1, as if its previous process had died holding it
    assert admit(streams.client, streams.keys, "host_1", 1)
    lock = _lock_row(xsettings.db_url, held)
    try:
        settings = xsettings.replace(shutdown_grace_s=60)
        with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
            _wait_running(proc)
            time.sleep(1.5)  # the take-over's claim of the entry waits for the row lock
            began = time.monotonic()
            assert proc.stop(timeout_s=60) == 0
            took = time.monotonic() - began
        # neither the grace period (the entry's slot given back) nor the 50 s lock wait
        assert took < HOPS_STOP_WAIT_S + 15, (took, proc.log())
        assert "stopping without 1 read-and-claim step(s)" in proc.log()
    finally:
        lock.rollback()
        lock.close()
    # the abandoned claim UPDATE, an autocommit statement, may still win the row once the lock
    # goes: the server learns the client is gone only when it answers. Running under a dead
    # owner, then, as after a SIGKILL mid-claim: the next start takes it over all the same
    assert row(held)["status"] in (QUEUED, RUNNING)
    _the_next_start_runs(xsettings, tmp_path, [held])
