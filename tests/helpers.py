"""Helpers for tests: polling instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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


async def await_until(predicate: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.05) -> T:
    """``wait_until`` for trio tests; the predicate runs in a thread (it may block)."""
    with trio.fail_after(timeout_s):
        while True:
            value = await trio.to_thread.run_sync(predicate)
            if value:
                return value
            await trio.sleep(interval_s)
