"""Executors indexing into Milvus Lite (one data directory, several processes: the owner serves
it, the others connect) and SIGKILLed mid-run, the owner among them: after the reruns the engine
holds exactly the chunk rows, none twice and none orphaned."""

from __future__ import annotations

from db.database import unit
from db.keys import Keys
from db.models import DONE, Chunk, KnowledgeBase, Task
from ingest import ids, vectors
from ingest.producer import submit_documents
from tests.helpers import wait_until
from tests.reliability.support import Fleet, count_ended, fleet_settings, running_under, stream_state
from tests.reliability.test_executor_kills_parse import _text

DOCS = 8


def test_a_killed_executor_leaves_no_duplicate_and_no_orphan_vector(settings, rclient, db, tmp_path):
    s = fleet_settings(
        settings, max_deliveries=10, max_concurrent_tasks=3, vector_store=f"milvus:///{tmp_path}/vectors.db"
    )
    keys = Keys(s.key_prefix)
    with Fleet(s, tmp_path) as fleet:
        fleet.start("host_1")  # the first to index may serve the directory: it is killed below
        fleet.start("host_2")
        result = submit_documents(s, [(f"tides-{n}.txt", _text(n)) for n in range(DOCS)], "tides")
        task_ids = result.task_ids
        victim = "host_1"
        for replacement in ("host_3", "host_4"):
            wait_until(lambda v=victim: running_under(v) >= 1, 120)
            fleet.kill(victim)
            fleet.start(replacement)
            victim = replacement
        wait_until(lambda: count_ended(task_ids) == len(task_ids), 180)
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 30)
        store = vectors.use(s)  # this process connects to whichever executor serves it now
        with unit():
            assert all(t.status == DONE for t in Task.select().where(Task.id.in_(task_ids)))
            rows = {cid for (cid,) in Chunk.select(Chunk.id).tuples()}
            kb = KnowledgeBase.get_by_id(ids.kb_id("default", "tides"))
        ref = vectors.KbRef(kb.tenant_id, kb.id, kb.embedding_dim, kb.embedding_model)
        held = store.chunk_ids(ref)
        assert len(rows) > DOCS and sorted(held) == sorted(rows)  # no orphan, none missing
        assert store.count(ref) == len(rows)  # and none twice
        vectors.close_all()
        fleet.stop()
