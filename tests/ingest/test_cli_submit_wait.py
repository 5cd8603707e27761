"""`ingest submit --wait` follows the documents in the database until each ends; the exit status
says whether any failed. A thread here plays the executor, finishing the tasks' rows."""

from __future__ import annotations

import json
import threading

from db.database import unit
from db.models import FAILED, QUEUED, Task
from ingest.cli import main
from ingest.producer import submit_documents
from tests.helpers import wait_until
from tests.ingest.factories import cli_args, finish_task


def _play_executor(rclient, keys, expected: int, fail: int = 0) -> threading.Thread:
    def run() -> None:
        def queued():
            with unit():
                ids = [t for (t,) in Task.select(Task.id).where(Task.status == QUEUED).tuples()]
            return ids if len(ids) == expected else None

        for n, task_id in enumerate(sorted(wait_until(queued, timeout_s=20))):
            finish_task(task_id, status=FAILED if n < fail else "done", msg="unreadable" if n < fail else "")
            rclient.publish(keys.updates, task_id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wait_exits_0_once_every_document_is_done(settings, tmp_path, rclient, keys, capsys):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name)
    thread = _play_executor(rclient, keys, expected=2)
    code = main(
        ["submit", str(tmp_path), "--kb", "kb1", "--wait", "--timeout", "30", "--json", *cli_args(settings)]
    )
    thread.join(5)
    out, err = capsys.readouterr()
    assert code == 0, err
    final = json.loads(out)["final"]
    assert sorted(row["run"] for row in final.values()) == ["done", "done"]


def test_wait_exits_1_when_a_document_failed(settings, tmp_path, rclient, keys, capsys):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name)
    thread = _play_executor(rclient, keys, expected=2, fail=1)
    code = main(["submit", str(tmp_path), "--kb", "kb1", "--wait", "--timeout", "30", *cli_args(settings)])
    thread.join(5)
    err = capsys.readouterr().err
    assert code == 1
    assert "failed: 1 task(s): 1 failed" in err


def test_wait_returns_at_once_when_every_task_was_reused(settings, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("same")
    first = submit_documents(settings, [tmp_path / "a.txt"], "kb1")
    finish_task(first.task_ids[0])
    assert (
        main(
            [
                "submit",
                str(tmp_path / "a.txt"),
                "--kb",
                "kb1",
                "--wait",
                "--timeout",
                "5",
                *cli_args(settings),
            ]
        )
        == 0
    )
    assert "1 reused" in capsys.readouterr().out


def test_wait_gives_up_after_its_timeout_with_exit_1(settings, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("nobody parses this")
    assert (
        main(
            [
                "submit",
                str(tmp_path / "a.txt"),
                "--kb",
                "kb1",
                "--wait",
                "--timeout",
                "0.5",
                *cli_args(settings),
            ]
        )
        == 1
    )
    assert "timed out after 0.5 s with 1 document(s) unfinished" in capsys.readouterr().err
