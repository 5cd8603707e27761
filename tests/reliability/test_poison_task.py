"""A task whose handler kills its own process, under entrypoint.sh (which restarts the executor
under the same name): it is dead-lettered after the cap with its delivery count, its row dead,
while every other task finishes; nothing is left pending."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from db.database import unit
from db.keys import Keys
from db.models import DEAD, DONE, Task
from tests.executor.support import enqueue, task_spec
from tests.helpers import wait_until
from tests.procs import ROOT, settings_env
from tests.reliability.support import (
    count_done,
    create_completion_table,
    enqueue_recorded,
    fleet_settings,
    stream_state,
)

OTHERS = 40


def test_a_task_that_kills_its_executor_is_dead_lettered_after_the_cap_while_the_others_finish(
    settings, streams, rclient, db, tmp_path
):
    began = time.monotonic()
    # A redelivery timeout longer than a restart: the entry comes back to its own consumer's
    # next process (the same name), which takes it over at start.
    s = fleet_settings(settings, max_deliveries=3, redelivery_timeout_s=5.0)
    keys = Keys(s.key_prefix)
    create_completion_table()
    (poison,) = enqueue(streams, [task_spec("kill_self", priority=1)])
    others = enqueue_recorded(streams, OTHERS, docs=4)
    env = settings_env(
        s,
        INGEST_EXECUTOR_CMD=f"{sys.executable} -m executor",
        RESTART_BACKOFF_MIN_S="0.2",
        RESTART_BACKOFF_MAX_S="0.5",
        WS="2",
    )
    log_path = tmp_path / "entrypoint.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(ROOT / "entrypoint.sh"), "--host-id", "poison"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: _status(poison) == DEAD and count_done(others) == OTHERS, 120)
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 30)
        state = stream_state(rclient, keys)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = Path(log_path).read_text()
    crashes = len(re.findall(r"exited with status 137", text))
    letters = rclient.xrange(keys.dead)
    counts = {
        "executor_crashes": crashes,
        "dead_letters": len(letters),
        "deliveries": [int(f["deliveries"]) for _, f in letters],
        "others_done": count_done(others),
        "seconds": round(time.monotonic() - began, 1),
        **state,
    }
    print(f"\npoison task: counts {counts}")
    assert state["pending"] == 0 and state["stream_entries"] == 0
    [(_, letter)] = letters
    assert letter["task_id"] == poison and letter["deliveries"] == "4"
    assert letter["reason"].startswith("gave up after 4 deliveries")
    assert crashes == 3
    with unit():
        row = Task.get_by_id(poison)
        assert row.status == DEAD and row.progress == -1 and "gave up after 4 deliveries" in row.progress_msg
        statuses = {t.status for t in Task.select().where(Task.id.in_(others))}
    assert statuses == {DONE}


def _status(task_id: str) -> str:
    with unit():
        return Task.get_by_id(task_id).status
