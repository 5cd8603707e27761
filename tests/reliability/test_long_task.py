"""A task that runs several redelivery timeouts long keeps its entry (its executor renews the
lease every quarter of the timeout): the other executors' sweeps never take it, it runs once."""

from __future__ import annotations

import time

from db.database import unit
from db.keys import Keys
from db.models import Task
from tests.executor.support import enqueue, task_spec
from tests.helpers import wait_until
from tests.reliability.support import (
    Fleet,
    completions,
    count_done,
    create_completion_table,
    fleet_settings,
    stream_state,
)


def test_a_task_longer_than_the_redelivery_timeout_is_not_run_twice(settings, streams, rclient, db, tmp_path):
    began = time.monotonic()
    s = fleet_settings(settings, redelivery_timeout_s=1.0)
    keys = Keys(s.key_prefix)
    create_completion_table()
    with Fleet(s, tmp_path) as fleet:
        for name in ("host_1", "host_2"):
            fleet.start(name)
        long_ids = enqueue(streams, [task_spec("record", seconds=6.0) for _ in range(2)])
        short_ids = enqueue(streams, [task_spec("record", seconds=0.2) for _ in range(20)])
        ids = long_ids + short_ids
        wait_until(lambda: count_done(ids) == len(ids), 60)
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 30)
        runs = completions()
        sweeps = fleet.log_count("reclaimed")
        lost = fleet.log_count("lease lost")
        codes = fleet.stop()
    with unit():
        attempts = {t.id: t.attempt for t in Task.select().where(Task.id.in_(long_ids))}
    counts = {
        "long_task_runs": [len(runs[t]) for t in long_ids],
        "long_task_attempts": [attempts[t] for t in long_ids],
        "reclaims": sweeps,
        "leases_lost": lost,
        "seconds": round(time.monotonic() - began, 1),
    }
    print(f"\nlong task: counts {counts}")
    assert counts["long_task_runs"] == [1, 1] and counts["long_task_attempts"] == [1, 1]
    assert sweeps == 0 and lost == 0
    assert codes == {"host_1": 0, "host_2": 0}
