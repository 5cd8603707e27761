"""A row committed whose XADD was lost (no stream entry, no published key) is published again
by the reconciler once it is older than the grace period, and finishes; ``ingest status``
shows how many rows were re-published."""

from __future__ import annotations

import time

import orjson

from db.database import unit
from db.keys import Keys
from db.models import DONE, Task
from ingest.cli import main as ingest_main
from tests.executor.support import enqueue, task_spec
from tests.helpers import wait_until, waiting
from tests.reliability.support import Fleet, create_completion_table, fleet_settings


def test_a_row_whose_xadd_was_lost_is_republished_by_the_reconciler_and_finishes(
    settings, streams, rclient, db, tmp_path, capsys
):
    began = time.monotonic()
    s = fleet_settings(settings, reconcile_grace_s=1.0)
    keys = Keys(s.key_prefix)
    create_completion_table()
    lost = enqueue(streams, [task_spec("record", seconds=0.1) for _ in range(3)], publish=False)
    sent = enqueue(streams, [task_spec("record", seconds=0.1) for _ in range(3)])
    assert waiting(rclient, keys) == 3
    with Fleet(s, tmp_path) as fleet:
        fleet.start("host_1")
        fleet.start("host_2")
        wait_until(lambda: _all_done(lost + sent), 30)
        codes = fleet.stop()
        lines = fleet.log_count("reconciled: ")
    capsys.readouterr()
    assert (
        ingest_main(
            [
                "--db-url",
                s.db_url,
                "--redis-url",
                s.redis_url,
                "--key-prefix",
                s.key_prefix,
                "status",
                "--json",
            ]
        )
        == 0
    )
    status = orjson.loads(capsys.readouterr().out)
    counts = {
        "republished": status["redis"]["republished"],
        "stats": status["redis"]["stats"],
        "reconcile_log_lines": lines,
        "seconds": round(time.monotonic() - began, 1),
    }
    print(f"\nlost publish: counts {counts}")
    assert counts["republished"] == 3
    assert codes == {"host_1": 0, "host_2": 0}
    assert not rclient.exists(*[keys.published(t) for t in lost + sent])


def _all_done(ids: list[str]) -> bool:
    with unit():
        return Task.select().where(Task.id.in_(ids) & (Task.status == DONE)).count() == len(ids)
