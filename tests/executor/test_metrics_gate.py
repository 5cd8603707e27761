"""Metrics across the fair gate: the start latency counts the wait in a tenant's backlog (the gate
XADDs a new entry at admission, so the priority stream's entry id holds the admission time), and
the queue depth counts the work waiting in the backlogs, not only the priority streams."""

from __future__ import annotations

import time

import orjson
from prometheus_client import generate_latest

from db.database import connection
from db.gate import Gate
from db.models import DONE
from db.streams import AckItem, decode_entry
from executor.metrics import Metrics
from ingest.tenants import copy_limits, set_limits
from tests.executor.support import all_in, enqueue, running_daemon, task_spec
from tests.helpers import admit, await_until
from tests.observe import samples, scrape, total
from tests.procs import free_port

WAIT_S = 1.5


def _pairs(flat: list[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _depth(m: Metrics) -> dict[str, float]:
    text = generate_latest(m.registry).decode()
    return {
        dict(lab)["priority"]: v for (name, lab), v in samples(text).items() if name == "ingest_queue_depth"
    }


def test_an_admitted_entry_names_its_backlog_entry(streams, rclient, keys, db):
    ids = enqueue(streams, [task_spec("noop") for _ in range(2)])
    backlog = [eid for eid, _ in rclient.xrange(keys.backlog(0, "default"))]
    assert len(backlog) == 2
    time.sleep(0.01)  # admission a few milliseconds after the publish: a later entry id
    with connection():
        copy_limits(rclient, keys)  # as every executor does: the gate admits nothing without it
    got = Gate(rclient, keys).dispatch(keys.group, "host_1", 2, default_max_running=5, slot_ms=600_000)
    entries = [
        decode_entry(stream, eid, _pairs(fields)) for stream, items in got.reply for eid, fields in items
    ]
    assert [e.published for e in entries] == backlog  # in order: the backlog entry's id each
    assert all(e.entry_id != e.published and e.stream == keys.queue(0) for e in entries)
    direct = rclient.xadd(keys.queue(0), {"message": "{}"})  # outside the gate: no such field
    (stream, items), *_ = rclient.xreadgroup(keys.group, "host_1", {keys.queue(0): ">"})
    assert decode_entry(stream, direct, items[0][1]).published is None
    acks = [AckItem(e.stream, e.entry_id, task_id=t) for e, t in zip(entries, ids, strict=True)]
    assert streams.ack("host_1", [*acks, AckItem(keys.queue(0), direct)]) == [True] * 3


async def test_start_latency_runs_from_the_publish_into_the_backlog(xsettings, streams, rclient, keys, db):
    port = free_port()
    settings = xsettings.replace(metrics_port=port)
    ids = enqueue(streams, [task_spec("noop") for _ in range(2)])  # into the backlog, gated
    (direct,) = enqueue(streams, [task_spec("noop")], publish=False)
    message = {"id": direct, "doc_id": "", "task_type": "noop", "priority": 0}
    rclient.xadd(keys.queue(0), {"message": orjson.dumps(message).decode()})  # straight onto the stream
    time.sleep(WAIT_S)  # every task waits this long after its publish before an executor runs
    async with running_daemon(settings, "host_1"):
        await await_until(lambda: all_in([*ids, direct], DONE), 20)
        text = scrape(port)
    assert total(text, "ingest_task_start_latency_seconds_count") == 3
    assert total(text, "ingest_task_start_latency_seconds_bucket", le="+Inf") == 3
    assert total(text, "ingest_task_start_latency_seconds_bucket", le="1.0") == 0  # none started "at once"
    assert total(text, "ingest_task_start_latency_seconds_sum") >= 3 * WAIT_S


def test_queue_depth_counts_the_backlogs_at_the_gate(xsettings, streams, rclient, keys, db):
    set_limits(xsettings, "c", {"max_running": 0})  # paused: its work waits, parked
    enqueue(streams, [task_spec("noop", tenant_id="a") for _ in range(3)])
    enqueue(streams, [task_spec("noop", tenant_id="b", priority=1) for _ in range(2)])
    enqueue(streams, [task_spec("noop", tenant_id="c")])
    m = Metrics("host_1")
    m.stream_figures(rclient, keys)
    assert _depth(m) == {"0": 4, "1": 2}  # all of it waits in backlogs: the streams are empty
    admitted = admit(rclient, keys, "host_1", count=4)  # b's two, two of a's; c is parked
    assert len(admitted) == 4 and Gate(rclient, keys).tenant("c", 0).parked
    m.stream_figures(rclient, keys)
    assert _depth(m) == {"0": 4, "1": 2}  # admitted (pending on the streams) or waiting, still counted
    assert total(generate_latest(m.registry).decode(), "ingest_pending") == 4
    assert all(streams.ack("host_1", [AckItem(s, e) for s, e in admitted]))
