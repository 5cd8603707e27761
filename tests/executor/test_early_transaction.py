"""The claim's transaction is begun before the read that may block (MySQL only): a task that
arrives at an idle executor waits for neither the pool's ping nor a BEGIN. An empty transaction
holds no lock, so DDL is not held up by an idle executor; and a connection that broke while the
read blocked costs neither a task nor an outage: the batch is validated again on a fresh one."""

from __future__ import annotations

import functools
import time

import trio
from pymysql.constants import SERVER_STATUS

from db.database import connection, database, unit
from db.models import DONE, Task
from tests.executor.support import all_in, enqueue, running_daemon, statuses, task_spec
from tests.helpers import await_until


def _in_transaction() -> set[int]:
    """Server ids of the pool's checked-out connections with a transaction open (the pool is
    this process's: the daemon runs in it)."""
    out = set()
    for held in list(database.obj._in_use.values()):
        conn = held.connection
        if conn.open and conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            out.add(conn.thread_id())
    return out


def _kill_the_early_connection() -> int:
    """KILL the connection the idle collector holds through its read: one seen checked out with
    a transaction open twice, 50 ms apart (other transactions here last a few ms)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        first = _in_transaction()
        time.sleep(0.05)
        steady = first & _in_transaction()
        if steady:
            (pid, *_) = sorted(steady)
            with connection() as db:
                db.execute_sql(f"KILL {int(pid)}")
            return pid
    raise AssertionError("no connection held in a transaction through the idle read")


async def test_connection_killed_during_the_read_is_replaced_without_an_outage(xsettings, streams, db):
    async with running_daemon(xsettings, "host_1") as daemon:
        first = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: all_in(first, DONE), 10)
        ids = []
        for _ in range(3):
            await trio.to_thread.run_sync(_kill_the_early_connection)
            task = enqueue(streams, [task_spec("noop")])
            ids += task
            await await_until(functools.partial(all_in, task, DONE), 10)
        assert daemon.db_outage.outages == 0 and daemon.db_outage.failures == 0
    assert set(statuses(ids).values()) == {DONE}


async def test_a_malformed_batch_on_a_killed_connection_is_dead_lettered_without_an_outage(
    xsettings, streams, rclient, keys, db
):
    """No statement runs for a batch of malformed messages: its empty transaction's COMMIT is
    the connection's first use, and its failing changes nothing."""
    async with running_daemon(xsettings, "host_1") as daemon:
        first = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: all_in(first, DONE), 10)
        await trio.to_thread.run_sync(_kill_the_early_connection)
        rclient.xadd(keys.queue(0), {"message": "{not json"})
        rclient.xadd(keys.notify, {"w": "1"}, maxlen=1)  # wake the blocked read, as a publish does
        await await_until(lambda: rclient.xlen(keys.dead) == 1, 10)
        assert daemon.db_outage.outages == 0 and daemon.db_outage.failures == 0
    (_, fields), *_ = rclient.xrange(keys.dead)
    assert "not JSON" in fields["reason"]


async def test_an_idle_executor_does_not_hold_up_ddl(xsettings, streams, db):
    """ALTER TABLE needs the table's metadata lock: a transaction that had read the table would
    hold it until its end. The idle executor's transaction has read nothing."""
    async with running_daemon(xsettings, "host_1"):
        ids = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: all_in(ids, DONE), 10)
        await trio.sleep(0.3)  # blocked in the next read, its transaction begun

        def alter() -> None:
            with connection() as conn:
                conn.execute_sql("SET SESSION lock_wait_timeout = 3")
                conn.execute_sql(f"ALTER TABLE {Task._meta.table_name} ADD COLUMN early_probe INT NULL")
                conn.execute_sql(f"ALTER TABLE {Task._meta.table_name} DROP COLUMN early_probe")

        with trio.fail_after(10):
            await trio.to_thread.run_sync(alter)
        more = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: all_in(more, DONE), 10)
    with unit():
        assert Task.select().where(Task.id.in_(ids + more), Task.status == DONE).count() == 2
