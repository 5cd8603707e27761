"""Outages of Redis or the database: one warning when one begins, one line when it ends, backoff."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import trio

log = logging.getLogger("executor.outage")


class Outage:
    """Shared by every loop that talks to one service, so an outage is logged once, with a count."""

    def __init__(self, service: str, *, base_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.service = service
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0  # failed calls in the current outage
        self.outages = 0  # outages seen since start
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
            log.warning("%s unreachable, backing off: %s", self.service, _short(exc))
        self.failures += 1
        delay: float = min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 10))
        return delay * random.uniform(0.5, 1.0)

    async def backoff(self, exc: BaseException) -> None:
        await trio.sleep(self.failed(exc))

    def ok(self) -> None:
        """Record a call that worked; ends the outage if one was on."""
        if self.failures:
            log.warning(
                "%s back after %d failed call(s) in %.1f s",
                self.service,
                self.failures,
                time.monotonic() - self._began,
                extra={"failures": self.failures},
            )
            self.failures = 0


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 300 else text[:300] + "…"
