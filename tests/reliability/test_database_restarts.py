"""The database restarted under a running fleet, once cleanly and once by SIGKILL: claims,
progress and terminal writes that fail meanwhile are retried, handlers' own database calls are
retried in place (a line per try), the executors never exit, and every task ends done once."""

from __future__ import annotations

import re
import time

import pytest

from db.database import close_database, init_database, unit
from db.keys import Keys
from db.models import Task
from db.schema import init_schema
from tests.helpers import wait_until
from tests.reliability.mariadb import PrivateMariaDB
from tests.reliability.support import (
    Fleet,
    count_done,
    count_ended,
    create_completion_table,
    enqueue_recorded,
    exactly_once,
    fleet_settings,
    stream_state,
)

TASKS = 200
NAMES = ("host_1", "host_2", "host_3")


@pytest.fixture
def mariadb():
    with PrivateMariaDB() as server:
        yield server


def test_a_fleet_runs_through_a_clean_and_a_killed_database_restart(
    settings, streams, rclient, mariadb, test_name, tmp_path
):
    began = time.monotonic()
    s = fleet_settings(settings, db_url=mariadb.url(test_name))
    keys = Keys(s.key_prefix)
    init_schema(s.db_url)
    init_database(s.db_url)
    create_completion_table()
    try:
        with Fleet(s, tmp_path) as fleet:
            for name in NAMES:
                fleet.start(name)
            ids = enqueue_recorded(streams, TASKS)
            wait_until(lambda: count_done(ids) >= 50, 60)
            mariadb.stop()
            time.sleep(1.5)
            mariadb.start()
            wait_until(lambda: count_done(ids) >= 120, 60)
            at_kill = count_done(ids)
            mariadb.kill()
            time.sleep(1.5)
            mariadb.start()
            wait_until(lambda: count_ended(ids) == TASKS, 120)
            wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 30)
            fleet.assert_alive()
            counts = exactly_once(ids, crashed=set())
            counts.update(stream_state(rclient, keys))
            lines = {n: _outage_lines(p.log_lines()) for n, p in fleet.procs.items()}
            counts["task_retries"] = fleet.log_count("task retry: try")
            counts["rows_with_retry_lines"] = _rows_with_retry_lines(ids)
            codes = fleet.stop()
    finally:
        close_database()
    counts["done_at_kill"] = at_kill
    counts["seconds"] = round(time.monotonic() - began, 1)
    print(f"\ndatabase restarts: counts {counts}, outage lines per executor (began, back) {lines}")
    assert codes == dict.fromkeys(NAMES, 0)
    assert counts["pending"] == 0 and counts["stream_entries"] == 0 and counts["dead_letters"] == 0
    assert sum(b for b, _ in lines.values()) >= 2
    assert counts["rows_with_retry_lines"] >= 1  # each try of a handler is a line on its row
    for name, (began_lines, back_lines) in lines.items():
        # At most one warning per outage (an executor that made no call during one saw none),
        # and each outage that began was seen to end, with a count.
        assert began_lines <= 2 and back_lines == began_lines, (name, lines)


def _outage_lines(lines: list[str]) -> tuple[int, int]:
    began = sum(1 for line in lines if "database unreachable" in line)
    back = sum(1 for line in lines if re.search(r"database back after \d+ failed call", line))
    return began, back


def _rows_with_retry_lines(ids: list[str]) -> int:
    with unit():
        return (
            Task.select()
            .where(Task.id.in_(ids) & Task.progress_msg.contains("failed: OperationalError"))
            .count()
        )
