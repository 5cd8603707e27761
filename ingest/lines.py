"""Timestamped lines on a row's ``progress_msg``: one format for every writer, and its caps.

A line is ``"2026-01-31 12:00:00 text\\n"``: local time, a space, the text on one line
(whitespace collapsed, at most ``MAX_LINE_CHARS``), and the newline that ends it. The executor
rewrites a running task's whole text (:class:`Lines`, :func:`append_line`: the newest
``MAX_LINES`` lines within ``MAX_BYTES``); the command line appends one line in SQL
(:func:`appended`: the newest ``PROGRESS_MSG_CAP`` characters). Both write :func:`line`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import peewee

from db.database import is_mysql

MAX_LINE_CHARS = 1000  # one line's text
MAX_LINES = 60  # lines the executor keeps when it rewrites the text
MAX_BYTES = 8192  # bytes the executor keeps when it rewrites the text
PROGRESS_MSG_CAP = 16000  # characters an SQL append keeps (the newest)

_clock: tuple[int, str] = (0, "")  # the last second formatted (many lines share one)


def _now_text() -> str:
    global _clock
    second = int(time.time())
    if second != _clock[0]:
        _clock = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second)))
    return _clock[1]


def stamp(msg: str) -> str:
    """One line without its newline: local time, then the message (one line, bounded)."""
    text = " ".join(str(msg).split())
    if not text.isascii():  # a lone surrogate (text from a broken PDF, say) cannot be stored: "?"
        text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + "…"
    return f"{_now_text()} {text}"


def line(msg: str) -> str:
    """``"2026-01-31 12:00:00 msg\\n"``: one whole line of ``progress_msg``."""
    return stamp(msg) + "\n"


class Lines:
    """A text's lines, capped: the tail is kept (≤ MAX_LINES lines, ≤ MAX_BYTES bytes)."""

    def __init__(self, text: str = "") -> None:
        self._lines: deque[str] = deque()
        self._bytes = 0
        for one in text.splitlines():
            if one.strip():
                self._push(one)

    def _push(self, one: str) -> None:
        self._lines.append(one)
        self._bytes += len(one.encode()) + 1
        while self._lines and (len(self._lines) > MAX_LINES or self._bytes > MAX_BYTES):
            self._bytes -= len(self._lines.popleft().encode()) + 1

    def add(self, msg: str) -> None:
        self._push(stamp(msg))

    def text(self) -> str:
        """Every line with its newline (an SQL append then starts a line of its own)."""
        return "".join(f"{one}\n" for one in self._lines)


def append_line(text: str, msg: str) -> str:
    """``text`` with one more line, capped (in Python: the executor's rewrites)."""
    lines = Lines(text)
    lines.add(msg)
    return lines.text()


def appended(field: peewee.Field, msg: str) -> Any:
    """An expression for ``field`` with one more line and the oldest text cut off (in SQL).

    A text that does not end with a newline (written before every writer ended its lines) gets
    one first, so the new line never runs on from the last.
    """
    current = peewee.fn.COALESCE(field, "")
    last = peewee.fn.RIGHT(current, 1) if is_mysql() else peewee.fn.SUBSTR(current, -1)
    gap = peewee.Case(None, [((current == "") | (last == "\n"), "")], "\n")
    if is_mysql():
        return peewee.fn.RIGHT(peewee.fn.CONCAT(current, gap, line(msg)), PROGRESS_MSG_CAP)
    return peewee.fn.SUBSTR(current.concat(gap).concat(line(msg)), -PROGRESS_MSG_CAP)
