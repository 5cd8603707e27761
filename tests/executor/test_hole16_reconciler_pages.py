"""Issue 12, hole 16: the reconciler looks past the oldest 1,000 queued rows, so a lost publish
behind a large healthy backlog is published again in the next pass, not once the backlog drains."""

from __future__ import annotations

from db.database import unit
from db.models import QUEUED, Task, now_ms
from executor.context import Limiters
from executor.outage import Outage
from executor.reconciler import Reconciler

HEALTHY = 2500  # queued rows that have their entry, all older than the lost one


def test_a_lost_publish_behind_a_large_healthy_backlog_is_published_in_the_next_pass(
    xsettings, streams, rclient, keys, db
):
    old = now_ms() - 600_000
    ids = [f"healthy{i:06d}" for i in range(HEALTHY)] + ["lost"]  # the lost one is the newest
    rows = [
        {"id": tid, "task_type": "noop", "status": QUEUED, "progress_msg": "", "update_time": old + i}
        for i, tid in enumerate(ids)
    ]
    with unit():
        for start in range(0, len(rows), 500):
            Task.insert_many(rows[start : start + 500]).execute()
    # the healthy ones have their live entry (a real one: a key naming no entry is dropped)
    streams.publish_many([{"id": r["id"], "task_type": "noop", "priority": 0} for r in rows[:-1]])
    reconciler = Reconciler(
        xsettings.replace(reconcile_grace_s=1.0),
        streams,
        Limiters.for_settings(xsettings),
        Outage("db"),
        Outage("redis"),
    )
    report = reconciler.reconcile(force=True)
    assert report is not None and report.republished == ["lost"]
    assert rclient.exists(keys.published("lost"))
