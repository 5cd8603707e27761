"""SIGTERM during a run: tasks that can finish within the grace period finish; the others are
handed back (row queued, a fresh entry, no delivery counted) and finish on another executor;
the process exits 0 and nothing is lost."""

from __future__ import annotations

import signal
import time

from db.database import unit
from db.keys import Keys
from db.models import DONE, Task
from tests.executor.support import enqueue, task_spec
from tests.helpers import wait_until
from tests.reliability.support import (
    Fleet,
    count_done,
    create_completion_table,
    exactly_once,
    fleet_settings,
    running_under,
    stream_state,
)

GRACE_S = 1.5


def test_sigterm_finishes_what_fits_in_the_grace_and_hands_back_the_rest_to_another_executor(
    settings, streams, rclient, db, tmp_path
):
    # With a cap of one delivery, a hand-back that counted as a delivery would dead-letter.
    s = fleet_settings(settings, shutdown_grace_s=GRACE_S, max_deliveries=1, max_concurrent_tasks=8)
    keys = Keys(s.key_prefix)
    create_completion_table()
    with Fleet(s, tmp_path) as fleet:
        first = fleet.start("host_1")
        short = enqueue(streams, [task_spec("record", seconds=0.8) for _ in range(4)])
        long_ = enqueue(streams, [task_spec("record", first_seconds=60, seconds=0.1) for _ in range(4)])
        wait_until(lambda: running_under("host_1") == 8, 30)
        fleet.start("host_2")
        asked = time.monotonic()
        first.signal(signal.SIGTERM)
        code = first.wait(30)
        exit_s = time.monotonic() - asked
        wait_until(lambda: count_done(short + long_) == 8, 30)
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 30)
        counts = exactly_once(short + long_, crashed=set())
        state = stream_state(rclient, keys)
        fleet.procs.pop("host_1")
        codes = fleet.stop()
    with unit():
        rows = {t.id: t for t in Task.select().where(Task.id.in_(short + long_))}
    counts.update(state)
    counts.update(
        {
            "exit_s": round(exit_s, 2),
            "finished_in_grace": sum(1 for t in short if rows[t].owner == "host_1"),
            "handed_back": sum(rows[t].handback_count for t in long_),
            "finished_elsewhere": sum(1 for t in long_ if rows[t].owner == "host_2"),
        }
    )
    print(f"\nsigterm: counts {counts}")
    assert code == 0 and codes == {"host_2": 0}
    assert exit_s < GRACE_S + 5
    assert all(rows[t].status == DONE and rows[t].owner == "host_1" and rows[t].attempt == 1 for t in short)
    assert all(
        rows[t].status == DONE
        and rows[t].owner == "host_2"
        and rows[t].attempt == 2
        and rows[t].handback_count == 1
        for t in long_
    )
    assert state == {"pending": 0, "stream_entries": 0, "dead_letters": 0}
