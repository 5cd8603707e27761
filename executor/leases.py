"""Leases: renew the stream entries this executor holds, so no one reclaims a task that still runs.

Every quarter of ``INGEST_REDELIVERY_TIMEOUT_S`` one Lua call (``Streams.renew``: XPENDING owner
check, then XCLAIM … JUSTID with idle 0) renews every entry the book holds. Per entry:

- renewed: nothing to do;
- owned by another consumer: it took the entry while this executor stalled and has claimed (or
  is claiming) the row; this copy of the task is stopped as *lost*: it writes nothing more and
  acks nothing (``LIFECYCLE.md``, "Leases");
- gone (Redis lost it): the task runs on and finishes; the row is the truth. Its tenant slot,
  lost with it, is taken again by the next renewal that finds it gone still (``Streams.renew``),
  so the gate still counts the task against its tenant's cap; its ack ends that slot. The
  reconciler asks for those renewals at once (:meth:`LeaseKeeper.renew_for_a_loss`) when it
  finds the limits mirror gone (the sign of such a loss), before it copies the limits that let
  the gate admit again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
import trio

from db.streams import RETRYABLE_REDIS_ERRORS, Streams
from executor.book import STOP_LOST, Book
from executor.context import Limiters
from executor.outage import Outage

log = logging.getLogger("executor.leases")

RENEWED, TAKEN, GONE = 1, 0, -1
MIN_INTERVAL_S = 0.05


@dataclass(frozen=True)
class LeaseStatistics:
    renewals: int  # calls that went through
    renewed: int  # entries renewed, summed over calls
    taken: int  # entries found owned by another consumer
    gone: int  # entries found missing from the stream
    failed: int  # calls that failed (Redis unreachable)


class LeaseKeeper:
    """Renews the book's entries every ``interval_s``; stops the runs whose entry was taken."""

    def __init__(
        self,
        streams: Streams,
        consumer: str,
        book: Book,
        limiters: Limiters,
        outage: Outage,
        interval_s: float,
    ) -> None:
        self.streams = streams
        self.consumer = consumer
        self.book = book
        self.limiters = limiters
        self.outage = outage
        self.interval_s = max(MIN_INTERVAL_S, interval_s)
        self._gone_once: set[tuple[str, str]] = set()  # found gone by the last renewal
        self._gone_seen: set[tuple[str, str]] = set()  # reported once each
        self._renewals = self._renewed = self._taken = self._gone = self._failed = 0
        self._lock = trio.Lock()  # the keeper's loop and the reconciler's renew_for_a_loss

    @classmethod
    def interval_for(cls, redelivery_timeout_s: float) -> float:
        return redelivery_timeout_s / 4

    def statistics(self) -> LeaseStatistics:
        return LeaseStatistics(self._renewals, self._renewed, self._taken, self._gone, self._failed)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval_s)
            await self.renew_once()

    async def renew_for_a_loss(self) -> None:
        """Redis may have lost its data (the limits mirror's mark is gone, and a copy of the
        limits is about to let the gate admit): renew now, and once more at once if entries of
        running tasks were found gone, so that those take their slots again first."""
        verdict = await self.renew_once()
        running = {run.claimed.entry.key for run in self.book.running.values()}
        if any(result == GONE and key in running for key, result in verdict.items()):
            await self.renew_once()

    async def renew_once(self) -> dict[tuple[str, str], int]:
        """One renewal of every entry held now; returns entry → result (empty on failure)."""
        async with self._lock:
            return await self._renew_once()

    async def _renew_once(self) -> dict[tuple[str, str], int]:
        keys = sorted(self.book.entries)
        if not keys:
            self._gone_once.clear()
            self._gone_seen.clear()
            return {}
        # A task running here whose entry the last renewal found gone already, and this one
        # may too: Redis lost the entry, and its tenant slot with it; the renewal takes the
        # slot again. Found gone once only, it may be an entry acked while that call ran (the
        # run had left: an ack follows the run's end), so no slot is taken for it.
        running = {
            run.claimed.entry.key: run.claimed.entry.tenant
            for run in self.book.running.values()
            if run.claimed.entry.tenant and run.claimed.entry.key in self._gone_once
        }
        try:
            results = await self.limiters.redis(self.streams.renew, self.consumer, keys, running)
        except RETRYABLE_REDIS_ERRORS as exc:
            # Only report the failure: the read loop says when Redis is back (one warning
            # per outage, however many loops notice it).
            self._failed += 1
            self.outage.failed(exc)
            return {}
        except redis.ResponseError as exc:
            # e.g. NOGROUP after Redis lost its data: the read loop creates the group again
            self._failed += 1
            log.warning("lease renewal refused: %s", exc)
            return {}
        self._renewals += 1
        verdict = dict(zip(keys, results, strict=True))
        self._gone_seen &= set(keys)
        gone_before, self._gone_once = self._gone_once, set()
        for key, result in verdict.items():
            if result == RENEWED:
                self._renewed += 1
            elif result == TAKEN:
                self._taken += 1
                self._give_up(key)
            elif key not in gone_before:
                # Acked by our finisher while this call ran (it settles the entry just after)?
                # Only an entry still held and still gone at the next renewal is reported.
                self._gone_once.add(key)
            elif key not in self._gone_seen:
                self._gone += 1
                self._gone_seen.add(key)
                log.warning("lease: entry %s of %s is gone from the stream; its task runs on", key[1], key[0])
        return verdict

    def _give_up(self, key: tuple[str, str]) -> None:
        """Another consumer owns this entry now: stop our copy; it writes and acks nothing."""
        for run in list(self.book.running.values()):
            if run.claimed.entry.key == key:
                log.warning(
                    "lease lost: entry %s was taken by another executor; this copy stops and writes nothing",
                    key[1],
                    extra=run.claimed.log_extra(),
                )
                self.book.stop(run.claimed.task_id, STOP_LOST, run.claimed.attempt)
                return
        # Not running (waiting for a slot, or finished and waiting for its ack): no longer ours.
        # An ack of it would find another owner and change nothing.
        log.info("lease lost: entry %s was taken by another executor before it ran", key[1])
