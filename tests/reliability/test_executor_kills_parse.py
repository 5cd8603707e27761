"""The kill test once with real ``parse`` tasks (small text documents, kept light): an executor
SIGKILLed three times mid-parse and replaced under new names; every task done once, each
document's chunks exactly its tasks' own, none twice, nothing pending."""

from __future__ import annotations

import time

import peewee

from db.database import unit
from db.keys import Keys
from db.models import DONE, Chunk, Document, Task
from ingest.producer import submit_documents
from tests.helpers import wait_until
from tests.reliability.support import (
    Fleet,
    count_ended,
    fleet_settings,
    running_under,
    stream_state,
)

DOCS = 12


def _text(n: int) -> bytes:
    paras = [
        f"Document {n}, part {p}. "
        + " ".join(f"Tide table {n}.{p}.{i} lists high water at the harbour." for i in range(30))
        for p in range(6)
    ]
    return "\n\n".join(paras).encode()


def test_real_parse_tasks_are_done_once_though_an_executor_is_killed_three_times(
    settings, rclient, db, tmp_path
):
    began = time.monotonic()
    s = fleet_settings(settings, max_deliveries=10, max_concurrent_tasks=3)
    keys = Keys(s.key_prefix)
    with Fleet(s, tmp_path) as fleet:
        fleet.start("host_1")
        fleet.start("host_2")
        result = submit_documents(s, [(f"tides-{n}.txt", _text(n)) for n in range(DOCS)], "tides")
        ids = result.task_ids
        victim = "host_2"
        for replacement in ("host_3", "host_4", "host_5"):
            wait_until(lambda v=victim: running_under(v) >= 1, 120)
            fleet.kill(victim)
            fleet.start(replacement)
            victim = replacement
        wait_until(lambda: count_ended(ids) == len(ids), 180)
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 30)
        fleet.assert_alive()
        state = stream_state(rclient, keys)
        reclaimed = fleet.reclaimed()
        codes = fleet.stop()
    with unit():
        rows = list(Task.select().where(Task.id.in_(ids)).dicts())
        chunks = list(
            Chunk.select(Chunk.id, Chunk.task_id, Chunk.position).where(Chunk.task_id.in_(ids)).tuples()
        )
        docs = {d.id: d for d in Document.select().where(Document.id.in_([d.id for d in result.documents]))}
        per_doc = dict(
            Chunk.select(Chunk.doc_id, peewee.fn.COUNT(Chunk.id))
            .where(Chunk.doc_id.in_(list(docs)))
            .group_by(Chunk.doc_id)
            .tuples()
        )
    assert all(r["status"] == DONE for r in rows)
    by_task: dict[str, set[str]] = {}
    for cid, tid, _ in chunks:
        by_task.setdefault(tid, set()).add(cid)
    for r in rows:
        assert by_task.get(r["id"], set()) == set(r["chunk_ids"].split())
    assert len({(t, p) for _, t, p in chunks}) == len(chunks)
    assert all(d.run == DONE and d.chunk_num == per_doc[d.id] for d in docs.values())
    counts = {
        "tasks": len(rows),
        "done": sum(1 for r in rows if r["status"] == DONE),
        "chunk_rows": len(chunks),
        "max_attempt": max(r["attempt"] for r in rows),
        "reclaimed": reclaimed,
        "killed": fleet.killed,
        "seconds": round(time.monotonic() - began, 1),
        **state,
    }
    print(f"\nexecutor kills (parse): counts {counts}")
    assert codes == {"host_1": 0, "host_5": 0}
    assert state == {"pending": 0, "stream_entries": 0, "dead_letters": 0}
