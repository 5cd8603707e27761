"""The executor daemon: owns the one nursery (collector, runners, finisher, progress, cancel, heartbeat)."""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import uuid
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Any

import trio

from db.config import Settings
from db.database import init_database
from db.keys import Keys
from db.streams import RETRYABLE_REDIS_ERRORS, Streams, connect, slot_ms_for
from executor.book import STOP_HANDBACK, Book, Claimed
from executor.cancel import CancelWatcher
from executor.claim import ClaimRules
from executor.collector import Collector
from executor.context import ExecutorEnv, Limiters
from executor.finisher import Finisher
from executor.health import Health
from executor.heartbeat import Heartbeat
from executor.leases import LeaseKeeper
from executor.metrics import for_settings as metrics_for
from executor.outage import Outage, RefusalAwareProbe
from executor.progress import ProgressBook, ProgressFlusher
from executor.reconciler import Reconciler
from executor.recycle import Recycler
from executor.router import Router, build_router
from executor.runner import Counters, RetryPolicy, Runner
from executor.strikes import StrikeBook
from executor.sweeper import Sweeper
from executor.tracing import Tracing
from executor.tracing import for_settings as tracing_for
from ingest import vectors

log = logging.getLogger("executor.daemon")

HANDBACK_WAIT_S = 10.0  # after the grace period: for cancelled runs to settle
FINISH_WAIT_S = 10.0  # for the last terminal writes and acks
TEARDOWN_WAIT_S = 5.0  # for the heartbeat release and the connections' close


@dataclass(frozen=True)
class DaemonStatistics:
    running: int
    started: int
    done: int
    failed: int
    retried: int
    timed_out: int
    cancelled: int
    handed_back: int
    lost: int
    dead_lettered: int
    reads: int
    draining: bool


class _RunningHere(Container[str]):
    """The tasks this process runs, read live by the claim's thread (not a snapshot taken before
    its read): a run another hop started meanwhile, and one whose outcome waits for its terminal
    write (its row still running here), are both this executor's. A second entry of such a task
    is acked as a duplicate, never claimed again under a new attempt beside the run."""

    def __init__(self, book: Book, finisher: Finisher) -> None:
        self._book, self._finisher = book, finisher

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, str) and (task_id in self._book.running or self._finisher.holds(task_id))


