"""Prune finds its rows without a lock: a retry that commits between prune's read and its delete
re-queues a row prune had found finished. The row stays, and the chunks it holds stay with it,
and the prune goes on past it."""

from __future__ import annotations

import threading

import pytest

from db.database import is_mysql, unit
from db.models import FAILED, QUEUED, Chunk, Task, now_ms
from ingest import prune
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


def test_a_row_retried_meanwhile_does_not_end_the_prune_of_the_rows_after_it(settings, monkeypatch):
    """A batch that keeps a row a retry re-queued removes fewer rows than it found: that is no
    sign of the last batch (only finding fewer than a batch is), so the rows after it go too."""
    monkeypatch.setattr(prune, "BATCH", 2)
    ids = enqueue_tasks(settings, [{"task_type": "noop"} for _ in range(5)])  # rows of no document
    with unit():
        Task.update(status=FAILED, progress=-1.0, update_time=now_ms() - 40 * DAY_MS).where(
            Task.id.in_(ids)
        ).execute()
    real_delete = Task.delete
    retried: list[str] = []

    class RetryFirst:
        """The first batch's delete, once one of its rows was re-queued (as a retry commits
        between prune's read and its delete: in its transaction here, so SQLite runs it too)."""

        def where(self, condition):
            if not retried:
                (first,) = Task.select(Task.id).where(condition).limit(1).tuples()
                Task.update(status=QUEUED, progress=0.0, update_time=now_ms()).where(
                    Task.id == first[0]
                ).execute()
                retried.append(first[0])
            return real_delete().where(condition)

    monkeypatch.setattr(Task, "delete", lambda *args, **kwargs: RetryFirst())
    result = prune_tasks(settings, 30 * 86400)
    monkeypatch.undo()
    assert result.tasks_removed == 4  # the first batch removed 1 of its 2; the other 3 went after it
    with unit():
        assert [t.id for t in Task.select()] == retried
        assert Task.get_by_id(retried[0]).status == QUEUED
