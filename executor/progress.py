"""Progress of running tasks: kept in memory, written by one flusher loop, monotonic and fenced."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from db.database import RETRYABLE_DB_ERRORS, is_mysql
from db.models import CANCELLED, RUNNING, now_ms
from executor import sql
from executor.book import STOP_CANCELLED, STOP_LOST
from executor.context import Limiters
from executor.outage import Outage

# The line format and its caps are ingest.lines' (the command line writes the same lines);
# claim, reconciler and finisher take append_line from here.
from ingest.lines import MAX_BYTES as MAX_BYTES
from ingest.lines import MAX_LINES as MAX_LINES
from ingest.lines import Lines
from ingest.lines import append_line as append_line

log = logging.getLogger("executor.progress")

MAX_RUNNING_FRACTION = 0.99  # 1.0 means done; a running task stays below it


@dataclass
class Track:
    """One running task's progress as this executor knows it."""

    attempt: int
    fraction: float
    lines: Lines
    version: int = 0  # bumped on every report
    written: int = -1  # the version last written to the row


@dataclass(frozen=True)
class ProgressStatistics:
    flushes: int
    rows_written: int
    failed_flushes: int


@dataclass
class ProgressBook:
    """Reports land here without blocking; the flusher takes the dirty ones."""

    tracks: dict[str, Track] = field(default_factory=dict)

    def open(self, task_id: str, attempt: int, fraction: float, text: str) -> None:
        self.tracks[task_id] = Track(attempt, max(0.0, float(fraction or 0.0)), Lines(text))

    def close(self, task_id: str) -> None:
        self.tracks.pop(task_id, None)

    def report(self, task_id: str, fraction: float | None, msg: str = "") -> None:
        track = self.tracks.get(task_id)
        if track is None:
            return
        if fraction is not None:
            clamped = min(MAX_RUNNING_FRACTION, max(0.0, float(fraction)))
            track.fraction = max(track.fraction, clamped)
        if msg:
            track.lines.add(msg)
        track.version += 1

    def text(self, task_id: str) -> str:
        track = self.tracks.get(task_id)
        return track.lines.text() if track else ""

    def dirty(self) -> list[tuple[str, Track, int]]:
        return [(tid, t, t.version) for tid, t in self.tracks.items() if t.version != t.written]


def write_progress(items: list[tuple[str, int, float, str]]) -> dict[str, tuple[str, int] | None]:
    """One fenced, monotonic UPDATE for every dirty task ``(id, attempt, fraction, text)``;
    inside ``unit()``. Returns the tasks whose row did not match: id → (status, attempt) or None."""
    ids = [i[0] for i in items]
    biggest = "GREATEST" if is_mysql() else "MAX"
    fraction, fraction_params = sql.per_row(ids, [i[2] for i in items])
    count = sql.update_tasks(
        [
            (f"progress = {biggest}(progress, {fraction})", fraction_params),
            sql.assign("progress_msg", ids, [i[3] for i in items]),
            sql.assign("update_time", ids, [now_ms()]),
        ],
        sql.fence(ids, [i[1] for i in items], RUNNING),
    )
    if count >= len(items):
        return {}
    found = sql.task_states(ids)
    lost: dict[str, tuple[str, int] | None] = {}
    for tid, attempt, _, _ in items:
        row = found.get(tid)
        if row != (RUNNING, attempt):
            lost[tid] = row
    return lost


def stop_reason_for(row: tuple[str, int] | None, attempt: int) -> str:
    """A run whose row moved on: cancelled under my attempt is a cancel, anything else is lost."""
    return STOP_CANCELLED if row is not None and row == (CANCELLED, attempt) else STOP_LOST


class ProgressFlusher:
    """Every ``interval_s``, one transaction writes every task whose progress changed."""

    def __init__(
        self,
        book: ProgressBook,
        limiters: Limiters,
        interval_s: float,
        outage: Outage,
        on_lost: Callable[[str, str, int], None],
    ) -> None:
        self.book = book
        self.limiters = limiters
        self.interval_s = max(0.01, interval_s)
        self.outage = outage
        self.on_lost = on_lost  # (task id, stop reason, attempt)
        self._flushes = self._rows = self._failed = 0

    def statistics(self) -> ProgressStatistics:
        return ProgressStatistics(self._flushes, self._rows, self._failed)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        dirty = self.book.dirty()
        if not dirty:
            return
        items = [(tid, t.attempt, t.fraction, t.lines.text()) for tid, t, _ in dirty]
        dropped = 0
        try:
            # abandoned on a cancel (the end of a stop while the database stalls): progress is
            # only ever overwritten by a later write
            lost = await self.limiters.db(write_progress, items, abandon_on_cancel=True)
        except RETRYABLE_DB_ERRORS as exc:
            self._failed += 1
            self.outage.failed(exc)  # kept dirty: written on a later pass
            return
        except Exception as exc:  # a row the database refuses (a line it cannot store) fails them all
            log.warning("progress of %d task(s) failed (%s); writing them one at a time", len(items), exc)
            alone = await self._one_by_one(items)
            if alone is None:
                return
            lost, dropped = alone
        self.outage.ok()
        self._flushes += 1
        self._rows += len(items) - len(lost) - dropped
        for _tid, track, version in dirty:
            track.written = version
        attempts = {i[0]: i[1] for i in items}
        for tid, row in lost.items():
            self.on_lost(tid, stop_reason_for(row, attempts[tid]), attempts[tid])

    async def _one_by_one(
        self, items: list[tuple[str, int, float, str]]
    ) -> tuple[dict[str, tuple[str, int] | None], int] | None:
        """Each task's progress alone; one the database refuses is logged and dropped (until
        its next report). Returns (lost, dropped), or None after a retryable error (all stay dirty)."""
        lost: dict[str, tuple[str, int] | None] = {}
        dropped = 0
        for item in items:
            try:
                lost.update(await self.limiters.db(write_progress, [item], abandon_on_cancel=True))
            except RETRYABLE_DB_ERRORS as exc:
                self._failed += 1
                self.outage.failed(exc)
                return None
            except Exception as exc:
                dropped += 1
                log.error(
                    "progress not written, dropped: %s: %s",
                    type(exc).__name__,
                    exc,
                    extra={"task_id": item[0]},
                )
        return lost, dropped
