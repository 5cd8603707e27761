"""Prune finds its rows without a lock: a retry that commits between prune's read and its delete
re-queues a row prune had found finished. The row stays, and the chunks it holds stay with it."""

from __future__ import annotations

import threading

import pytest

from db.database import is_mysql, unit
from db.models import FAILED, QUEUED, Chunk, Task, now_ms
from ingest.control import retry
from ingest.producer import enqueue_tasks
from ingest.prune import prune_tasks

DAY_MS = 86_400_000


def test_a_row_retried_between_prunes_read_and_its_delete_keeps_its_row_and_chunks(settings, monkeypatch):
    (tid,) = enqueue_tasks(settings, [{"task_type": "noop"}])  # a row of no document: prunable
    if not is_mysql():
        pytest.skip("SQLite serialises prune's transaction and the retry's (BEGIN IMMEDIATE)")
    with unit():
        Chunk.insert_many(
            [
                {"id": f"{tid[:24]}{i:08d}", "kb_id": "", "doc_id": "", "task_id": tid, "generation": 1}
                | {"position": i, "content": f"chunk {i}", "token_num": 2}
                for i in range(3)
            ]
        ).execute()
        Task.update(status=FAILED, progress=-1.0, generation=1, update_time=now_ms() - 40 * DAY_MS).where(
            Task.id == tid
        ).execute()
    real_delete = Task.delete
    retried = []

    def delete_after_a_retry(*args, **kwargs):
        if not retried:  # another process's retry commits now (its own connection: a thread)
            worker = threading.Thread(target=lambda: retried.append(retry(settings, tid)))
            worker.start()
            worker.join(30)
        return real_delete(*args, **kwargs)

    monkeypatch.setattr(Task, "delete", delete_after_a_retry)
    result = prune_tasks(settings, 30 * 86400)
    monkeypatch.undo()
    assert retried and retried[0].task_ids == [tid]
    with unit():
        assert Task.get_by_id(tid).status == QUEUED  # the retry's row, not deleted under it
        assert Chunk.select().where(Chunk.task_id == tid).count() == 3
    assert (result.tasks_removed, result.chunks_removed) == (0, 0)
