"""The last hour in memory: tasks finished and failed per minute (from the updates channel) and
the queue depth (sampled), as small inline SVG bar charts.

One :class:`History` per server process: :data:`MINUTES` buckets at most (a deque), so a server
up for a month holds the same few kilobytes as one up for a minute.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import peewee
import trio

from db.database import RETRYABLE_DB_ERRORS
from db.streams import RETRYABLE_REDIS_ERRORS
from ingest.api.dashboard.reads import queue_depth
from ingest.api.runtime import Runtime

log = logging.getLogger(__name__)

MINUTES = 60
SAMPLE_S = 5.0
FAILURES = ("failed", "dead")


@dataclass
class Minute:
    minute: int  # minutes since the epoch
    finished: int = 0  # tasks done
    failed: int = 0  # tasks failed or dead
    depth: int = 0  # the largest queue depth sampled


class History:
    """Minute buckets of the last hour."""

    def __init__(self, minutes: int = MINUTES) -> None:
        self.minutes = minutes
        self._buckets: deque[Minute] = deque(maxlen=minutes)

    def _now(self, now_s: float | None = None) -> Minute:
        minute = int((time.time() if now_s is None else now_s) // 60)
        if not self._buckets or self._buckets[-1].minute != minute:
            self._buckets.append(Minute(minute))
        return self._buckets[-1]

    def on_event(self, event: dict[str, Any]) -> None:
        """A listener of the hub: count each task's end."""
        status = event.get("status")
        if "result_key" not in event:
            return  # a hand-back: not a task's end
        bucket = self._now()
        if status == "done":
            bucket.finished += 1
        elif status in FAILURES:
            bucket.failed += 1

    def sample_depth(self, depth: int, now_s: float | None = None) -> None:
        bucket = self._now(now_s)
        bucket.depth = max(bucket.depth, depth)

    def series(self, now_s: float | None = None) -> list[Minute]:
        """One bucket per minute of the last hour, oldest first (minutes with nothing are 0)."""
        current = int((time.time() if now_s is None else now_s) // 60)
        by_minute = {b.minute: b for b in self._buckets}
        return [by_minute.get(m, Minute(m)) for m in range(current - self.minutes + 1, current + 1)]

    def charts(self) -> list[dict[str, Any]]:
        series = self.series()
        return [
            chart("tasks done per minute", [b.finished for b in series], "done"),
            chart("queue depth", [b.depth for b in series], "depth"),
            chart("failures per minute", [b.failed for b in series], "failed"),
        ]

    async def sample_forever(self, runtime: Runtime) -> None:
        """Sample the queue depth every :data:`SAMPLE_S` (until cancelled)."""
        while True:
            try:
                depth = await runtime.in_redis(queue_depth, runtime.redis_client, runtime.keys)
                self.sample_depth(depth)
            except (*RETRYABLE_REDIS_ERRORS, *RETRYABLE_DB_ERRORS, peewee.DatabaseError) as exc:
                log.warning("dashboard history: cannot sample the queues (%r)", exc)
            await trio.sleep(SAMPLE_S)


WIDTH, HEIGHT = 240, 48


def chart(title: str, values: list[int], css: str) -> dict[str, Any]:
    """An SVG bar chart's parts (the template draws them): one bar per minute, scaled to the
    largest value."""
    top = max(values) if values else 0
    step = WIDTH / max(1, len(values))
    bars = []
    for i, v in enumerate(values):
        h = 0.0 if top == 0 or v == 0 else max(1.0, HEIGHT * v / top)
        bars.append(
            {
                "x": round(i * step, 2),
                "y": round(HEIGHT - h, 2),
                "w": round(max(1.0, step - 1), 2),
                "h": round(h, 2),
                "v": v,
            }
        )
    return {
        "title": title,
        "css": css,
        "bars": bars,
        "top": top,
        "now": values[-1] if values else 0,
        "total": sum(values),
        "width": WIDTH,
        "height": HEIGHT,
    }
