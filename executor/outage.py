"""Outages of Redis or the database: one warning when one begins, one line when it ends, backoff.

Redis may also be up and refuse every write (a *refusal*): full under ``noeviction``, or a replica
behind a URL that named the master. The same backoff holds, with one line that says what Redis
said; reads still work then, so only a call that wrote ends it (``ok(wrote=True)``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
import trio

from executor.health import ProbeState

log = logging.getLogger("executor.outage")

# What each refusal means, in the words an operator acts on (db.streams counts them retryable).
REFUSALS: dict[type[Exception], str] = {
    redis.exceptions.OutOfMemoryError: "Redis is full (maxmemory)",
    redis.exceptions.ReadOnlyError: "Redis is a replica",
}


def refusal_of(exc: BaseException) -> str:
    """What a refused write means ("Redis is full (maxmemory)"), or "" for any other error."""
    return next((cause for cls, cause in REFUSALS.items() if isinstance(exc, cls)), "")


class Outage:
    """Shared by every loop that talks to one service, so an outage is logged once, with a count."""

    def __init__(self, service: str, *, base_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.service = service
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0  # failed calls in the current outage
        self.outages = 0  # outages seen since start
        self.refused = ""  # what the service said while it refuses writes ("" when it does not)
        self._began = 0.0
        self.on_failure: Callable[[], None] | None = None  # e.g. a disruption counter of the metrics

    @property
    def active(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        """Record a failed call; returns how long the caller should back off."""
        if self.on_failure is not None:
            self.on_failure()
        if self.failures == 0:
            self._began = time.monotonic()
            self.outages += 1
        refusal = refusal_of(exc)
        if refusal and refusal != self.refused:  # also when it follows a lost connection
            self.refused = refusal
            log.warning(
                "%s refuses writes: %s; backing off, running tasks go on: %s",
                self.service,
                refusal,
                _short(exc),
                extra={"refusal": refusal},
            )
        elif self.failures == 0:
            log.warning("%s unreachable, backing off: %s", self.service, _short(exc))
        self.failures += 1
        delay: float = min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 10))
        return delay * random.uniform(0.5, 1.0)

    async def backoff(self, exc: BaseException) -> None:
        await trio.sleep(self.failed(exc))

    def ok(self, *, wrote: bool = False, since: float | None = None) -> None:
        """Record a call that worked; ends the outage if one was on. While the service refuses
        writes, only a call that wrote (``wrote``) ends it: a read works on a full Redis too.
        ``since``: when the call began (``time.monotonic()``). One begun before the outage's
        first failure says nothing of now: calls run side by side, and one already past the
        server when it went returns after another one failed (the outage would end, and begin
        again, in a few ms)."""
        if self.refused and not wrote:
            return
        if self.failures and since is not None and since < self._began:
            return
        if self.failures:
            log.warning(
                "%s back after %d failed call(s) in %.1f s%s",
                self.service,
                self.failures,
                time.monotonic() - self._began,
                " (it accepts writes again)" if self.refused else "",
                extra={"failures": self.failures},
            )
            self.failures = 0
        self.refused = ""


@dataclass
class RefusalAwareProbe(ProbeState):
    """A health probe's state that also fails while ``outage`` refuses writes: ``PING`` answers on
    a full Redis or a replica, where this executor can do nothing (executor.health)."""

    outage: Outage | None = None

    def verdict(self, now: float, service: str) -> tuple[bool, str]:
        ok, why = super().verdict(now, service)
        if ok and self.outage is not None and self.outage.refused:
            return False, f"{service}: refuses writes: {self.outage.refused}"
        return ok, why


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 300 else text[:300] + "…"
