"""Log set-up: ``INGEST_LOG_FORMAT`` plain or json, ``INGEST_LOG_LEVEL``, executor context fields.

``json`` (python-json-logger) writes one object a line: ``time`` (ISO 8601, UTC), ``level``,
``logger``, ``message``, ``executor``, and where they apply ``task_id``, ``doc_id``,
``task_type``, ``duration_s``; an exception's traceback in ``exc_info``. Python warnings go
through the same handler. ``plain`` is ``time level logger: message [field=value …]``.
"""

from __future__ import annotations

import logging
import sys
from typing import IO

from db.config import Settings

CONTEXT_FIELDS = ("executor", "task_id", "doc_id", "task_type", "duration_s")


class _ExecutorField(logging.Filter):
    """Every record names the executor that wrote it."""

    def __init__(self, consumer: str) -> None:
        super().__init__()
        self.consumer = consumer

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "executor"):
            record.executor = self.consumer
        return True


class PlainFormatter(logging.Formatter):
    """``time level logger: message [executor=… task_id=…]`` for a person to read."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        parts = [
            f"{k}={getattr(record, k)}" for k in CONTEXT_FIELDS if getattr(record, k, None) not in (None, "")
        ]
        if not parts:
            return text
        head, sep, tail = text.partition("\n")  # keep a traceback below the line
        return f"{head} [{' '.join(parts)}]{sep}{tail}"


def make_formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
        )
    return PlainFormatter()


def make_handler(settings: Settings, consumer: str, stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing to ``stream`` (stderr) in the configured format, naming the executor."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(make_formatter(settings.log_format))
    handler.addFilter(_ExecutorField(consumer))
    return handler


def setup_logging(settings: Settings, consumer: str, stream: IO[str] | None = None) -> logging.Handler:
    """Route every log record to ``stream`` (stderr) in the configured format; returns the handler."""
    handler = make_handler(settings, consumer, stream)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level.upper())
    logging.captureWarnings(True)  # warnings as log records, in the same format
    return handler
