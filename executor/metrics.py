"""Prometheus metrics of one executor process: its own registry, served on ``INGEST_METRICS_PORT``.

Counters (exposed with ``_total``), labelled ``executor`` and ``task_type``:
``ingest_tasks_started`` (a slot taken), ``_succeeded``, ``_failed`` (timeouts included),
``_retried`` (each retry in place), ``_dead_lettered``, ``_stricken`` (held by a strike),
``_cancelled``, ``_timed_out``, ``_handed_back``. Histograms ``ingest_task_duration_seconds``
and ``ingest_task_start_latency_seconds`` (publish to start: the publish time is that of the
tenant backlog's entry, whose id the gate copies into the admitted entry's ``published`` field, or
for an entry put on a priority stream directly, its own id's). Gauges ``ingest_tasks_running``;
fleet-wide figures each executor reports as it sees them, refreshed off the hot path every few
seconds in one pipelined call after the gate's tenants are listed: ``ingest_queue_depth`` (entries
in the priority stream, waiting or pending, plus those waiting in the backlogs of the tenants at
the gate) and ``ingest_pending`` (read, not yet acked) per ``priority``, ``ingest_dead_letters``;
``ingest_strikes_in_effect``. Counters
``ingest_redis_disruptions`` and ``ingest_db_disruptions`` (failed calls that were then
retried), ``ingest_chunks_embedded``, ``ingest_embed_seconds``; histogram ``ingest_embed_batch_size``.
Never a task id as a label. The per-task series are plain numbers that only the trio thread
writes (an increment is an attribute add, no lock), exposed by a collector at scrape time; the
rest are prometheus-client's own.

With the port at 0 the daemon uses :data:`NO_METRICS`, whose methods do nothing.
"""

from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import redis
import trio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from db.gate import Gate
from db.keys import Keys
from executor.serving import ServingStatistics, SmallServer

log = logging.getLogger("executor.metrics")

REFRESH_S = 5.0
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 10800)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
COUNTERS = (
    ("started", "Tasks that began running (a slot taken)"),
    ("succeeded", "Tasks whose handler returned"),
    ("failed", "Tasks that failed (their handler raised, or they timed out)"),
    ("retried", "Retries in place after a retryable error"),
    ("dead_lettered", "Messages moved to the dead-letter stream"),
    ("stricken", "Tasks held by a strike rule instead of run"),
    ("cancelled", "Running tasks stopped by a cancel request"),
    ("timed_out", "Tasks that ran past the task timeout (also counted as failed)"),
    ("handed_back", "Running tasks handed back to their stream at shutdown"),
)
COUNTER_NAMES = tuple(name for name, _ in COUNTERS)
OUTCOME_COUNTER = {
    "done": "succeeded",
    "failed": "failed",
    "cancel": "cancelled",
    "handback": "handed_back",
}  # finisher outcome kinds; "lost" counts nowhere


def entry_time_s(entry_id: str) -> float | None:
    """The time a stream entry was added (its id's milliseconds), in seconds since the epoch."""
    head = entry_id.partition("-")[0]
    return int(head) / 1000.0 if head.isdigit() else None


class _TypeSeries:
    """One task type's counters, running count and histograms as plain numbers, written by the
    trio thread only (no lock: an increment is an attribute add) and read at scrape time."""

    __slots__ = ("counts", "running", "duration", "duration_sum", "latency", "latency_sum")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(COUNTER_NAMES, 0)
        self.running = 0
        self.duration = [0] * (len(DURATION_BUCKETS) + 1)  # per bucket, the last one +Inf
        self.duration_sum = 0.0
        self.latency = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0


def _histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    bounds: tuple[float, ...],
    counts: list[int],
    total: float,
) -> None:
    buckets, running = [], 0
    for bound, count in zip((*bounds, math.inf), counts, strict=True):
        running += count
        buckets.append((floatToGoString(bound), running))
    family.add_metric(labels, buckets, total)


