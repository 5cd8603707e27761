"""Issue 12 hole 8: one progress line format for every writer of ``progress_msg``.

A line is ``"YYYY-MM-DD HH:MM:SS text\\n"``. The executor rewrote the whole text with no newline
after its last line, and the command line's SQL appends (cancel, retry, replay, restore) assumed
one, so their line was glued to the executor's last.
"""

from __future__ import annotations

import re

from db.database import init_database, unit
from db.models import RUNNING, Task
from executor.finisher import Outcome, write_outcomes
from executor.progress import Lines, ProgressBook, append_line, write_progress
from ingest.control import cancel_task_rows
from ingest.lines import appended, line
from tests.executor.test_fencing import _claimed


def _appended(text: str):
    return appended(Task.progress_msg, text)


LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (.*)")


def _messages(text: str) -> list[str]:
    """Each line's text; fails on a line that is not one of the format."""
    assert text.endswith("\n"), repr(text[-80:])
    out = []
    for one in text.splitlines():
        match = LINE.fullmatch(one)
        assert match, f"not a progress line: {one!r}"
        out.append(match.group(1))
    return out


def _progress_msg(tid: str) -> str:
    with unit():
        return str(Task.get_by_id(tid).progress_msg)


def test_a_command_line_after_executor_lines_is_a_line_of_its_own(settings, db):
    tid = "a" * 32
    with unit():
        Task.insert(id=tid, status=RUNNING, attempt=1, owner="host_1", progress_msg=line("queued")).execute()
    book = ProgressBook()
    book.open(tid, 1, 0.0, _progress_msg(tid))
    book.report(tid, 0.3, "parsing page 1")
    with unit():
        assert write_progress([(tid, 1, 0.3, book.text(tid))]) == {}
    with unit():
        assert cancel_task_rows([tid], "cancelled by user") == [tid]
    assert _messages(_progress_msg(tid)) == ["queued", "parsing page 1", "cancelled by user"]


def test_a_terminal_write_then_a_retry_line_stay_separate_lines(settings, db):
    tid = "b" * 32
    with unit():
        Task.insert(id=tid, status=RUNNING, attempt=1, owner="host_1", progress_msg=line("queued")).execute()
    text = append_line(_progress_msg(tid), "failed: page 2 unreadable")
    with unit():
        assert write_outcomes([Outcome(_claimed(tid, 1), "failed", text, 0.1)]) == ["failed"]
    with unit():  # the same SQL append as retry, replay and restore
        Task.update(progress_msg=_appended("re-queued by retry")).where(Task.id == tid).execute()
    assert _messages(_progress_msg(tid)) == ["queued", "failed: page 2 unreadable", "re-queued by retry"]


def test_a_row_written_without_a_final_newline_gets_one_before_the_next_line(settings, db):
    tid = "c" * 32  # a row an older executor wrote
    with unit():
        Task.insert(id=tid, progress_msg="2026-01-01 00:00:00 old line").execute()
        Task.update(progress_msg=_appended("cancelled by user")).where(Task.id == tid).execute()
    assert _messages(_progress_msg(tid)) == ["old line", "cancelled by user"]


def test_sqlite_appends_the_same_lines(sqlite_settings):
    init_database(sqlite_settings.db_url)
    with unit():
        Task.insert(id="d" * 32, progress_msg="2026-01-01 00:00:00 old line").execute()
        Task.insert(id="e" * 32, progress_msg=line("queued")).execute()
        Task.update(progress_msg=_appended("cancelled by user")).execute()
    assert _messages(_progress_msg("d" * 32)) == ["old line", "cancelled by user"]
    assert _messages(_progress_msg("e" * 32)) == ["queued", "cancelled by user"]


def test_the_executor_keeps_lines_it_reads_in_the_same_format():
    text = line("queued") + line("re-queued by retry")
    assert Lines(text).text() == text
    assert append_line(text, "claimed") == text + line("claimed")
    assert _messages(line("two\nlines  and\ttabs")) == ["two lines and tabs"]
