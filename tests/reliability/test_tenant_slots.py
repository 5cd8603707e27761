"""The fair gate across real executor processes: caps hold fleet-wide under continuous sampling,
and the slots of an executor killed with SIGKILL come back by their deadline, nothing lost."""

from __future__ import annotations

import time

import peewee

from db.database import unit
from db.keys import Keys
from db.models import RUNNING, Task
from ingest.tenants import set_limits
from tests.executor.support import enqueue, make_document, task_spec
from tests.helpers import wait_until
from tests.reliability.support import (
    Fleet,
    count_ended,
    create_completion_table,
    exactly_once,
    fleet_settings,
    stream_state,
)

CAPS = {"t1": 1, "t2": 2, "t3": 3, "t4": 1}  # t5 runs under the default cap
DEFAULT_CAP = 2


def _recorded(streams, tenant: str, n: int, seconds: float, **fields: object) -> list[str]:
    _, doc = make_document()
    specs = [
        task_spec("record", doc_id=doc, tenant_id=tenant, seconds=seconds, chunks=1, **fields)
        for _ in range(n)
    ]
    return enqueue(streams, specs)


def _running_rows() -> dict[str, int]:
    with unit():
        query = (
            Task.select(Task.tenant_id, peewee.fn.COUNT(Task.id))
            .where(Task.status == RUNNING)
            .group_by(Task.tenant_id)
        )
        return {t: int(n) for t, n in query.tuples()}


def test_three_executors_and_five_tenants_never_pass_a_cap(settings, streams, rclient, db, tmp_path):
    s = fleet_settings(settings, tenant_max_running=DEFAULT_CAP, max_concurrent_tasks=4)
    keys = Keys(s.key_prefix)
    create_completion_table()
    for tenant, cap in CAPS.items():
        set_limits(s, tenant, {"max_running": cap})
    caps = {**CAPS, "t5": DEFAULT_CAP}
    with Fleet(s, tmp_path) as fleet:
        for name in ("host_1", "host_2", "host_3"):
            fleet.start(name)
        ids = [t for tenant in caps for t in _recorded(streams, tenant, 12, 0.15)]
        peaks = dict.fromkeys(caps, 0)
        samples = 0
        while count_ended(ids) < len(ids):
            now = int(rclient.time()[0]) * 1000
            rows = _running_rows()
            for tenant, cap in caps.items():
                slots = int(rclient.zcount(keys.running(tenant), now, "+inf"))
                assert rows.get(tenant, 0) <= cap, (tenant, rows)
                assert slots <= cap, (tenant, slots)
                peaks[tenant] = max(peaks[tenant], rows.get(tenant, 0))
            samples += 1
            time.sleep(0.01)
        fleet.assert_alive()
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 20)
        codes = fleet.stop()
    print(f"\ncaps {caps}, peaks {peaks}, {samples} samples")
    assert codes == {"host_1": 0, "host_2": 0, "host_3": 0}
    assert peaks == caps  # every cap was reached (12 tasks each), none passed
    exactly_once(ids, set())


def test_the_slots_of_a_killed_executor_come_back_by_their_deadline_and_nothing_is_lost(
    settings, streams, rclient, db, tmp_path
):
    s = fleet_settings(settings, tenant_max_running=3, max_concurrent_tasks=4)
    keys = Keys(s.key_prefix)
    create_completion_table()
    # three that run 30 s on their first attempt (the kill comes first), then three short ones
    ids = _recorded(streams, "victim", 3, 0.2, first_seconds=30.0) + _recorded(streams, "victim", 3, 0.2)
    with Fleet(s, tmp_path) as fleet:
        fleet.start("host_1")
        wait_until(lambda: _running_rows().get("victim", 0) == 3, 20)
        killed_at = time.monotonic()
        fleet.kill("host_1")  # three slots held, no one to ack or renew them

        def live_slots() -> int:
            now = int(rclient.time()[0]) * 1000
            return int(rclient.zcount(keys.running("victim"), now, "+inf"))

        wait_until(lambda: live_slots() == 0, 2 * s.redelivery_timeout_s + 3)
        back_s = time.monotonic() - killed_at
        assert back_s <= 2 * s.redelivery_timeout_s + 1.5, back_s
        fleet.start("host_2")  # reclaims the three (re-arming their slots), then the rest
        wait_until(lambda: count_ended(ids) == len(ids), 90)
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 20)
        codes = fleet.stop()
    print(f"\nslots back {back_s:.1f} s after the SIGKILL (redelivery timeout {s.redelivery_timeout_s} s)")
    assert codes == {"host_2": 0}
    assert rclient.zcard(keys.running("victim")) == 0
    exactly_once(ids, {"host_1"})