class _TaskSeriesCollector:
    """Exposes every :class:`_TypeSeries` of a :class:`Metrics` (prometheus-client's custom collector)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        m = self.metrics
        series = list(m._types.items())  # a snapshot: the trio thread may add a type meanwhile
        by_type = ["executor", "task_type"]
        for name, text in COUNTERS:
            family = CounterMetricFamily(f"ingest_tasks_{name}", text, labels=by_type)
            for task_type, s in series:
                family.add_metric([m.consumer, task_type], s.counts[name])
            yield family
        running = GaugeMetricFamily("ingest_tasks_running", "Tasks running now", labels=by_type)
        duration = HistogramMetricFamily(
            "ingest_task_duration_seconds", "Time from a task's start to its end", labels=by_type
        )
        latency = HistogramMetricFamily(
            "ingest_task_start_latency_seconds",
            "Time from a task's publish (its backlog entry) to its start",
            labels=by_type,
        )
        for task_type, s in series:
            labels = [m.consumer, task_type]
            running.add_metric(labels, s.running)
            _histogram(duration, labels, DURATION_BUCKETS, list(s.duration), s.duration_sum)
            _histogram(latency, labels, LATENCY_BUCKETS, list(s.latency), s.latency_sum)
        yield running
        yield duration
        yield latency


class Metrics:
    """This executor's series in a registry of its own; cheap to update from the trio thread."""

    enabled = True

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_TaskSeriesCollector(self))
        by_prio = ("executor", "priority")
        self.queue_depth = Gauge(
            "ingest_queue_depth",
            "Entries in a priority stream (waiting or pending) and waiting in its tenants' backlogs",
            by_prio,
            registry=r,
        )
        self.pending = Gauge(
            "ingest_pending", "Entries of a priority stream read and not yet acked", by_prio, registry=r
        )
        mine = ("executor",)
        self.dead_letters = Gauge(
            "ingest_dead_letters", "Entries in the dead-letter stream", mine, registry=r
        ).labels(consumer)
        self.strikes_in_effect = Gauge(
            "ingest_strikes_in_effect", "Active strike rules this executor applies", mine, registry=r
        ).labels(consumer)
        self.redis_disruptions = Counter(
            "ingest_redis_disruptions", "Redis calls that failed and were retried", mine, registry=r
        ).labels(consumer)
        self.db_disruptions = Counter(
            "ingest_db_disruptions", "Database calls that failed and were retried", mine, registry=r
        ).labels(consumer)
        self.chunks_embedded = Counter(
            "ingest_chunks_embedded", "Chunks (texts) embedded", mine, registry=r
        ).labels(consumer)
        self.embed_seconds = Counter(
            "ingest_embed_seconds",
            "Wall seconds the encoder spent in encode calls (its rate is the encoder's busy fraction)",
            mine,
            registry=r,
        ).labels(consumer)
        self.embed_batch = Histogram(
            "ingest_embed_batch_size", "Texts per embedding call", mine, buckets=BATCH_BUCKETS, registry=r
        ).labels(consumer)
        self._types: dict[str, _TypeSeries] = {}
        self._known: frozenset[str] = frozenset()
        self._server: SmallServer | None = None
        self._gate: Gate | None = None  # for the queue depth: the tenants at the gate

    # -- series per task type -----------------------------------------------------------------
    def _of(self, task_type: str) -> _TypeSeries:
        series = self._types.get(task_type)
        if series is None:
            series = self._types[task_type] = _TypeSeries()
        return series

    def declare(self, task_types: list[str]) -> None:
        """Create every task type's series at 0, so rates start from the first scrape."""
        for task_type in task_types:
            self._of(task_type)
        self._known = frozenset(task_types)

    # -- events (the trio thread only: plain adds) -----------------------------------------------
    def task_started(self, task_type: str, published_id: str) -> None:
        """``published_id``: the id whose time is the task's publish (``Entry.published``, the
        backlog entry's, or the entry's own for one put on a priority stream directly)."""
        s = self._of(task_type)
        s.counts["started"] += 1
        s.running += 1
        published = entry_time_s(published_id)
        if published is not None:
            latency = max(0.0, time.time() - published)
            s.latency[bisect_left(LATENCY_BUCKETS, latency)] += 1
            s.latency_sum += latency

    def task_left_slot(self, task_type: str) -> None:
        self._of(task_type).running -= 1

    def task_ended(self, task_type: str, kind: str, duration_s: float) -> None:
        """``kind``: the finisher's outcome kind (done, failed, cancel, handback, lost)."""
        s = self._of(task_type)
        counter = OUTCOME_COUNTER.get(kind)
        if counter is not None:
            s.counts[counter] += 1
        s.duration[bisect_left(DURATION_BUCKETS, duration_s)] += 1
        s.duration_sum += duration_s

    def task_timed_out(self, task_type: str) -> None:
        self._of(task_type).counts["timed_out"] += 1

    def task_retried(self, task_type: str) -> None:
        self._of(task_type).counts["retried"] += 1

    def tasks_stricken(self, task_types: list[str]) -> None:
        for task_type in task_types:
            self._of(task_type).counts["stricken"] += 1

    def dead_lettered(self, task_type: str) -> None:
        """A junk message names any type it likes: only this executor's types get a series."""
        known = task_type in self._known
        self._of(task_type if known else "unknown").counts["dead_lettered"] += 1

    def redis_disruption(self) -> None:
        self.redis_disruptions.inc()

    def db_disruption(self) -> None:
        self.db_disruptions.inc()

    def embedded(self, texts: int, seconds: float = 0.0) -> None:
        self.chunks_embedded.inc(texts)
        self.embed_seconds.inc(seconds)
        self.embed_batch.observe(texts)

    def strikes(self, count: int) -> None:
        self.strikes_in_effect.set(count)

    # -- serving ------------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``addr:port`` from one thread (:mod:`executor.serving`: bounded,
        slow clients cut; prometheus-client's own server holds a thread per connection)."""
        self._server = SmallServer(addr, port, self._route, name="metrics-http")
        log.info("metrics on http://%s:%d/metrics", addr, port)

    def _route(self, path: str) -> tuple[int, str, bytes]:
        if path not in ("/", "/metrics"):
            return 404, "text/plain", b"not found: GET /metrics\n"
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def statistics(self) -> ServingStatistics | None:
        """What the metrics port could not serve; None when it is not served."""
        return self._server.statistics() if self._server is not None else None

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    # -- fleet-wide gauges ----------------------------------------------------------------------
    def stream_figures(self, client: redis.Redis, keys: Keys) -> None:
        """XLEN and the XPENDING summary of every priority stream, XLEN of the backlogs of the
        tenants at the gate (waiting work sits there until admitted) and XLEN of the dead letters,
        in one pipelined round trip after the gate's tenants are listed (blocking; call in a thread)."""
        if self._gate is None or self._gate.client is not client or self._gate.keys != keys:
            self._gate = Gate(client, keys)
        tenants = self._gate.tenants_at_gate()
        pipe = client.pipeline(transaction=False)
        for stream in keys.queues:
            priority = keys.priority_of(stream)
            pipe.xlen(stream)
            pipe.xpending(stream, keys.group)
            for tenant in tenants:
                pipe.xlen(keys.backlog(priority, tenant))
        pipe.xlen(keys.dead)
        replies = pipe.execute(raise_on_error=False)
        per_stream = 2 + len(tenants)
        for n, stream in enumerate(keys.queues):
            prio = str(keys.priority_of(stream))
            length, pending, *backlogs = replies[per_stream * n : per_stream * (n + 1)]
            if isinstance(length, int):
                waiting = sum(b for b in backlogs if isinstance(b, int))
                self.queue_depth.labels(self.consumer, prio).set(length + waiting)
            if isinstance(pending, dict):
                self.pending.labels(self.consumer, prio).set(int(pending.get("pending") or 0))
        if isinstance(replies[-1], int):
            self.dead_letters.set(replies[-1])

    async def refresh(
        self, limiters: Any, client: redis.Redis, keys: Keys, interval_s: float = REFRESH_S
    ) -> None:
        """Refresh the stream gauges every ``interval_s``; an unreachable Redis skips a round."""
        while True:
            try:
                await limiters.redis(self.stream_figures, client, keys)
            except redis.RedisError as exc:
                log.debug("stream gauges not refreshed: %s", exc)
            await trio.sleep(interval_s)


