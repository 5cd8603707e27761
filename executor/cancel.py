"""Cancel watcher: stops a running task whose cancel key is set or whose row has moved on."""

from __future__ import annotations

import logging
from typing import cast

import redis
import trio

from db.database import RETRYABLE_DB_ERRORS
from db.keys import Keys, cancels
from db.models import Task
from db.streams import RETRYABLE_REDIS_ERRORS
from executor.book import STOP_CANCELLED, Book
from executor.context import Limiters
from executor.progress import stop_reason_for

log = logging.getLogger("executor.cancel")

POLL_S = 0.5  # a cancel key is seen within this (the contract promises a stop within 2 s)
ROW_CHECK_S = 2.0  # how often the rows of running tasks are checked


def read_rows(ids: list[str]) -> dict[str, tuple[str, int]]:
    """Status and attempt of each task row; inside ``unit()``."""
    query = Task.select(Task.id, Task.status, Task.attempt).where(Task.id.in_(ids)).tuples()
    return {r[0]: (r[1], r[2]) for r in query}


class CancelWatcher:
    """One MGET of the running tasks' cancel keys per poll; a row check every few seconds."""

    def __init__(self, book: Book, limiters: Limiters, client: redis.Redis, keys: Keys) -> None:
        self.book = book
        self.limiters = limiters
        self.client = client
        self.keys = keys

    async def run(self) -> None:
        """The keys and the rows in loops of their own: a row check that hangs (a pooled
        connection waiting out its read timeout, every database slot busy) does not hold up the
        keys, which ``ingest cancel`` sets after the row (a stop within 2 s)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._rows)
            while True:
                await trio.sleep(POLL_S)
                if self.book.running:
                    await self.check_keys()

    async def _rows(self) -> None:
        while True:
            await trio.sleep(ROW_CHECK_S)
            if self.book.running:
                await self.check_rows()

    async def check_keys(self) -> None:
        attempts = {tid: run.claimed.attempt for tid, run in self.book.running.items()}
        ids = list(attempts)
        names = [self.keys.cancel(t) for t in ids]
        try:
            values = cast("list[str | None]", await self.limiters.redis(self.client.mget, names))  # decoded
        except RETRYABLE_REDIS_ERRORS:
            return  # the read loop reports outages
        for tid, value in zip(ids, values, strict=True):
            if cancels(value, attempts[tid]):
                self.book.stop(tid, STOP_CANCELLED, attempts[tid])

    async def check_rows(self) -> None:
        # a run whose claim is still committing would read its row as it was before the claim
        attempts = {tid: run.claimed.attempt for tid, run in self.book.running.items() if run.committed}
        if not attempts:
            return
        try:
            rows = await self.limiters.db(read_rows, list(attempts), abandon_on_cancel=True)  # a read
        except RETRYABLE_DB_ERRORS:
            return
        for tid, attempt in attempts.items():
            row = rows.get(tid)
            if row != ("running", attempt):
                self.book.stop(tid, stop_reason_for(row, attempt), attempt)
