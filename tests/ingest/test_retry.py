"""retry: failed, dead or cancelled tasks of a current generation go back to queued (retry
count up, a line) and are published afresh, with any stale cancel request removed."""

from __future__ import annotations

from db.database import unit
from db.models import DEAD, FAILED, QUEUED, Document, Task
from ingest.cli import main
from ingest.control import cancel, retry
from ingest.producer import submit_documents
from tests.ingest.factories import ack_all, all_messages, cli_args, finish_task
from tests.lifecycle import rule


@rule("errors.permanent")
def test_cli_retry_failed_requeues_and_publishes_each_failed_or_dead_task(settings, rclient, keys, capsys):
    result = submit_documents(settings, [("a.txt", b"a"), ("b.txt", b"b"), ("c.txt", b"c")], "kb1")
    a, b, c = result.task_ids
    finish_task(a, status=FAILED, msg="bad document")
    finish_task(b, status=DEAD, msg="gave up")
    finish_task(c)
    ack_all(rclient, keys)
    assert main(["retry", "--failed", "--json", *cli_args(settings)]) == 0
    assert "re-queued" not in capsys.readouterr().out  # --json: JSON only
    with unit():
        rows = {t.id: t for t in Task.select()}
        docs = {d.id: d.run for d in Document.select()}
    for tid in (a, b):
        assert rows[tid].status == QUEUED and rows[tid].progress == 0.0 and rows[tid].retry_count == 1
        assert "re-queued by retry" in rows[tid].progress_msg
    assert rows[c].retry_count == 0
    assert sorted(m["id"] for m in all_messages(rclient, keys)) == sorted([a, b])
    assert list(docs.values()).count(QUEUED) == 2


@rule("publish.cancel-names-attempt")
def test_retry_a_cancelled_task_clears_its_cancel_request(settings, rclient, keys):
    (doc,) = submit_documents(settings, [("a.txt", b"a")], "kb1").documents
    cancel(settings, doc.id)
    assert rclient.exists(keys.cancel(doc.task_ids[0]))
    ack_all(rclient, keys)
    result = retry(settings, doc.id)
    assert result.task_ids == doc.task_ids and result.published == 1
    assert not rclient.exists(keys.cancel(doc.task_ids[0]))
    with unit():
        assert Document.get_by_id(doc.id).run == QUEUED


def test_retry_refuses_a_done_task_and_a_superseded_generation(settings, capsys):
    (old,) = submit_documents(settings, [("a.txt", b"v1")], "kb1").documents
    (new,) = submit_documents(settings, [("a.txt", b"v2")], "kb1").documents
    finish_task(new.task_ids[0])
    assert main(["retry", old.task_ids[0], *cli_args(settings)]) == 1
    assert "generation 1 but its document is at generation 2" in capsys.readouterr().err
    assert main(["retry", new.task_ids[0], *cli_args(settings)]) == 1
    assert "task is done" in capsys.readouterr().err