class NoMetrics:
    """The same interface, doing nothing (``INGEST_METRICS_PORT`` 0)."""

    enabled = False
    registry = None

    def declare(self, task_types: list[str]) -> None:
        pass

    def task_started(self, task_type: str, published_id: str) -> None:
        pass

    def task_left_slot(self, task_type: str) -> None:
        pass

    def task_ended(self, task_type: str, kind: str, duration_s: float) -> None:
        pass

    def task_timed_out(self, task_type: str) -> None:
        pass

    def task_retried(self, task_type: str) -> None:
        pass

    def tasks_stricken(self, task_types: list[str]) -> None:
        pass

    def dead_lettered(self, task_type: str) -> None:
        pass

    def redis_disruption(self) -> None:
        pass

    def db_disruption(self) -> None:
        pass

    def embedded(self, texts: int, seconds: float = 0.0) -> None:
        pass

    def strikes(self, count: int) -> None:
        pass

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        pass

    def statistics(self) -> None:
        return None

    def close(self) -> None:
        pass

    async def refresh(
        self, limiters: Any, client: redis.Redis, keys: Keys, interval_s: float = REFRESH_S
    ) -> None:
        pass


NO_METRICS = NoMetrics()


def for_settings(metrics_port: int, consumer: str) -> Metrics | NoMetrics:
    return Metrics(consumer) if metrics_port else NO_METRICS
