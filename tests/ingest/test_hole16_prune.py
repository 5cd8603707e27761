"""Issue 12, hole 16: finished task rows and their progress text are cleaned up
(``ingest prune --older-than D``, ``INGEST_TASK_RETENTION_S``), and the queries over the task
table that ``ingest status``, the reconciler and prune make go through indexes (EXPLAIN)."""

from __future__ import annotations

import orjson
import peewee

from db.database import database, unit
from db.models import DEAD, DONE, FAILED, QUEUED, TERMINAL_STATES, Chunk, Task, now_ms
from ingest.cli import main
from ingest.producer import enqueue_tasks, submit_documents
from tests.ingest.factories import cli_args, finish_task

DAY_MS = 86_400_000


def test_prune_removes_superseded_and_documentless_finished_rows_and_trims_the_rest(settings, capsys):
    first = submit_documents(settings, [("a.txt", b"first")], "kb1")
    (old_task,) = first.task_ids
    finish_task(old_task, chunks=3)
    second = submit_documents(settings, [("a.txt", b"second")], "kb1")  # generation 2
    (current,) = second.task_ids
    finish_task(current, status=FAILED, msg="line two\nline three\n")  # generation 1's chunks stay
    saved, buried = enqueue_tasks(settings, [{"task_type": "noop"}, {"task_type": "noop"}])
    recent = submit_documents(settings, [("b.txt", b"b")], "kb1").task_ids[0]
    with unit():
        Task.update(status=DONE).where(Task.id == saved).execute()
        Task.update(status=DEAD, progress_msg="one\ntwo\n").where(Task.id == buried).execute()
        Task.update(update_time=now_ms() - 40 * DAY_MS).where(Task.id != recent).execute()
    assert main(["prune", "--older-than", "30d", "--json", *cli_args(settings)]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert (report["tasks_removed"], report["chunks_removed"], report["progress_trimmed"]) == (2, 3, 2)
    with unit():
        left = {t.id: t for t in Task.select()}
        assert set(left) == {current, buried, recent}
        assert left[current].progress_msg.count("\n") == 1 and "line three" in left[current].progress_msg
        assert left[buried].progress_msg == "two\n"  # a dead row stays: its dead letter names it
        assert Chunk.select().where(Chunk.task_id == old_task).count() == 0
        assert Chunk.select().count() == 0
    assert main(["prune", "--older-than", "30d", *cli_args(settings)]) == 0
    assert "removed 0 finished task row(s)" in capsys.readouterr().out


def _explain(query) -> list[dict]:
    sql, params = query.sql()
    cursor = database.obj.execute_sql("EXPLAIN " + sql, params)
    names = [c[0] for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def test_task_queries_of_status_reconciler_and_prune_use_indexes(settings):
    submit_documents(settings, [(f"d{i}.txt", b"x%d" % i) for i in range(50)], "kb1")
    cutoff = now_ms()
    with unit():
        database.obj.execute_sql("ANALYZE TABLE task")
        queries = {
            "reconciler queued page": Task.select(Task.id, Task.update_time)
            .where((Task.status == QUEUED) & (Task.update_time < cutoff))
            .order_by(Task.update_time, Task.id)
            .limit(1000),
            "status counts": Task.select(Task.task_type, Task.status, peewee.fn.COUNT(Task.id)).group_by(
                Task.task_type, Task.status
            ),
            "prune": Task.select(Task.id).where(
                Task.status.in_(TERMINAL_STATES) & (Task.update_time < cutoff)
            ),
            "document's current tasks": Task.select(Task.status).where(
                (Task.doc_id == "d") & (Task.generation == 1)
            ),
        }
        for name, query in queries.items():
            (plan,) = _explain(query)
            assert plan["type"] != "ALL" and plan["key"], (name, plan)
            assert "filesort" not in (plan.get("Extra") or ""), (name, plan)
