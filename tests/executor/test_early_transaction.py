"""The claim's transaction is begun before the read that may block (MySQL only): a task that
arrives at an idle executor waits for neither the pool's ping nor a BEGIN. An empty transaction
holds no lock, so DDL is not held up by an idle executor; and a connection that broke while the
read blocked costs neither a task nor an outage: the batch is validated again on a fresh one."""

from __future__ import annotations

import functools

import trio

from db.database import connection, unit
from db.models import DONE, Task
from tests.executor.support import all_in, enqueue, running_daemon, statuses, task_spec
from tests.helpers import await_until


def _kill_other_connections(database_name: str) -> int:
    """KILL every connection to the test database but the one asking: the executor's early
    transaction among them (and this process's idle pooled ones, which reconnect on checkout)."""
    with connection() as db:
        ids = [
            r[0]
            for r in db.execute_sql(
                "SELECT id FROM information_schema.PROCESSLIST WHERE db = %s AND id <> CONNECTION_ID()",
                (database_name,),
            ).fetchall()
        ]
        for pid in ids:
            db.execute_sql(f"KILL {int(pid)}")
    return len(ids)


async def test_connection_killed_during_the_read_is_replaced_without_an_outage(xsettings, streams, db):
    name = xsettings.db_url.rsplit("/", 1)[1]
    async with running_daemon(xsettings, "host_1") as daemon:
        first = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: all_in(first, DONE), 10)
        ids = []
        for _ in range(3):
            await trio.sleep(0.3)  # the next read is blocked, its transaction begun
            assert await trio.to_thread.run_sync(_kill_other_connections, name) >= 1
            task = enqueue(streams, [task_spec("noop")])
            ids += task
            await await_until(functools.partial(all_in, task, DONE), 10)
        assert daemon.db_outage.outages == 0 and daemon.db_outage.failures == 0
    assert set(statuses(ids).values()) == {DONE}


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
