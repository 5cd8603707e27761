"""Wait for one task to end, reading its row (the database is the truth, ``LIFECYCLE.md``);
:class:`Waker`, what wakes a reader of rows early (an event on the updates channel)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import redis

from db.config import Settings
from db.database import connection, init_database
from db.keys import Keys
from db.models import TERMINAL_STATES, Task
from db.streams import connect
from ingest.errors import NotFound

MIN_POLL_S, MAX_POLL_S = 0.05, 0.5


def read_task(task_id: str) -> dict[str, Any] | None:
    """The task row as a dict, or None (blocking, one connection)."""
    with connection():
        row = Task.get_or_none(Task.id == task_id)
    return None if row is None else dict(row.to_dict())


class Waker:
    """Sleeps until the next poll, or until an event on the updates channel. Subscribed when
    made: made before the first read of a row, it misses no event after that read. Without
    Redis it sleeps the whole poll."""

    def __init__(self, settings: Settings) -> None:
        self.pubsub = None
        self.client = None
        try:
            self.client = connect(settings)
            self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            self.pubsub.subscribe(Keys(settings.key_prefix).updates)
        except redis.RedisError:
            self.close()

    def sleep(self, seconds: float) -> None:
        if self.pubsub is None:
            time.sleep(seconds)
            return
        try:
            self.pubsub.get_message(timeout=seconds)
        except redis.RedisError:
            self.close()
            time.sleep(seconds)

    def close(self) -> None:
        for thing in (self.pubsub, self.client):
            if thing is not None:
                with contextlib.suppress(redis.RedisError):
                    thing.close()
        self.pubsub = self.client = None


def wait_for_task(
    settings: Settings, task_id: str, *, timeout_s: float | None = None
) -> tuple[dict[str, Any], bool]:
    """``(row, ended)``: the row once its status is terminal, or as it is when ``timeout_s`` ran out.

    Polls the row, every 50 ms at first and at most every 0.5 s. :class:`NotFound` when the row
    is gone.
    """
    init_database(settings.db_url)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    poll = MIN_POLL_S
    while True:
        row = read_task(task_id)
        if row is None:
            raise NotFound(f"task {task_id} does not exist (removed while waiting?)")
        if row["status"] in TERMINAL_STATES:
            return row, True
        if deadline is not None and time.monotonic() >= deadline:
            return row, False
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))
        poll = min(MAX_POLL_S, poll * 1.5)


def last_line(progress_msg: str) -> str:
    """The newest line of a row's ``progress_msg`` without its timestamp."""
    lines = (progress_msg or "").strip().splitlines()
    if not lines:
        return ""
    parts = lines[-1].split(" ", 2)
    return parts[2] if len(parts) == 3 and parts[0][:2].isdigit() else lines[-1]
