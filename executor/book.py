"""What this executor holds right now: its stream entries, its claimed tasks and its free slots."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from db.streams import Entry

log = logging.getLogger("executor.book")

# Why a run was stopped from outside its handler.
STOP_CANCELLED = "cancelled"  # the user cancelled the task (row cancelled, cancel key set)
STOP_LOST = "lost"  # the row moved on (another attempt, or terminal): write nothing, ack nothing
STOP_HANDBACK = "handback"  # shutdown: the row goes back to queued and the entry is re-published


@dataclass
class Claimed:
    """A task this executor won: its entry, message, rows and the attempt that fences its writes."""

    entry: Entry
    message: dict[str, Any]
    task_type: str
    row: dict[str, Any]
    doc: dict[str, Any] | None
    kb: dict[str, Any] | None
    attempt: int

    @property
    def task_id(self) -> str:
        return str(self.row["id"])

    @property
    def doc_id(self) -> str:
        return str(self.row.get("doc_id") or "")

    def log_extra(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "doc_id": self.doc_id, "task_type": self.task_type}


@dataclass
class Running:
    """A claimed task while its runner lives; ``scope`` stops it, ``stop_reason`` says why."""

    claimed: Claimed
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    stop_reason: str = ""
    retries: int = 0  # retryable errors tried again in place
    committed: bool = True  # False while the claim that started it has not committed yet
    since: float = field(default_factory=time.monotonic)


class Book:
    """Slots, running tasks and owned entries; everything here lives in the trio thread."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.reserved = 0  # entries read and not yet released (validating, waiting, running)
        self.running: dict[str, Running] = {}
        self.entries: set[tuple[str, str]] = set()  # (stream, entry id) read and not yet settled
        self.reading = True  # False once the executor stops reading (drain)
        self._changed = trio.Event()

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.reserved)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def hold(self, entries: list[Entry]) -> None:
        """Entries just read: each takes a slot and is ours until settled."""
        self.reserved += len(entries)
        self.entries.update(e.key for e in entries)
        self._notify()

    def release(self, n: int = 1) -> None:
        self.reserved -= n
        self._notify()

    def settle(self, keys: list[tuple[str, str]]) -> None:
        """Entries acked, handed back or given up: no longer ours."""
        self.entries.difference_update(keys)

    def stop_reading(self) -> None:
        self.reading = False
        self._notify()

    async def wait_free(self) -> int:
        """Until a slot is free (returns how many) or reading stopped (returns 0)."""
        while self.free <= 0 and self.reading:
            await self._changed.wait()
        return self.free if self.reading else 0

    async def wait_changed(self) -> None:
        """Until the next change of slots (a task read, released or ended) or of reading."""
        await self._changed.wait()

    async def wait_idle(self) -> None:
        while self.reserved > 0 or self.running:
            await self._changed.wait()

    def start(self, claimed: Claimed, committed: bool = True) -> Running:
        run = Running(claimed, committed=committed)
        self.running[claimed.task_id] = run
        return run

    def committed(self, claimed: list[Claimed]) -> None:
        """The claim of these runs is durable now."""
        for c in claimed:
            run = self.running.get(c.task_id)
            if run is not None and run.claimed.attempt == c.attempt:
                run.committed = True

    def finish(self, task_id: str) -> None:
        self.running.pop(task_id, None)
        self.release(1)

    def stop(self, task_id: str, reason: str, attempt: int | None = None) -> bool:
        """Cancel a running task's scope (once); ``attempt`` guards against a newer run."""
        run = self.running.get(task_id)
        if run is None or (attempt is not None and run.claimed.attempt != attempt):
            return False
        if not run.stop_reason:
            run.stop_reason = reason
            log.info("stopping task: %s", reason, extra=run.claimed.log_extra())
        run.scope.cancel()
        return True

    def running_ids(self) -> list[str]:
        return list(self.running)
