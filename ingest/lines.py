"""Timestamped lines on a row's ``progress_msg``, and the SQL that appends one, capped."""

from __future__ import annotations

import time
from typing import Any

import peewee

from db.database import is_mysql

PROGRESS_MSG_CAP = 16000  # characters kept (the newest)


def line(text: str) -> str:
    """``"2026-01-31 12:00:00 text"`` plus a newline."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n"


def appended(field: peewee.Field, text: str) -> Any:
    """An expression for ``field`` with a timestamped line added and the oldest text cut off."""
    new = line(text)
    if is_mysql():
        return peewee.fn.RIGHT(peewee.fn.CONCAT(peewee.fn.COALESCE(field, ""), new), PROGRESS_MSG_CAP)
    return peewee.fn.SUBSTR(peewee.fn.COALESCE(field, "").concat(new), -PROGRESS_MSG_CAP)
