"""Helpers for tests: polling instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s: {predicate}")
        time.sleep(interval_s)


def wait_while_progressing(
    count: Callable[[], int], target: int, stall_s: float, timeout_s: float, interval_s: float = 0.2
) -> None:
    """Poll ``count`` until it reaches ``target``; fail when it has not grown for ``stall_s`` (a
    hang) or after ``timeout_s`` in all. For long runs whose total time is the machine's, not
    the code's, to judge: a busy CI machine makes them slow, only a stall makes them wrong."""
    began = last_change = time.monotonic()
    last = -1
    while True:
        now_count = count()
        now = time.monotonic()
        if now_count >= target:
            return
        if now_count != last:
            last, last_change = now_count, now
        if now - last_change > stall_s:
            raise AssertionError(f"stalled at {now_count} of {target} for {stall_s} s")
        if now - began > timeout_s:
            raise AssertionError(f"{now_count} of {target} after {timeout_s} s")
        time.sleep(interval_s)


async def await_until(predicate: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.05) -> T:
    """``wait_until`` for trio tests; the predicate runs in a thread (it may block)."""
    with trio.fail_after(timeout_s):
        while True:
            value = await trio.to_thread.run_sync(predicate)
            if value:
                return value
            await trio.sleep(interval_s)


def admit(rclient: Any, keys: Any, consumer: str, count: int = 1000) -> list[tuple[str, str]]:
    """As an executor's read would: admit up to ``count`` entries through the fair gate into
    ``consumer``'s pending list; returns their (stream, entry id). The tenants' limits are
    copied into Redis first where the copy is not marked complete, as every executor does."""
    from db.database import connection
    from db.gate import Gate
    from ingest.tenants import copy_limits

    if not rclient.exists(keys.limits_mirrored):
        with connection():
            copy_limits(rclient, keys)
    got = Gate(rclient, keys).dispatch(
        keys.group, consumer, count, default_max_running=10**6, slot_ms=600_000
    )
    return [(stream, eid) for stream, entries in got.reply for eid, _ in entries]


def waiting(rclient: Any, keys: Any, tenants: tuple[str, ...] = ("default",)) -> int:
    """Entries of the priority streams plus the tenants' backlogs: what is yet to be acked."""
    total = sum(int(rclient.xlen(s)) for s in keys.queues)
    return total + sum(int(rclient.xlen(keys.backlog(p, t))) for p in (0, 1) for t in tenants)
