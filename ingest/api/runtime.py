"""What one server process shares: its settings, named limiters and the bounded Redis gate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import trio

from db.config import Settings
from db.database import init_database
from db.keys import Keys
from db.results import Results
from db.streams import connect

T = TypeVar("T")

DB_THREADS = 16  # below the peewee pool's 32 connections
REDIS_CONNECTIONS = 8  # the limiter and the blocking pool have this same size
SEARCH_THREADS = 4  # searches at once, each in a database thread (their query encodes: one at a time)
FILE_THREADS = 4  # reading uploaded files spooled to disk
REDIS_POOL_TIMEOUT_S = 10


def redis_client(settings: Settings, size: int) -> redis.Redis:
    """A client whose pool makes callers wait for a free connection instead of opening more."""
    return connect(settings, max_connections=size, pool_timeout_s=REDIS_POOL_TIMEOUT_S)


@dataclass
class Runtime:
    """Settings, limiters and the gated Redis client of one server process."""

    settings: Settings
    db_limiter: trio.CapacityLimiter
    redis_limiter: trio.CapacityLimiter
    search_limiter: trio.CapacityLimiter
    file_limiter: trio.CapacityLimiter
    redis_client: redis.Redis
    keys: Keys
    results: Results

    @classmethod
    def create(cls, settings: Settings) -> Runtime:
        """Build (no connection is made until the first call)."""
        init_database(settings.db_url, max_connections=2 * DB_THREADS)
        from ingest import vectors

        vectors.use(settings)
        client = redis_client(settings, REDIS_CONNECTIONS)
        keys = Keys(settings.key_prefix)
        return cls(
            settings=settings,
            db_limiter=trio.CapacityLimiter(DB_THREADS),
            redis_limiter=trio.CapacityLimiter(REDIS_CONNECTIONS),
            search_limiter=trio.CapacityLimiter(SEARCH_THREADS),
            file_limiter=trio.CapacityLimiter(FILE_THREADS),
            redis_client=client,
            keys=keys,
            results=Results(client, keys),
        )

    async def in_db(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking unit of database work (a domain call) in a thread, under ``db_limiter``."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.db_limiter)

    async def in_redis(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking call on the gated client in a thread, under ``redis_limiter``."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.redis_limiter)

    async def in_search(self, fn: Callable[..., T], *args: Any) -> T:
        """A search (load the model once, embed the query, read the store) in a database thread,
        under ``search_limiter``, taken first so that waiting searches hold no database slot.
        Searches overlap: only their query encodes take turns (``ingest.search``), so a slow
        one (a large knowledge base, a big ``k``) does not hold up another tenant's."""
        async with self.search_limiter:
            return await trio.to_thread.run_sync(fn, *args, limiter=self.db_limiter)

    async def read_file(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.file_limiter)

    def close(self) -> None:
        self.redis_client.close()
        self.redis_client.connection_pool.disconnect()
