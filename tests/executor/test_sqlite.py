"""The executor on SQLite (``INGEST_DB_URL=sqlite:///PATH``): the same hot path, the same results."""

from __future__ import annotations

from db.database import init_database, unit
from db.keys import Keys
from db.models import DONE, FAILED, Document
from db.streams import Streams, connect
from tests.executor.support import enqueue, make_document, rows, running_daemon, task_spec
from tests.handlers import EXTRA_HANDLERS
from tests.helpers import await_until


async def test_tasks_run_and_finish_on_sqlite(sqlite_settings):
    settings = sqlite_settings.replace(extra_handlers=EXTRA_HANDLERS, shutdown_grace_s=0.3)
    init_database(settings.db_url)
    client = connect(settings.redis_url)
    keys = Keys(settings.key_prefix)
    streams = Streams(client, keys)
    kb_id, doc_id = make_document()
    ok = enqueue(streams, [task_spec("noop") for _ in range(20)])
    doc_tasks = enqueue(streams, [task_spec("chunks", doc_id=doc_id, kb_id=kb_id) for _ in range(2)])
    (bad,) = enqueue(streams, [task_spec("fail")])
    everything = ok + doc_tasks + [bad]
    async with running_daemon(settings):
        await await_until(lambda: all(r["status"] in (DONE, FAILED) for r in rows(everything).values()), 15)
        await await_until(lambda: client.xpending(keys.queue(0), keys.group)["pending"] == 0, 5)
    states = {t: r["status"] for t, r in rows(everything).items()}
    assert [states[t] for t in ok + doc_tasks] == [DONE] * 22 and states[bad] == FAILED
    with unit():
        doc = Document.get_by_id(doc_id)
    assert (doc.run, doc.chunk_num) == (DONE, 6)
    client.close()
