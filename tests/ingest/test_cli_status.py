"""`ingest status`: counts of tasks by status and type and of documents by run state; with an id,
the task row or the document with its tasks."""

from __future__ import annotations

import json
import time

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


def _one_line(out: str) -> str:
    return " ".join(out.split())


def test_status_for_a_person_prints_the_counts_the_json_gives(settings, capsys):
    s = settings.replace(pages_per_task=1)
    result = submit_documents(s, [("a.pdf", make_pdf(2)), ("b.txt", b"b")], "kb1")
    finish_task(result.documents[1].task_ids[0])
    assert main(["status", *cli_args(s)]) == 0
    out = capsys.readouterr().out
    lines = [" ".join(line.replace("│", " ").replace("┃", " ").split()) for line in out.splitlines()]
    assert "tasks (3)" in lines[0]
    assert "type queued done" in lines  # only the statuses some task has are columns
    assert "parse 2 1" in lines and "all 2 1" in lines
    text = _one_line(out)
    assert "documents: 2 (1 done, 1 queued); knowledge bases: 1" in text
    # all three published, none admitted yet
    assert f"{s.key_prefix}:queue:0 0 entries (0 pending, 3 waiting at the gate)" in text
    assert "dead letters: 0" in text and "live executors: 0" in text


def test_status_of_a_task_for_a_person_shows_its_fields_times_and_messages(settings, capsys):
    (doc,) = submit_documents(settings, [("a.txt", b"some text")], "kb1").documents
    (tid,) = doc.task_ids
    with unit():
        Task.update(progress_msg=Task.progress_msg.concat("[step] parsing\n")).where(Task.id == tid).execute()
        created = Task.get_by_id(tid).create_time
    assert main(["status", tid, *cli_args(settings)]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    assert rows["id"] == tid and rows["status"] == "queued" and rows["doc_id"] == doc.id
    assert rows["create_time"] == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created / 1000))
    assert rows["begin_at"] == "-"  # never begun
    assert "progress_msg" not in rows and "chunk_ids" not in rows  # the message goes below
    assert out.rstrip().endswith("[step] parsing")  # as written, not read as markup
