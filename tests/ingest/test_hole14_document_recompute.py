"""Issue 12 hole 14: a document's recompute at a task's end neither scans nor locks the chunk table.

Before: every task end counted the document's chunks (O(chunks) per task end, O(chunks × tasks)
per document), and every finished document ran the old-generation DELETE, which scanned and
locked chunk rows even when there was nothing to delete. Measured by the server's own counters
(``Rows_read`` of the session, ``INNODB_TRX.trx_rows_locked`` of the transaction), not timings.
"""

from __future__ import annotations

import peewee
import pytest

from db.database import unit
from db.models import DONE, QUEUED, RUNNING, Chunk, Document, KnowledgeBase, Task
from executor import sql
from ingest.documents import lock_documents, recompute_documents
from tests.lifecycle import rule

DOC, OTHER = "d" * 32, "e" * 32
CHUNKS = 4000  # the document's chunks, all of one task
FILLER = 8000  # another document's chunks in the same table
TOKENS = 3  # per chunk


def _chunks(doc_id: str, task_id: str, generation: int, n: int) -> list[str]:
    ids = [f"{task_id[:8]}{generation:04x}{i:020x}" for i in range(n)]
    rows = [
        {
            "id": cid,
            "kb_id": "k" * 32,
            "doc_id": doc_id,
            "task_id": task_id,
            "generation": generation,
            "position": i,
            "content": "x",
            "token_num": TOKENS,
        }
        for i, cid in enumerate(ids)
    ]
    for start in range(0, n, 1000):
        Chunk.insert_many(rows[start : start + 1000]).execute()
    return ids


def _document(generation: int, statuses: list[str], chunks_of_first: int = CHUNKS) -> None:
    """The document at ``generation``; its first task done with ``chunks_of_first`` chunks, the
    others in ``statuses``; another document's chunks fill the table."""
    with unit():
        KnowledgeBase.insert(id="k" * 32, name="kb").execute()
        for doc_id in (DOC, OTHER):
            Document.insert(id=doc_id, kb_id="k" * 32, name=doc_id, generation=generation).execute()
        first = f"t0{generation:030x}"
        ids = _chunks(DOC, first, generation, chunks_of_first)
        Task.insert(
            id=first, doc_id=DOC, generation=generation, status=DONE, progress=1.0, chunk_ids=" ".join(ids)
        ).execute()
        for n, status in enumerate(statuses, start=1):
            Task.insert(
                id=f"t{n}{generation:030x}", doc_id=DOC, generation=generation, status=status
            ).execute()
        _chunks(OTHER, "f" * 32, generation, FILLER)


def _rows_read() -> int:
    return int(sql.execute("SHOW SESSION STATUS LIKE 'Rows_read'").fetchone()[1])


def _rows_locked() -> int:
    found = sql.execute(
        "SELECT trx_rows_locked FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = CONNECTION_ID()"
    ).fetchone()
    return int(found[0]) if found else 0


def _recompute() -> tuple[int, int]:
    """As a finisher does: lock the document, recompute it; (rows read, rows locked)."""
    with unit():
        lock_documents([DOC])
        before = _rows_read()
        recompute_documents([DOC])
        return _rows_read() - before, _rows_locked()


def _doc() -> Document:
    with unit():
        return Document.get_by_id(DOC)


def test_a_task_end_while_others_run_reads_task_rows_not_chunks(settings, db):
    _document(1, [DONE, RUNNING, QUEUED])
    read, locked = _recompute()
    doc = _doc()
    assert (doc.run, doc.chunk_num) == (RUNNING, CHUNKS)
    assert read < 50, f"{read} rows read for a document of 4 tasks"  # before: > 4000
    assert locked <= 2, f"{locked} rows locked"  # the document row (and its update)


def test_a_finished_document_with_no_older_generation_deletes_and_locks_no_chunk(settings, db):
    _document(1, [DONE, DONE])
    read, locked = _recompute()
    doc = _doc()
    assert (doc.run, doc.chunk_num, doc.token_num) == (DONE, CHUNKS, CHUNKS * TOKENS)
    assert locked <= 2, f"{locked} rows locked"  # before: thousands of chunk rows
    assert read <= CHUNKS + 50, f"{read} rows read"  # the counts, once, from the index


@pytest.mark.parametrize("old", [1, 500])
@rule("finish.one-transaction")
def test_a_finished_generation_locks_only_the_older_chunks_it_deletes(settings, db, old):
    _document(2, [DONE], chunks_of_first=10)
    with unit():
        _chunks(DOC, "o" * 32, 1, old)  # a previous generation's
    _, locked = _recompute()
    with unit():
        left = {
            (d, g): n
            for d, g, n in Chunk.select(Chunk.doc_id, Chunk.generation, peewee.fn.COUNT(Chunk.id))
            .group_by(Chunk.doc_id, Chunk.generation)
            .tuples()
        }
    assert left == {(DOC, 2): 10, (OTHER, 2): FILLER}
    assert (_doc().run, _doc().chunk_num) == (DONE, 10)
    # the rows it deletes and the document row; InnoDB counts about one more per index page
    assert locked <= old + old // 50 + 2, f"{locked} rows locked to delete {old}"  # before: 1025 for 500
