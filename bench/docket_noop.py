"""Docket's no-op drain, for bench/dispatch.py: ``python -m bench.docket_noop N CONCURRENCY``.

Enqueues N no-op tasks, then drains them with one Worker (5 ms check interval) and prints
tasks/s measured from the first task's start to the last one's, the same span the executor
figure uses.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from datetime import timedelta

import redis
from docket import Docket, Worker

STARTS: list[float] = []


async def noop() -> None:
    STARTS.append(time.perf_counter())


async def main(n: int, concurrency: int) -> float:
    url = os.environ.get("INGEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    name = f"bench-docket-{uuid.uuid4().hex[:8]}"
    async with Docket(name=name, url=url) as docket:
        docket.register(noop)
        for _ in range(n):
            await docket.add(noop)()
        async with Worker(
            docket,
            concurrency=concurrency,
            minimum_check_interval=timedelta(milliseconds=5),
            scheduling_resolution=timedelta(milliseconds=5),
        ) as worker:
            await worker.run_until_finished()
    client = redis.Redis.from_url(url)
    for key in list(client.scan_iter(match=f"{name}*", count=1000)):
        client.delete(key)
    client.close()
    # The last start, not the worker's exit: its shutdown is not drain time (a no-op ends at once).
    return len(STARTS) / max(STARTS[-1] - STARTS[0], 1e-3)


if __name__ == "__main__":
    print(asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]))))
