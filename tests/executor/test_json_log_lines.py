"""A real executor with ``INGEST_LOG_FORMAT=json``: every line it writes is one JSON object; each
line about a task carries its task id (and type); every lifecycle event is logged once; a bug's
traceback comes with its record."""

from __future__ import annotations

import socket
from collections import Counter

import orjson

from db.models import DONE, FAILED
from executor.cli import EXIT_FAILED
from tests.executor.support import all_in, enqueue, task_spec
from tests.helpers import wait_until
from tests.procs import ExecutorProcess

ONCE = (
    "executor host_1 starting",
    "executor host_1 ready",
    "draining:",
    "drained:",
    "executor host_1 exiting",
)


def test_every_line_is_json_and_task_lines_carry_the_task_id(xsettings, streams, keys, db, tmp_path):
    settings = xsettings.replace(log_format="json")
    with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
        proc.wait_ready()
        ok, bug, bad, flaky = enqueue(
            streams,
            [
                task_spec("noop"),
                task_spec("fail", error="boom"),
                task_spec("permanent"),
                task_spec("flaky", failures=1),
            ],
        )
        streams.client.xadd(keys.queue(0), {"message": '{"id": 7}'})
        wait_until(lambda: all_in([ok, flaky], DONE) and all_in([bug, bad], FAILED), 20)
        wait_until(lambda: streams.client.xlen(keys.dead) == 1, 10)
        assert proc.stop() == 0
    records = [orjson.loads(line) for line in proc.log_lines()]  # raises on any line that is not JSON
    assert all({"time", "level", "logger", "message", "executor"} <= set(r) for r in records)
    messages = [r["message"] for r in records]
    for event in ONCE:
        assert sum(m.startswith(event) for m in messages) == 1, (event, messages)
    tasks = [r for r in records if r["message"].startswith(("task ", "dropped", "dead letter", "held by"))]
    assert all(r.get("task_id") is not None for r in tasks), tasks  # the malformed message's id is ''
    starts = Counter(r["task_id"] for r in records if r["message"] == "task start")
    ends = Counter(r["task_id"] for r in records if r["message"].startswith("task end"))
    assert starts == ends == Counter([ok, bug, bad, flaky])
    assert all(r["task_type"] and "duration_s" in r for r in records if r["message"].startswith("task end"))
    (retry,) = [r for r in records if r["message"].startswith("task retry")]
    assert retry["task_id"] == flaky
    assert sum(m.startswith("dead letter: ") for m in messages) == 1
    by_task = {r["task_id"]: r for r in records if r["message"].startswith("task end: failed")}
    assert "Traceback" in by_task[bug]["exc_info"] and "ValueError: boom" in by_task[bug]["exc_info"]
    assert "exc_info" not in by_task[bad]  # our own kind of error says enough without a traceback


def test_an_error_that_stops_the_executor_is_one_json_record_with_its_traceback(xsettings, db, tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        settings = xsettings.replace(log_format="json", metrics_port=taken.getsockname()[1])
        with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
            assert proc.wait(30) == EXIT_FAILED
    records = [orjson.loads(line) for line in proc.log_lines()]
    (error,) = [r for r in records if r["level"] == "ERROR"]
    assert error["message"] == "executor host_1 stopped by an error"
    assert "Traceback" in error["exc_info"] and "Address already in use" in error["exc_info"]
