"""Issue 12 hole 13: progress, terminal and hand-back UPDATEs find their rows by the primary key.

Through the status index MariaDB locks the next keys of the ``running`` entries, and a claim of
a queued row whose id falls between them (its ``running`` index entry lands in a locked gap)
waited out the lock timeout. Each case holds the write's transaction open, as a flusher or a
finisher does until it commits, and claims a neighbouring queued row from another connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pymysql
import pytest

from db.config import Settings
from db.database import DbUrl, unit
from db.models import DONE, QUEUED, RUNNING, Task
from db.streams import Entry
from executor import sql
from executor.book import Claimed
from executor.claim import _CLAIM
from executor.finisher import HANDBACK, Outcome, write_outcomes
from executor.progress import write_progress

ROWS = 40  # ids 1…40 in order: odd positions running under attempt 1, even ones queued
WRITTEN = 5  # the running rows the held transaction writes


def _tasks() -> tuple[list[str], list[str]]:
    ids = [f"{i:032x}" for i in range(1, ROWS + 1)]
    running, queued = ids[0::2], ids[1::2]
    with unit():
        Task.insert_many(
            [{"id": t, "status": RUNNING, "attempt": 1, "owner": "host_1"} for t in running]
            + [{"id": t, "status": QUEUED, "attempt": 0} for t in queued]
        ).execute()
    return running, queued


def _claimed(tid: str) -> Claimed:
    return Claimed(Entry("s", "1-1", "{}"), {"id": tid}, "noop", {"id": tid, "doc_id": ""}, None, None, 1)


def _progress(running: list[str]) -> None:
    assert write_progress([(t, 1, 0.5, "half way") for t in running[:WRITTEN]]) == {}


def _done(running: list[str]) -> None:
    outcomes = [Outcome(_claimed(t), DONE, "done", 0.1) for t in running[:WRITTEN]]
    assert write_outcomes(outcomes) == [DONE] * WRITTEN


def _handback(running: list[str]) -> None:
    outcomes = [Outcome(_claimed(t), HANDBACK, "handed back", 0.1) for t in running[:WRITTEN]]
    assert write_outcomes(outcomes) == [QUEUED] * WRITTEN


def _rows_locked() -> int:
    return int(
        sql.execute(
            "SELECT trx_rows_locked FROM information_schema.INNODB_TRX"
            " WHERE trx_mysql_thread_id = CONNECTION_ID()"
        ).fetchone()[0]
    )


def _claim_beside(settings: Settings, queued_id: str) -> tuple[int, float]:
    """The executor's claim UPDATE of one queued row, on its own connection, lock wait ≤ 1 s."""
    url = DbUrl.parse(settings.db_url)
    conn = pymysql.connect(
        host=url.host, port=url.port, user=url.user, password=url.password, database=url.name
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            started = time.monotonic()
            try:
                cur.execute(
                    _CLAIM.format(p="%s", marks="%s", case="CASE id WHEN %s THEN %s END"),
                    [RUNNING, "host_2", "token", 1, 1, queued_id, QUEUED, RUNNING, queued_id, 0],
                )
                claimed = cur.rowcount
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1205, exc  # lock wait timeout
                claimed = -1
            conn.rollback()
            return claimed, time.monotonic() - started
    finally:
        conn.close()


@pytest.mark.parametrize("write", [_progress, _done, _handback], ids=["progress", "done", "handback"])
def test_a_progress_or_terminal_update_held_open_does_not_block_a_claim_of_a_neighbouring_row(
    settings, db, write: Callable[[list[str]], None]
):
    running, queued = _tasks()
    written, release = threading.Event(), threading.Event()
    locked: list[int] = []
    errors: list[BaseException] = []

    def hold_open() -> None:
        try:
            with unit():
                write(running)
                locked.append(_rows_locked())
                written.set()
                release.wait(10)
        except BaseException as exc:
            errors.append(exc)
            written.set()

    holder = threading.Thread(target=hold_open)
    holder.start()
    try:
        assert written.wait(10) and not errors
        claimed, took_s = _claim_beside(settings, queued[1])  # between running[1] and running[2]
    finally:
        release.set()
        holder.join(10)
    assert not errors
    assert (claimed, took_s < 0.5) == (1, True)  # before: -1, the lock wait timed out after 1 s
    assert locked == [WRITTEN]  # the rows written, by their primary key, nothing else (before: 15)
