"""cancel: unfinished tasks of a task or document set cancelled on their rows first, then their
cancel keys set (expiring after the task timeout); the document follows."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import CANCELLED, DONE, HELD, RUNNING, Document, Task
from ingest.cli import main
from ingest.control import cancel
from ingest.errors import NotFound
from ingest.producer import submit_documents
from tests.ingest.factories import cli_args, finish_task, make_pdf
from tests.lifecycle import rule


@rule("cancel.rows-then-keys")
def test_cancel_a_document_cancels_its_unfinished_tasks_then_sets_cancel_keys(settings, rclient, keys):
    s = settings.replace(pages_per_task=1)
    (doc,) = submit_documents(s, [("a.pdf", make_pdf(4))], "kb1").documents
    t0, t1, t2, t3 = doc.task_ids
    finish_task(t0)
    with unit():
        Task.update(status=RUNNING, owner="host_0", attempt=1).where(Task.id == t1).execute()
        Task.update(status=HELD).where(Task.id == t2).execute()
    result = cancel(s, doc.id)
    assert result.target == "document" and sorted(result.task_ids) == sorted([t1, t2, t3])
    with unit():
        rows = {t.id: t for t in Task.select()}
        row = Document.get_by_id(doc.id)
    assert rows[t0].status == DONE
    for tid in (t1, t2, t3):
        assert rows[tid].status == CANCELLED and rows[tid].progress == -1.0
        assert "cancelled by request" in rows[tid].progress_msg
        assert 0 < rclient.ttl(keys.cancel(tid)) <= int(s.task_timeout_s)
    assert not rclient.exists(keys.cancel(t0))
    assert row.run == CANCELLED and row.progress == -1.0


def test_cancel_one_task_leaves_the_others(settings, rclient, keys):
    s = settings.replace(pages_per_task=1)
    (doc,) = submit_documents(s, [("a.pdf", make_pdf(2))], "kb1").documents
    result = cancel(s, doc.task_ids[1])
    assert result.target == "task" and result.task_ids == [doc.task_ids[1]]
    with unit():
        assert Task.get_by_id(doc.task_ids[0]).status == "queued"
    assert rclient.exists(keys.cancel(doc.task_ids[1])) and not rclient.exists(keys.cancel(doc.task_ids[0]))


def test_cancel_an_unknown_id_is_not_found(settings):
    with pytest.raises(NotFound):
        cancel(settings, "0" * 32)


def test_cli_cancel_exits_0_then_1_when_nothing_is_left_to_cancel(settings, capsys):
    (doc,) = submit_documents(settings, [("a.txt", b"x")], "kb1").documents
    assert main(["cancel", doc.id, *cli_args(settings)]) == 0
    assert "cancelled 1 task(s) of document" in capsys.readouterr().out
    assert main(["cancel", doc.id, *cli_args(settings)]) == 1
    assert "nothing to cancel" in capsys.readouterr().err
    assert main(["cancel", "f" * 32, *cli_args(settings)]) == 1
    assert capsys.readouterr().err == f"ingest: no task or document with id {'f' * 32!r}\n"
