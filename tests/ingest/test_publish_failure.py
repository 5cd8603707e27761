"""Redis refusing after the rows are committed: a clear PublishError, and the rows stay queued
for the reconciler to publish."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import CANCELLED, QUEUED, Task
from ingest.cli import main
from ingest.errors import PublishError, RetryableError
from ingest.producer import enqueue_tasks, submit_documents
from tests.ingest.factories import cli_args, make_pdf
from tests.lifecycle import rule

CLOSED = "redis://127.0.0.1:1/0"  # nothing listens there


@rule("publish.failure-keeps-rows-queued")
def test_submit_raises_publish_error_and_the_rows_stay_queued(settings):
    s = settings.replace(pages_per_task=1)
    with pytest.raises(PublishError) as caught:
        submit_documents(s.replace(redis_url=CLOSED), [("a.pdf", make_pdf(3)), ("", b"x")], "kb1")
    exc = caught.value
    assert isinstance(exc, RetryableError)
    assert str(exc).startswith("3 task rows are queued but could not be published: ")
    assert "the reconciler re-publishes them" in str(exc)
    assert len(exc.task_ids) == 3 and exc.result.refused == [("", "has no name")]
    with unit():
        assert sorted(t.id for t in Task.select().where(Task.status == QUEUED)) == sorted(exc.task_ids)


def test_resubmit_without_redis_still_cancels_the_older_rows(settings):
    first = submit_documents(settings, [("a.txt", b"v1")], "kb1")
    with pytest.raises(PublishError, match="nor the cancel requests of 1 superseded task"):
        submit_documents(settings.replace(redis_url=CLOSED), [("a.txt", b"v2")], "kb1")
    with unit():
        assert Task.get_by_id(first.task_ids[0]).status == CANCELLED


@rule("publish.failure-keeps-rows-queued")
def test_enqueue_tasks_raises_publish_error_with_rows_queued(settings):
    with pytest.raises(PublishError, match="2 task rows are queued"):
        enqueue_tasks(settings.replace(redis_url=CLOSED), [{"task_type": "memory"}, {"task_type": "memory"}])
    with unit():
        assert Task.select().where(Task.status == QUEUED).count() == 2


def test_cli_prints_one_line_and_exits_1(settings, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("a")
    args = ["submit", str(tmp_path / "a.txt"), "--kb", "kb1", *cli_args(settings), "--redis-url", CLOSED]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("ingest: 1 task rows are queued but could not be published")
    assert "Traceback" not in err and err.count("\n") == 1