class Daemon:
    """One executor process's work. ``await nursery.start(daemon.run)`` returns once the consumer
    group exists and the heartbeat is written; ``request_stop()`` drains and returns."""

    def __init__(
        self,
        settings: Settings,
        consumer: str,
        *,
        handle_signals: bool = False,
        retry_policy: RetryPolicy | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.consumer = consumer
        self.keys = Keys(settings.key_prefix)
        self.handle_signals = handle_signals
        self.retry_policy = retry_policy or RetryPolicy()
        self.instance = uuid.uuid4().hex
        self.book = Book(settings.max_concurrent_tasks)
        self.progress = ProgressBook()
        self.counters = Counters()
        self.redis_outage = Outage("redis")
        self.db_outage = Outage("database")
        self.metrics = metrics_for(settings.metrics_port, consumer)
        self.redis_outage.on_failure = self.metrics.redis_disruption
        self.db_outage.on_failure = self.metrics.db_disruption
        self.tracing = tracing or tracing_for(settings.tracing, ratio=settings.trace_ratio)
        self.health = Health(consumer, settings)
        # PING answers on a full Redis or a replica: the verdict also says when Redis refuses writes
        self.health.probes["redis"] = RefusalAwareProbe(outage=self.redis_outage)
        self.draining = False
        self._stop = trio.Event()
        self._grace: trio.CancelScope | None = None
        self._hurry = False
        self._voluntary = False  # a recycle: running tasks finish, no grace period
        self._nursery: trio.Nursery | None = None
        self._heartbeat_claimed = False

    # -- control -----------------------------------------------------------------------------
    def request_stop(self, *, hurry: bool = False, voluntary: bool = False) -> None:
        """Stop reading, let running tasks finish within the grace period, hand back the rest.
        ``hurry`` skips what is left of the grace period. ``voluntary`` (recycling) lets running
        tasks finish however long they take (their task timeout bounds them): a hand-back counts
        toward the delivery cap, and a recycling fleet must not bury its long tasks. A stop
        asked for later (SIGTERM) gives them the usual grace from then on."""
        if voluntary:
            if not self._stop.is_set():
                self._voluntary = True
                self._stop.set()
            return
        if self._voluntary and self._grace is not None:
            self._grace.deadline = min(
                self._grace.deadline, trio.current_time() + self.settings.shutdown_grace_s
            )
        self._voluntary = self.health.recycling = False
        self._stop.set()
        if hurry:
            self._hurry = True
            if self._grace is not None:
                self._grace.cancel()

    def statistics(self) -> DaemonStatistics:
        c = self.counters
        return DaemonStatistics(
            running=len(self.book.running),
            started=c.started,
            done=c.done,
            failed=c.failed,
            retried=c.retried,
            timed_out=c.timed_out,
            cancelled=c.cancelled,
            handed_back=c.handed_back,
            lost=c.lost,
            dead_lettered=self.finisher.dead_lettered if hasattr(self, "finisher") else 0,
            reads=self.collector.reads if hasattr(self, "collector") else 0,
            draining=self.draining,
        )

    def figures(self) -> dict[str, Any]:
        """This executor's part of the heartbeat."""
        return {
            "running": self.book.running_ids(),
            "done": self.counters.done,
            "failed": self.counters.failed,
            "draining": self.draining,
            "task_types": self.router.task_types if hasattr(self, "router") else [],
            "max_concurrent_tasks": self.settings.max_concurrent_tasks,
            "health": self.health.summary(),
            "heartbeat_s": self.settings.heartbeat_s,
        }

    # -- run -----------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
        with self._signal_receiver() as signals:
            log.info("executor %s starting", self.consumer)
            try:
                if not await self._start_up(signals):
                    return
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self._start_loops(nursery, signals)
                    collected = trio.Event()
                    nursery.start_soon(self._collect, collected)
                    log.info(
                        "executor %s ready: task types %s", self.consumer, ", ".join(self.router.task_types)
                    )
                    task_status.started(self)
                    await self._stop.wait()
                    await self._shutdown(collected)
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(TEARDOWN_WAIT_S):
                    # abandoned, not waited for, if it outlasts the bound (a close that hangs on
                    # an unreachable server must not keep the process from exiting)
                    await trio.to_thread.run_sync(self._teardown, abandon_on_cancel=True)
                log.info("executor %s exiting", self.consumer)

    async def _start_up(self, signals: Any) -> bool:
        """:meth:`_setup`, which may wait for ever for Redis or the database (unreachable, or
        refusing the password): a signal or :meth:`request_stop` ends it at any point, with a
        line that says what it was waiting for. False when it was stopped."""
        stopped = False
        error: Exception | None = None
        async with trio.open_nursery() as nursery:

            async def until_stopped() -> None:
                nonlocal stopped
                await self._stop.wait()
                stopped = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_stopped)
            if signals is not None:
                nursery.start_soon(self._signal_during_start_up, signals)
            try:
                await self._setup()
            except Exception as exc:  # raised below, as it is (a nursery would wrap it in a group)
                error = exc
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        return not stopped

    async def _signal_during_start_up(self, signals: Any) -> None:
        async for signum in signals:
            waiting = []
            for o in (self.redis_outage, self.db_outage):
                if o.active:
                    said = f" ({o.refused})" if o.refused else ""  # e.g. Redis is full (maxmemory)
                    waiting.append(f"waiting for {o.service}: {o.failures} failed call(s){said}")
            log.info(
                "%s during start-up: stopping (%s)",
                signal.Signals(signum).name,
                "; ".join(waiting) or "nothing was being waited for",
            )
            self.request_stop()
            return

    async def _setup(self) -> None:
        s = self.settings
        self._serve()
        self.limiters = Limiters.for_settings(s)
        await trio.to_thread.run_sync(init_database, s.db_url)
        vectors.use(s)  # the store chunk writes and removals go to (opened at its first use)
        self.redis = connect(s)
        self.streams = Streams(self.redis, self.keys, slot_ms=slot_ms_for(s))
        metrics = self.metrics if self.metrics.enabled else None
        self.env = ExecutorEnv(s, self.limiters, self.consumer, self.redis, self.keys, metrics=metrics)
        self.router: Router = build_router(self.env, s.extra_handlers)
        self.metrics.declare(self.router.task_types)
        self.heartbeat = Heartbeat(self.redis, self.keys, self.consumer, s, self.instance)
        await self._until_redis_answers(self.heartbeat.claim_name, self.figures())
        self._heartbeat_claimed = True
        await self._until_redis_answers(self.streams.ensure_group)
        self.finisher = Finisher(
            self.streams,
            self.consumer,
            self.limiters,
            self.book,
            self.db_outage,
            self.redis_outage,
            results_ttl_s=s.results_ttl_s,
        )
        self.runner = Runner(
            self.env, self.router, self.book, self.progress, self.finisher, self.retry_policy, self.counters
        )
        self.collector = Collector(
            s,
            self.consumer,
            self.streams,
            self.limiters,
            self.book,
            self.finisher,
            self._claim_rules,
            self._spawn,
            self._background,
            (self.redis_outage, self.db_outage),
        )
        self.finisher.metrics = self.collector.metrics = self.runner.metrics = self.metrics
        self.finisher.on_lost = self.collector.recheck_soon
        self.runner.tracing = self.tracing
        self._reliability_loops(s)
        self.strikes = StrikeBook(
            self.redis, self.keys, self.limiters, (self.redis_outage, self.db_outage), self.metrics.strikes
        )
        await self.strikes.start()  # before the first read

    def _serve(self) -> None:
        """The health probes, and the metrics and health endpoints where their ports are set."""
        s = self.settings
        self.health.start_probes()
        if s.metrics_port:
            self.metrics.serve(s.metrics_port, s.metrics_host)
            self.health.ports["metrics"] = self.metrics.statistics
        if s.healthcheck_port:
            self.health.serve(s.healthcheck_port, s.healthcheck_host)

    def _reliability_loops(self, s: Settings) -> None:
        """Leases, reclaim sweeps, the reconciler and recycling (started with the other loops)."""
        self.leases = LeaseKeeper(
            self.streams,
            self.consumer,
            self.book,
            self.limiters,
            self.redis_outage,
            LeaseKeeper.interval_for(s.redelivery_timeout_s),
        )
        self.sweeper = Sweeper(
            s,
            self.consumer,
            self.streams,
            self.book,
            self.limiters,
            self.redis_outage,
            self.collector.dispatch,
        )
        self.reconciler = Reconciler(s, self.streams, self.limiters, self.db_outage, self.redis_outage)
        self.collector.on_limits_missing = self.reconciler.limits_missing
        self.reconciler.before_limits_copy = self.leases.renew_for_a_loss
        self.recycler = Recycler(
            s.max_tasks_per_child,
            s.max_rss_mb,
            self.counters,
            functools.partial(self.request_stop, voluntary=True),
            changed=self.book.wait_changed,
        )

    async def _until_redis_answers(self, fn: Any, *args: Any) -> None:
        """Start-up writes: retried while Redis is away or refuses writes (a crash would only
        make entrypoint.sh start the process again, and again); a stop abandons the call in
        flight (a connect to a host that never answers takes seconds, and nothing waits on its
        result)."""
        while True:
            try:
                await trio.to_thread.run_sync(
                    fn, *args, limiter=self.limiters.redis_limiter, abandon_on_cancel=True
                )
            except RETRYABLE_REDIS_ERRORS as exc:
                await self.redis_outage.backoff(exc)
                continue
            self.redis_outage.ok(wrote=True)
            return

    def _start_loops(self, nursery: trio.Nursery, signals: Any) -> None:
        flusher = ProgressFlusher(
            self.progress, self.limiters, self.settings.progress_interval_s, self.db_outage, self._on_lost
        )
        self.flusher = flusher
        nursery.start_soon(
            self.heartbeat.run, self.limiters, self.redis_outage, self.figures, self._name_lost
        )
        nursery.start_soon(flusher.run)
        nursery.start_soon(self.finisher.run)
        nursery.start_soon(CancelWatcher(self.book, self.limiters, self.redis, self.keys).run)
        nursery.start_soon(self.leases.run)
        nursery.start_soon(self.sweeper.run, self.collector.taken_over)
        nursery.start_soon(self.reconciler.run)
        nursery.start_soon(self.recycler.run)
        nursery.start_soon(self.health.ticker)
        nursery.start_soon(self.strikes.run)
        nursery.start_soon(self.metrics.refresh, self.limiters, self.redis, self.keys)
        if signals is not None:
            nursery.start_soon(self._watch_signals, signals)

    async def _collect(self, collected: trio.Event) -> None:
        try:
            await self.collector.run()
        finally:
            collected.set()

    def _spawn(self, claimed: Claimed, committed: bool = True) -> None:
        self._background(self.runner.run, self.book.start(claimed, committed))

    def _background(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None  # noqa: S101  narrows the type: run() sets it before any spawn
        self._nursery.start_soon(fn, *args)

    def _name_lost(self) -> None:
        """Another process holds this consumer name: stop at once, handing back what runs."""
        self._heartbeat_claimed = False  # the key is the other process's now: not ours to delete
        self.request_stop(hurry=True)

    def _on_lost(self, task_id: str, reason: str, attempt: int) -> None:
        self.book.stop(task_id, reason, attempt)

    def _claim_rules(self) -> ClaimRules:
        return ClaimRules(
            consumer=self.consumer,
            task_types=frozenset(self.router.task_types),
            max_deliveries=self.settings.max_deliveries,
            running_ids=_RunningHere(self.book, self.finisher),
            live_owners=self._live_owners,
            strikes=self.strikes.rules,
        )

    def _live_owners(self, owners: list[str]) -> set[str]:
        """Consumers among ``owners`` whose heartbeat key exists (blocking; called in the claim)."""
        values = self.redis.mget([self.keys.executor(o) for o in owners])
        return {o for o, v in zip(owners, values, strict=True) if v is not None}

    # -- shutdown ----------------------------------------------------------------------------------
    async def _shutdown(self, collected: trio.Event) -> None:
        self.health.recycling = self._voluntary
        self.draining = self.health.draining = True
        grace = self.settings.task_timeout_s if self._voluntary else self.settings.shutdown_grace_s
        log.info(
            "draining: stop reading, %d task(s) running, %s",
            len(self.book.running),
            "running tasks finish (recycling)" if self._voluntary else f"grace {grace:g} s",
        )
        self.collector.stop()
        with trio.move_on_after(0 if self._hurry else grace) as self._grace:  # from the stop request
            await collected.wait()
            await self.book.wait_idle()
        # the read loop ends soon whatever still runs; once it has, no run starts after the hand-back
        await collected.wait()
        if self.book.running:
            log.info("grace period over: handing back %d task(s)", len(self.book.running))
            for task_id in self.book.running_ids():
                self.book.stop(task_id, STOP_HANDBACK)
            with trio.move_on_after(HANDBACK_WAIT_S):
                await self.book.wait_idle()
        with trio.move_on_after(FINISH_WAIT_S):
            await self.finisher.drain()
        log.info(
            "drained: %d done, %d failed, %d handed back",
            self.counters.done,
            self.counters.failed,
            self.counters.handed_back,
        )

    @contextlib.contextmanager
    def _signal_receiver(self) -> Iterator[Any]:
        if not self.handle_signals:
            yield None
            return
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as receiver:
            yield receiver

    async def _watch_signals(self, receiver: Any) -> None:
        async for signum in receiver:
            name = signal.Signals(signum).name
            if not self._stop.is_set():
                log.info("%s: draining", name)
                self.request_stop()
            else:
                log.info("%s again: handing back what still runs", name)
                self.request_stop(hurry=True)

    def _teardown(self) -> None:
        if self._heartbeat_claimed:
            with contextlib.suppress(Exception):
                self.heartbeat.release()
        if hasattr(self, "collector"):
            self.collector.close()
        if hasattr(self, "redis"):
            self.redis.close()
        self.metrics.close()
        self.health.close()
