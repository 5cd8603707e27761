"""Issue 17 hole 5: names and message lines that hold terminal escapes (ANSI CSI, OSC, a bare CR,
bidi overrides) reach the operator's terminal escaped, never as escapes: a document named
``\\x1b]0;pwned\\x07\\x1b[2J.txt`` cannot retitle the window or clear the screen."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import Task
from ingest.cli import main
from ingest.cli.common import safe_text
from ingest.producer import submit_documents
from tests.ingest.factories import cli_args

EVIL = "\x1b]0;pwned\x07\x1b[2J\rfake\u202eevil\x9b31m"
RAW = ("\x1b", "\x07", "\r", "\u202e", "\x9b")


def _assert_escaped(text: str) -> None:
    for ch in RAW:
        assert ch not in text, f"{ch!r} reached the terminal: {text!r}"
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in text


def test_safe_text_escapes_controls_and_keeps_the_rest():
    assert safe_text("plain [text] ünïcode\tand\nlines") == "plain [text] ünïcode\tand\nlines"
    assert safe_text(EVIL) == "\\x1b]0;pwned\\x07\\x1b[2J\\rfake\\u202eevil\\x9b31m"
    assert safe_text("a\nb", one_line=True) == "a\\nb"


def test_submit_names_a_file_with_escapes_escaped_on_stdout_and_stderr(settings, tmp_path, capsys):
    folder = tmp_path / "upload"
    folder.mkdir()
    (folder / f"{EVIL}.txt").write_text("text")
    (folder / f"{EVIL}-empty.txt").write_bytes(b"")
    assert main(["submit", str(folder), "--kb", "kb1", *cli_args(settings)]) == 1
    out, err = capsys.readouterr()
    _assert_escaped(out)
    _assert_escaped(err)
    assert "is empty" in err


def test_status_of_a_document_and_its_task_messages_are_escaped(settings, capsys):
    (doc,) = submit_documents(settings, [(f"{EVIL}.txt", b"text")], "kb1").documents
    with unit():
        Task.update(progress_msg=f"parsing {EVIL}\nsecond line").where(Task.doc_id == doc.id).execute()
    assert main(["status", doc.id, *cli_args(settings)]) == 0
    _assert_escaped(capsys.readouterr().out)
    assert main(["status", doc.task_ids[0], *cli_args(settings)]) == 0
    out = capsys.readouterr().out
    _assert_escaped(out)
    assert "second line" in out


@pytest.mark.parametrize(
    "verb", [["strike", "tenant_id", "==", EVIL], ["cancel", EVIL], ["retry", EVIL], ["rm", EVIL]]
)
def test_other_verbs_escape_what_they_print(settings, capsys, verb):
    code = main([*verb, *cli_args(settings)])
    out, err = capsys.readouterr()
    for ch in RAW:
        assert ch not in out + err
    assert code in (0, 1)
