"""Issue 17 #3: a parse worker dies with its executor. A real executor process is SIGKILLed
(as a supervisor or the OOM killer would) while its worker parses a document that never ends:
the worker, which would otherwise go on as a child of init, is gone within a few seconds, and
the executor that takes the task over finds no old worker still running."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

from db.models import FAILED
from ingest.producer import submit_documents
from tests.executor.support import row
from tests.helpers import wait_until
from tests.procs import ExecutorProcess
from tests.reliability.support import fleet_settings

PROBE_HANDLER = "parse=tests.budget_probes:parse_with_probes"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_dies_within_seconds_of_its_executor_being_killed(settings, db, tmp_path):
    s = fleet_settings(settings, extra_handlers=PROBE_HANDLER, max_deliveries=2, parse_timeout_s=3.0)
    pid_file = tmp_path / "worker.pid"
    task_id = submit_documents(s, [("endless.slow", str(pid_file).encode())], "kb").task_ids[0]
    worker = 0
    try:
        with ExecutorProcess(s, "host_1", tmp_path / "host_1.log") as first:
            first.wait_ready(60)
            wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60)
            worker = int(pid_file.read_text())
            assert worker in {c.pid for c in psutil.Process(first.pid).children(recursive=True)}
            pid_file.unlink()
            first.kill()  # SIGKILL: nothing of the executor runs after this
            # its watchdog polls every 0.1 s; the bound is for a loaded CI machine, where the
            # niced worker may wait seconds for a core (5 s failed once under coverage)
            wait_until(lambda: not _alive(worker), 20)
        with ExecutorProcess(s, "host_2", tmp_path / "host_2.log") as second:  # takes the task over
            second.wait_ready(60)
            wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60)
            again = int(pid_file.read_text())
            assert not _alive(worker)
            assert {c.pid for c in psutil.Process(second.pid).children(recursive=True)} >= {again}
            # and the document's time budget ends that second try (a reason, not a hang)
            wait_until(lambda: row(task_id)["status"] == FAILED, 30)
            assert "took longer than 3 s (parse_timeout_s)" in row(task_id)["progress_msg"]
            second.stop()
    finally:
        for pid in (worker, *([int(pid_file.read_text())] if pid_file.exists() else [])):
            if pid and _alive(pid):  # only what this test started, by its pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
