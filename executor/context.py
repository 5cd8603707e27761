"""What a handler is given: the claimed task, its context, limiters and a progress callback."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
import trio

from db.config import Settings
from db.database import connection, unit
from db.keys import Keys
from db.streams import Entry

T = TypeVar("T")


@dataclass(frozen=True)
class Limiters:
    """Named capacity limiters: every blocking call runs in a thread under one of these."""

    task_limiter: trio.CapacityLimiter
    db_limiter: trio.CapacityLimiter
    redis_limiter: trio.CapacityLimiter
    embed_limiter: trio.CapacityLimiter

    @classmethod
    def for_settings(cls, settings: Settings) -> Limiters:
        return cls(
            task_limiter=trio.CapacityLimiter(settings.max_concurrent_tasks),
            db_limiter=trio.CapacityLimiter(8),
            redis_limiter=trio.CapacityLimiter(8),
            embed_limiter=trio.CapacityLimiter(1),
        )

    async def db(self, fn: Callable[..., T], *args: Any, abandon_on_cancel: bool = False) -> T:
        """Run ``fn(*args)`` in a thread inside one connection + transaction
        (``abandon_on_cancel`` as for :meth:`db_connection`)."""

        def work() -> T:
            with unit():
                return fn(*args)

        return await trio.to_thread.run_sync(
            work, limiter=self.db_limiter, abandon_on_cancel=abandon_on_cancel
        )

    async def db_connection(self, fn: Callable[..., T], *args: Any, abandon_on_cancel: bool = False) -> T:
        """Run ``fn(*args)`` in a thread on one pooled connection, statements autocommitting;
        for a unit whose only write is one statement (``fn`` opens ``atomic()`` where it needs).
        ``abandon_on_cancel``: a cancel returns at once, the thread runs on unwatched (for a call
        whose outcome the caller can afford to lose, as a SIGKILL would)."""

        def work() -> T:
            with connection():
                return fn(*args)

        return await trio.to_thread.run_sync(
            work, limiter=self.db_limiter, abandon_on_cancel=abandon_on_cancel
        )

    async def redis(self, fn: Callable[..., T], *args: Any, abandon_on_cancel: bool = False) -> T:
        """Run ``fn(*args)`` in a thread (``abandon_on_cancel`` as for :meth:`db_connection`)."""
        return await trio.to_thread.run_sync(
            fn, *args, limiter=self.redis_limiter, abandon_on_cancel=abandon_on_cancel
        )


@dataclass
class TaskResult:
    """What a handler may return; the finisher writes it with the terminal state."""

    message: str = ""  # the last line on the row, e.g. "42 chunks in 3.1 s"
    chunk_ids: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. a debug run's outputs


@dataclass
class TaskContext:
    """One claimed task as a handler sees it."""

    task_id: str
    task_type: str
    attempt: int
    consumer: str
    row: dict[str, Any]  # the task row as claimed
    doc: dict[str, Any] | None  # its document row, if any
    kb: dict[str, Any] | None  # its knowledge base row, if any
    message: dict[str, Any]  # the stream message (extra fields for memory / dataflow)
    entry: Entry
    settings: Settings
    limiters: Limiters
    progress: Callable[[float | None, str], None]  # (fraction or None, message line); never blocks
    resources: dict[str, Any] = field(default_factory=dict)  # executor-wide shared objects

    def report(self, fraction: float | None = None, msg: str = "") -> None:
        """Record progress; the executor writes it to the row (throttled, monotonic, fenced)."""
        self.progress(fraction, msg)


@dataclass
class ExecutorEnv:
    """What a handler factory gets once per executor process (``make_handler(env)``)."""

    settings: Settings
    limiters: Limiters
    consumer: str
    redis: redis.Redis
    keys: Keys
    resources: dict[str, Any] = field(default_factory=dict)  # shared objects (e.g. the embedder)
    metrics: Any = None  # executor.metrics.Metrics, or None (handlers record through it if set)
