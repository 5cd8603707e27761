"""The runner's error classes on real failures: a deadlock, a killed connection, an unreachable
database or Redis, a Redis timeout and a handler's own ``fail_after`` are retried in place; a
bad document, bad parameters or a duplicate key fail at once. (The fleet tests retry handlers
through a real database restart.)"""

from __future__ import annotations

import threading

import peewee
import pytest
import redis
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

from db.database import make_database
from executor.runner import retryable
from ingest.errors import BadDocument, PermanentError
from tests.lifecycle import rule
from tests.procs import free_port


def _caught(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("no error")


@pytest.fixture
def two_rows(settings, db):
    db.connect(reuse_if_open=True)
    db.execute_sql("CREATE TABLE pair (id INT PRIMARY KEY, v INT)")
    db.execute_sql("INSERT INTO pair VALUES (1, 0), (2, 0)")
    db.close()
    return settings.db_url


@rule("errors.retryable")
def test_a_real_deadlock_is_retryable(two_rows):
    barrier = threading.Barrier(2, timeout=10)
    errors: list[BaseException] = []

    def lock(first: int, second: int) -> None:
        conn = make_database(two_rows, max_connections=1)
        try:
            with conn.connection_context(), conn.atomic():
                conn.execute_sql("SELECT v FROM pair WHERE id = %s FOR UPDATE", (first,))
                barrier.wait()
                conn.execute_sql("SELECT v FROM pair WHERE id = %s FOR UPDATE", (second,))
        except peewee.DatabaseError as exc:
            errors.append(exc)
        finally:
            conn.close_all()

    threads = [threading.Thread(target=lock, args=order) for order in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    [deadlock] = errors
    assert deadlock.args[0] == 1213 and retryable(deadlock)


def test_a_killed_connection_is_retryable(two_rows):
    victim, killer = make_database(two_rows, max_connections=1), make_database(two_rows, max_connections=1)
    lost: BaseException | None = None
    try:
        with victim.connection_context():
            (conn_id,) = victim.execute_sql("SELECT CONNECTION_ID()").fetchone()
            with killer.connection_context():
                killer.execute_sql(f"KILL CONNECTION {int(conn_id)}")
            lost = _caught(lambda: victim.execute_sql("SELECT 1").fetchone())
    except peewee.DatabaseError:
        pass  # giving the dead connection back may fail too
    finally:
        victim.close_all()
        killer.close_all()
    assert isinstance(lost, peewee.DatabaseError) and retryable(lost)


@rule("finish.lost-write")
def test_a_commit_that_lost_its_connection_is_retryable(two_rows):
    """peewee then tries a ROLLBACK on the dead connection, and raises InterfaceError(0, '')."""
    victim, killer = make_database(two_rows, max_connections=1), make_database(two_rows, max_connections=1)

    def write_then_lose_the_connection() -> None:
        with victim.connection_context(), victim.atomic():
            victim.execute_sql("UPDATE pair SET v = v + 1 WHERE id = 1")
            (conn_id,) = victim.execute_sql("SELECT CONNECTION_ID()").fetchone()
            with killer.connection_context():
                killer.execute_sql(f"KILL CONNECTION {int(conn_id)}")

    lost = _caught(write_then_lose_the_connection)
    victim.close_all()
    killer.close_all()
    assert isinstance(lost, peewee.InterfaceError) and retryable(lost)


def test_an_unreachable_database_or_redis_is_retryable():
    down = make_database(f"mysql://root@127.0.0.1:{free_port()}/nothing", max_connections=1)
    assert retryable(_caught(down.connect))
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    assert retryable(_caught(client.ping))
    client.close()


def test_a_redis_timeout_and_a_handlers_own_fail_after_are_retryable(settings):
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=0.1)
    assert retryable(_caught(lambda: client.blpop([f"{settings.key_prefix}:nothing"], timeout=1)))
    client.close()

    async def slow_service() -> None:
        with trio.fail_after(0.01):
            await trio.sleep(1)

    assert retryable(_caught(lambda: trio.run(slow_service)))


@rule("errors.permanent")
def test_bad_documents_bad_parameters_and_duplicate_keys_fail_at_once(two_rows):
    assert not retryable(BadDocument("not a PDF"))
    assert not retryable(PermanentError("bad parameters"))
    assert not retryable(ValueError("boom"))
    conn = make_database(two_rows, max_connections=1)
    with conn.connection_context():
        duplicate = _caught(lambda: conn.execute_sql("INSERT INTO pair VALUES (1, 1)"))
    conn.close_all()
    assert isinstance(duplicate, peewee.IntegrityError) and not retryable(duplicate)
