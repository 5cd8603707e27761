"""``python -m bench.stamped_executor NAME``: an executor whose idle-start steps are stamped with
the wall clock, for ``bench.start_steps``.

It wraps, before the executor starts, the functions one read-and-claim hop goes through: the
fair gate's dispatch script (``Gate.dispatch``), the validating SELECT (``claim.fetch_rows``),
the claim UPDATE (``claim._claim``), the hop into the trio thread (``Collector._start``) and the
run's start (``Runner.run``). Each call appends ``(step, began_ms, ended_ms)`` to a list (a
list's append is atomic under the GIL, whichever thread calls), written as JSON to
``BENCH_STAMPS_FILE`` when the executor returns. The wrappers cost a few microseconds a call;
nothing else changes."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

STAMPS: list[tuple[str, float, float]] = []


def _stamped(step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.time() * 1000
        try:
            return fn(*args, **kwargs)
        finally:
            STAMPS.append((step, began, time.time() * 1000))

    return wrapper


def _stamped_async(step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.time() * 1000
        STAMPS.append((step, began, began))  # its start is what counts: the run lasts the task
        return await fn(*args, **kwargs)

    return wrapper


def install() -> None:
    from db.gate import Gate
    from executor import claim
    from executor.collector import Collector
    from executor.runner import Runner

    Gate.dispatch = _stamped("dispatch", Gate.dispatch)  # type: ignore[method-assign]
    claim.fetch_rows = _stamped("select", claim.fetch_rows)
    claim._claim = _stamped("update", claim._claim)
    Collector._start = _stamped("trio_start", Collector._start)  # type: ignore[method-assign]
    Runner.run = _stamped_async("runner", Runner.run)  # type: ignore[method-assign]


def main() -> int:
    install()
    from executor.cli import main as executor_main

    try:
        return executor_main()
    finally:
        with open(os.environ["BENCH_STAMPS_FILE"], "wb") as out:
            out.write(orjson.dumps(STAMPS))


if __name__ == "__main__":
    sys.exit(main())
