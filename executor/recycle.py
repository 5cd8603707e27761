"""Recycling: after ``INGEST_MAX_TASKS_PER_CHILD`` tasks, or above ``INGEST_MAX_RSS_MB`` of RSS,
stop reading, drain and exit 0, so ``entrypoint.sh`` starts a fresh process (both 0 = off)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import psutil
import trio

from executor.runner import Counters

log = logging.getLogger("executor.recycle")

CHECK_S = 0.2  # the task count is looked at as each task ends, and at least this often
RSS_CHECK_S = 2.0  # how often the RSS is measured


def tasks_run(counters: Counters) -> int:
    """Runs that ended here: done, failed (timeouts included), cancelled or lost."""
    return counters.done + counters.failed + counters.cancelled + counters.lost


class Recycler:
    """Asks the daemon to stop (a graceful drain) once this process has done its share."""

    def __init__(
        self,
        max_tasks: int,
        max_rss_mb: int,
        counters: Counters,
        request_stop: Callable[[], None],
        *,
        changed: Callable[[], Awaitable[None]] | None = None,
        rss_mb: Callable[[], float] | None = None,
    ) -> None:
        self.max_tasks = max_tasks
        self.max_rss_mb = max_rss_mb
        self.counters = counters
        self.request_stop = request_stop
        self.changed = changed  # wakes the check as a task ends (else it polls every CHECK_S)
        self._proc = psutil.Process()
        self.rss_mb = rss_mb or (lambda: self._proc.memory_info().rss / (1 << 20))
        self.reason = ""

    @property
    def enabled(self) -> bool:
        return self.max_tasks > 0 or self.max_rss_mb > 0

    def due(self, *, measure_rss: bool = True) -> str:
        """Why this process should recycle now, or ''."""
        if self.max_tasks > 0 and tasks_run(self.counters) >= self.max_tasks:
            return f"{tasks_run(self.counters)} tasks run (max_tasks_per_child {self.max_tasks})"
        if measure_rss and self.max_rss_mb > 0:
            rss = self.rss_mb()
            if rss > self.max_rss_mb:
                return f"RSS {rss:.0f} MB over max_rss_mb {self.max_rss_mb}"
        return ""

    async def run(self) -> None:
        if not self.enabled:
            return
        last_rss = trio.current_time() - RSS_CHECK_S
        while not self.reason:
            with trio.move_on_after(CHECK_S):
                if self.changed is not None:
                    await self.changed()
                else:
                    await trio.sleep_forever()
            measure = trio.current_time() - last_rss >= RSS_CHECK_S
            if measure:
                last_rss = trio.current_time()
            self.reason = self.due(measure_rss=measure)
        log.info("recycling: %s; stop reading, drain, exit 0", self.reason)
        self.request_stop()
