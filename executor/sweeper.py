"""Reclaim: take over stream entries whose owner stopped renewing them, whatever its name was.

On a jittered timer, under a short fleet-wide lease (``SET lock:sweep NX PX``, so one executor
of the fleet sweeps at a time), XAUTOCLAIM entries idle longer than the redelivery timeout,
never more than this executor's free slots, following each stream's cursor across passes so a
long pending list is walked in bounded steps. XAUTOCLAIM runs without JUSTID, so each reclaim
counts as a delivery; the counts come from XPENDING in the same script. The entries then take
the normal validate-and-claim path as *reclaimed* entries: a reclaimed entry always takes over
its row, and one delivered more than ``INGEST_MAX_DELIVERIES`` times is dead-lettered (a done
row is just acked).

Right after a Redis restart every entry looks idle (nobody could renew); the sweeper waits one
redelivery timeout after Redis (or this executor's link to it) came back, so live owners renew
first.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis
import trio

from db.config import Settings
from db.keys import Keys
from db.redis_client import on_node_of
from db.streams import RETRYABLE_REDIS_ERRORS, Entry, Streams
from executor.book import Book
from executor.context import Limiters
from executor.outage import Outage

log = logging.getLogger("executor.sweeper")

MIN_INTERVAL_S = 0.2
MAX_INTERVAL_S = 30.0
START_CURSOR = "0-0"

# Delete the lease only if it is still ours.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class SweepStatistics:
    passes: int  # sweeps that held the fleet lease
    reclaimed: int  # entries taken over
    skipped_busy: int  # passes skipped: another executor held the lease


class Sweeper:
    """XAUTOCLAIM sweeps; what they return goes to ``dispatch`` (the collector's claim path)."""

    def __init__(
        self,
        settings: Settings,
        consumer: str,
        streams: Streams,
        book: Book,
        limiters: Limiters,
        outage: Outage,
        dispatch: Callable[[list[Entry]], Awaitable[None]],
    ) -> None:
        self.consumer = consumer
        self.streams = streams
        self.client: redis.Redis = streams.client
        self.keys: Keys = streams.keys
        self.book = book
        self.limiters = limiters
        self.outage = outage
        self.dispatch = dispatch
        self.redelivery_timeout_s = settings.redelivery_timeout_s
        self.min_idle_ms = max(1, int(settings.redelivery_timeout_s * 1000))
        self.interval_s = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, settings.redelivery_timeout_s / 2))
        self.lease_ms = max(1000, int(self.interval_s * 2000))
        self.cursors = dict.fromkeys(self.keys.queues, START_CURSOR)
        self._release = self.client.register_script(_RELEASE)
        self._outages_seen = 0
        self._quiet_until = 0.0
        self._passes = self._reclaimed = self._busy = 0

    def statistics(self) -> SweepStatistics:
        return SweepStatistics(self._passes, self._reclaimed, self._busy)

    async def run(self, ready: trio.Event | None = None) -> None:
        """Sweep until reading stops; ``ready`` (the start-up takeover done) gates the first pass."""
        if ready is not None:
            await ready.wait()
        while self.book.reading:
            await trio.sleep(self.interval_s * random.uniform(0.5, 1.5))
            if self.book.reading:
                await self.sweep_once()

    def _quiet(self) -> bool:
        """True for one redelivery timeout after a Redis outage this executor saw end."""
        if self.outage.active or self.outage.outages != self._outages_seen:
            self._outages_seen = self.outage.outages
            self._quiet_until = time.monotonic() + self.redelivery_timeout_s
        return time.monotonic() < self._quiet_until

    async def sweep_once(self) -> list[Entry]:
        """One pass (if a slot is free and the lease is ours); returns the entries taken over."""
        free = self.book.free
        if free <= 0 or self._quiet():
            return []
        try:
            found = await self.limiters.redis(self.reclaim, free)
        except RETRYABLE_REDIS_ERRORS as exc:
            self.outage.failed(exc)  # the read loop reports when Redis is back
            return []
        except redis.ResponseError as exc:
            # e.g. NOGROUP after Redis lost its data: the read loop creates the group again
            log.warning("reclaim sweep refused: %s", exc)
            return []
        if found is None:
            return []
        if not self.book.reading:  # the drain began during the pass: claim and run nothing more
            if found:
                log.info(
                    "draining: %d reclaimed entr%s left pending for another executor's sweep",
                    len(found),
                    "y" if len(found) == 1 else "ies",
                )
            return []
        entries = [e for e in found if e.key not in self.book.entries]  # ours already: left as is
        if entries:
            self._reclaimed += len(entries)
            log.info(
                "reclaimed %d entr%s idle over %g s",
                len(entries),
                "y" if len(entries) == 1 else "ies",
                self.redelivery_timeout_s,
                extra={"entries": [e.entry_id for e in entries]},
            )
            await self.dispatch(entries)
        return entries

    # -- blocking (in a thread) -----------------------------------------------------------
    def reclaim(self, free: int) -> list[Entry] | None:
        """Under the fleet lease: XAUTOCLAIM up to ``free`` entries, high priority first.
        None when another executor holds the lease, Redis restarted too recently or this
        executor stopped reading (checked again before each stream)."""
        if not self.book.reading or self._redis_uptime_s() < self.redelivery_timeout_s:
            return None
        token = uuid.uuid4().hex
        lock = self.keys.lock("sweep")
        if not self.client.set(lock, token, nx=True, px=self.lease_ms):
            self._busy += 1
            return None
        try:
            self._passes += 1
            out: list[Entry] = []
            for stream in self.keys.queues:
                want = free - len(out)
                if want <= 0 or not self.book.reading:
                    break
                cursor, entries = self.streams.reclaim(
                    self.consumer, stream, self.min_idle_ms, self.cursors[stream], want
                )
                self.cursors[stream] = cursor
                out += entries
            return out
        finally:
            self._release(keys=[lock], args=[token])

    def _redis_uptime_s(self) -> float:
        try:
            info = self.client.info("server", **on_node_of(self.client, self.keys.lock("sweep")))
        except redis.ResponseError:  # INFO refused (a managed Redis): assume it has been up
            return float("inf")
        return float(info.get("uptime_in_seconds", 0))
