"""The server facts shared/LIFECYCLE.md builds on ("Facts to build on"), checked on the real
servers, so an upgrade that changes one of them fails here before it breaks the design."""

from __future__ import annotations

import pymysql

from db.database import DbUrl, connection, database
from db.models import Task
from tests.executor.support import enqueue, new_id, task_spec
from tests.lifecycle import rule


def _group(rclient, *streams):
    for stream in streams:
        rclient.xgroup_create(stream, "g", id="0", mkstream=True)


def _deliveries(rclient, stream, consumer=None):
    entries = rclient.xpending_range(stream, "g", "-", "+", 100, consumername=consumer)
    return {e["message_id"]: e["times_delivered"] for e in entries}


@rule("fact.xreadgroup-count-per-stream")
def test_xreadgroup_count_applies_to_each_stream_not_to_the_call(rclient, keys):
    a, b = f"{keys.prefix}:fact:a", f"{keys.prefix}:fact:b"
    _group(rclient, a, b)
    for stream in (a, b):
        for i in range(3):
            rclient.xadd(stream, {"n": i})
    got = rclient.xreadgroup("g", "c1", {a: ">", b: ">"}, count=2)
    # two from each stream: four in all from a call with COUNT 2 (why the collector reads with
    # the free slots per stream, high priority first, and stops once they are used)
    assert sorted((name, len(entries)) for name, entries in got) == [(a, 2), (b, 2)]


@rule("fact.reread-counts-a-delivery")
def test_rereading_pending_counts_a_delivery_and_justid_claims_do_not(rclient, keys):
    s = f"{keys.prefix}:fact:s"
    _group(rclient, s)
    eid = rclient.xadd(s, {"n": 1})
    rclient.xreadgroup("g", "c1", {s: ">"})
    assert _deliveries(rclient, s) == {eid: 1}
    rclient.xreadgroup("g", "c1", {s: "0"})  # re-reading one's own pending entries
    assert _deliveries(rclient, s) == {eid: 2}
    rclient.xclaim(s, "g", "c2", 0, [eid], justid=True)  # takes it from c1, who still lives
    assert _deliveries(rclient, s, "c2") == {eid: 2} and _deliveries(rclient, s, "c1") == {}
    rclient.xautoclaim(s, "g", "c3", 0, "0-0", justid=True)
    assert _deliveries(rclient, s, "c3") == {eid: 2}
    _next, claimed, *_ = rclient.xautoclaim(s, "g", "c4", 0, "0-0")
    assert [e[0] for e in claimed] == [eid]  # the entry with its fields, and no delivery count
    assert _deliveries(rclient, s, "c4") == {eid: 3}


@rule("fact.xack-any-consumer")
def test_anyone_can_ack_and_delconsumer_drops_pending_entries_for_good(rclient, keys):
    s = f"{keys.prefix}:fact:s"
    _group(rclient, s)
    first, second = rclient.xadd(s, {"n": 1}), rclient.xadd(s, {"n": 2})
    rclient.xreadgroup("g", "c1", {s: ">"})
    assert rclient.xack(s, "g", first) == 1  # XACK names no consumer: c1's entry, acked by anyone
    assert _deliveries(rclient, s) == {second: 1}
    assert rclient.xgroup_delconsumer(s, "g", "c1") == 1  # it had one pending entry ...
    assert _deliveries(rclient, s) == {}  # ... now pending for no one, never delivered again
    assert rclient.xreadgroup("g", "c2", {s: ">"}) == [] and rclient.xlen(s) == 2


@rule("fact.found-rows")
def test_a_fenced_update_that_matches_but_changes_nothing_reports_its_row(settings, streams, db):
    (tid,) = enqueue(streams, [task_spec("noop")], publish=False)
    with connection():  # the project's own connection: matched rows
        same = Task.update(status="queued").where(Task.id == tid, Task.status == "queued").execute()
        none = Task.update(status="queued").where(Task.id == new_id()).execute()
        assert database.obj.connect_params.get("client_flag", 0) & pymysql.constants.CLIENT.FOUND_ROWS
    assert (same, none) == (1, 0)
    url = DbUrl.parse(settings.db_url)
    plain = pymysql.connect(
        host=url.host, port=url.port, user=url.user, password=url.password, database=url.name
    )
    try:
        with plain.cursor() as cur:  # without the flag the server reports changed rows: 0
            assert cur.execute("UPDATE task SET status = 'queued' WHERE id = %s", (tid,)) == 0
    finally:
        plain.close()
