"""Logs: ``INGEST_LOG_FORMAT=json`` writes one JSON object a line carrying the task's fields."""

from __future__ import annotations

import io
import logging

import orjson

from db.models import DONE, FAILED
from executor.logs import make_handler
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until


async def test_json_logs_are_one_object_a_line_with_executor_and_task_fields(xsettings, streams, db):
    settings = xsettings.replace(log_format="json")
    out = io.StringIO()
    handler = make_handler(settings, "host_1", out)
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        ok, bad = enqueue(streams, [task_spec("noop"), task_spec("fail", error="boom")])
        async with running_daemon(settings, "host_1"):
            await await_until(lambda: row(ok)["status"] == DONE and row(bad)["status"] == FAILED, 10)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    records = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert records and all({"time", "level", "logger", "message", "executor"} <= set(r) for r in records)
    messages = [r["message"] for r in records]
    for event in ("executor host_1 starting", "draining: stop reading", "executor host_1 exiting"):
        assert sum(m.startswith(event) for m in messages) == 1, event
    ends = [r for r in records if r["message"].startswith("task end")]
    assert {r["task_id"] for r in ends} == {ok, bad} and all(
        r["task_type"] and "duration_s" in r for r in ends
    )
    assert any(r["level"] == "WARNING" and "ValueError: boom" in r["message"] for r in ends)
