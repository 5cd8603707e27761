"""A restore racing an executor's hold: the executor commits the row ``held`` and acks its entry
after; a restore in between finds the published key still naming that entry. Its publish is a
re-queue, so the hold's ack publishes the task (the reconciler need not find it, much later)."""

from __future__ import annotations

from db.database import unit
from db.models import HELD, QUEUED, Task
from db.streams import AckItem
from ingest.strikes import restore, strike
from tests.executor.support import enqueue, row, task_spec
from tests.helpers import admit


def test_a_task_restored_before_its_hold_was_acked_is_published_by_that_ack(
    xsettings, streams, rclient, keys, db
):
    rule_id = strike(xsettings, "noop").rule["id"]
    (tid,) = enqueue(streams, [task_spec("noop")])
    [(stream, eid)] = admit(rclient, keys, "host_1")  # an executor read it, and holds it:
    with unit():  # its row held under the rule (committed), its ack still to come
        Task.update(status=HELD, strike_id=rule_id).where(Task.id == tid).execute()
    released = restore(xsettings, strike_id=rule_id)
    assert released.task_ids == [tid] and row(tid)["status"] == QUEUED
    assert streams.ack("host_1", [AckItem(stream, eid, tid)]) == [True]  # the hold's ack
    assert rclient.exists(keys.published(tid))  # a live entry again, made by that ack
    [(stream, eid)] = admit(rclient, keys, "host_2")  # and read by the next executor
    fields = rclient.xrange(stream, eid, eid)[0][1]
    assert tid in fields["message"]
    assert streams.ack("host_2", [AckItem(stream, eid, tid)]) == [True]
