"""dead replay writes its line on the task row as every other re-queue does: timestamped, newline
ended, appended in SQL with the oldest text cut off at the cap."""

from __future__ import annotations

import re

import orjson

from db.database import unit
from db.models import DEAD, QUEUED, Task
from ingest.dead import replay
from ingest.lines import PROGRESS_MSG_CAP
from ingest.producer import enqueue_tasks, task_message
from tests.ingest.factories import ack_all


def test_replay_appends_a_timestamped_line_within_the_cap(settings, rclient, keys):
    (task_id,) = enqueue_tasks(settings, [{"task_type": "memory", "memory_id": "m1"}])
    ack_all(rclient, keys)
    history = "".join(f"2026-01-01 00:00:00 line {n}\n" for n in range(PROGRESS_MSG_CAP // 20))
    with unit():
        Task.update(status=DEAD, progress=-1.0, progress_msg=history).where(Task.id == task_id).execute()
        row = Task.select().where(Task.id == task_id).dicts().get()
    entry = rclient.xadd(
        keys.dead,
        {
            "task_id": task_id,
            "reason": "gave up after 3 deliveries",
            "deliveries": "3",
            "message": orjson.dumps(task_message(row)).decode(),
        },
    )
    result = replay(settings, [entry])
    assert result.replayed == [(entry, task_id)] and result.published == 1
    with unit():
        task = Task.get_by_id(task_id)
    assert task.status == QUEUED and len(task.progress_msg) == PROGRESS_MSG_CAP
    assert re.search(
        rf"\n\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d re-queued by dead replay of entry {entry}\n$", task.progress_msg
    )
    assert history.endswith(task.progress_msg.rsplit("\n", 2)[0] + "\n")  # the newest old lines kept
