"""`ingest status`: counts of tasks by status and type and of documents by run state; with an id,
the task row or the document with its tasks."""

from __future__ import annotations

import json

from db.database import unit
from db.models import Task
from ingest.cli import main
from ingest.producer import enqueue_tasks, submit_documents
from tests.ingest.factories import cli_args, finish_task, make_pdf


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_status_json_counts_tasks_documents_and_streams(settings, capsys):
    s = settings.replace(pages_per_task=1)
    result = submit_documents(s, [("a.pdf", make_pdf(3)), ("b.txt", b"b")], "kb1")
    finish_task(result.documents[1].task_ids[0])
    enqueue_tasks(s, [{"task_type": "memory", "memory_id": "m"}])
    assert main(["status", "--json", *cli_args(s)]) == 0
    data = _json(capsys)
    assert data["tasks"]["total"] == 5
    assert data["tasks"]["by_status"]["queued"] == 4 and data["tasks"]["by_status"]["done"] == 1
    assert data["tasks"]["by_type"] == {"parse": {"queued": 3, "done": 1}, "memory": {"queued": 1}}
    assert data["documents"] == {"total": 2, "by_run": {"queued": 1, "done": 1}}
    assert data["knowledge_bases"] == 1
    streams = data["redis"]["streams"]
    assert streams[f"{s.key_prefix}:queue:0"]["length"] == 0 and data["redis"]["dead_letters"] == 0
    assert streams[f"{s.key_prefix}:queue:0"]["waiting"] == 5  # at the fair gate, none admitted yet


def test_status_of_a_document_shows_its_tasks_and_of_a_task_its_row(settings, capsys):
    s = settings.replace(pages_per_task=2)
    (doc,) = submit_documents(s, [("a.pdf", make_pdf(3))], "kb1").documents
    with unit():
        Task.update(progress=0.5, progress_msg=Task.progress_msg.concat("parsing pages\n")).where(
            Task.id == doc.task_ids[0]
        ).execute()
    assert main(["status", doc.id, "--json", *cli_args(s)]) == 0
    data = _json(capsys)
    assert (
        data["kind"] == "document"
        and data["document"]["name"] == "a.pdf"
        and data["document"]["kb_name"] == "kb1"
    )
    assert [(t["id"], t["from_page"], t["to_page"]) for t in data["tasks"]] == [
        (doc.task_ids[0], 0, 2),
        (doc.task_ids[1], 2, 3),
    ]
    assert main(["status", doc.task_ids[0], "--json", *cli_args(s)]) == 0
    task = _json(capsys)["task"]
    assert task["progress"] == 0.5 and "parsing pages" in task["progress_msg"] and task["status"] == "queued"
    assert main(["status", doc.id, *cli_args(s)]) == 0
    out = capsys.readouterr().out
    assert "a.pdf" in out and "queued" in out


def test_status_of_an_unknown_id_exits_1_with_one_line(settings, capsys):
    assert main(["status", "nope", *cli_args(settings)]) == 1
    assert capsys.readouterr().err == "ingest: no task or document with id 'nope'\n"
