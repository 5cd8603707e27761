"""What metrics and tracing cost an executor, measured in a loop in this process: the figures a
drain comparison's noise hides. ``bench.dispatch --compare-observability`` prints them after its
runs, with the drain loss they predict (their CPU a task over the executor's own).

    .venv/bin/python -m bench.observe_cost [--trace-ratio 0.1]

- metrics: the per-task updates (``task_started``, ``task_left_slot``, ``task_ended``) on a
  :class:`executor.metrics.Metrics` with the executor's task types declared, and one scrape
  (``generate_latest`` of its registry), which a Prometheus does once a second;
- tracing: :meth:`executor.tracing.Tracing.task` entered and left for tasks of distinct ids at
  the given ratio, spans recorded by the OpenTelemetry SDK and batched to an exporter that drops
  them (as ``bench.traced_executor`` does); CPU of the whole process, so the SDK's batching
  thread counts too.
"""

from __future__ import annotations

import argparse
import time
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass

TASK_TYPES = ["parse", "dataflow", "memory", "noop", "stamp"]


@dataclass(frozen=True)
class Costs:
    metrics_us: float  # CPU µs of one task's metric updates
    scrape_ms: float  # CPU ms of one scrape
    trace_us: float | None  # CPU µs a task at the ratio (None: no tracing measured)
    traced_us: float | None  # CPU µs of one traced task's span
    ratio: float

    def per_task_us(self, observe: str, tasks_per_s: float) -> float:
        """CPU µs a task for what ``observe`` turns on, at a drain of ``tasks_per_s`` (a scrape a
        second shared among the second's tasks)."""
        metrics = self.metrics_us + self.scrape_ms * 1000 / max(tasks_per_s, 1.0)
        tracing = self.trace_us or 0.0
        return {"metrics": metrics, "tracing": tracing, "both": metrics + tracing}[observe]

    def lines(self) -> list[str]:
        out = [
            f"in-process cost: metrics {self.metrics_us:.1f} µs a task, a scrape {self.scrape_ms:.2f} ms",
        ]
        if self.trace_us is not None and self.traced_us is not None:
            out.append(
                f"in-process cost: tracing {self.trace_us:.1f} µs a task at ratio {self.ratio:g}"
                f" ({self.traced_us:.1f} µs a traced task)"
            )
        return out


def _cpu_us_each(fn: Callable[[int], object], n: int) -> float:
    started = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - started) / n * 1e6


def metrics_cost(n: int = 20000) -> tuple[float, float]:
    """(CPU µs of one task's updates, CPU ms of one scrape)."""
    from prometheus_client import generate_latest

    from executor.metrics import Metrics

    m = Metrics("bench_0")
    m.declare(TASK_TYPES)
    entry = f"{int(time.time() * 1000)}-0"

    def one(_: int) -> None:
        m.task_started("noop", entry)
        m.task_left_slot("noop")
        m.task_ended("noop", "done", 0.002)

    one(0)
    per_task = _cpu_us_each(one, n)
    generate_latest(m.registry)
    scrape_ms = _cpu_us_each(lambda _: generate_latest(m.registry), 200) / 1000
    return per_task, scrape_ms


def _runs(n: int) -> list[types.SimpleNamespace]:
    """Stand-ins for :class:`executor.book.Running` with what a task span reads."""
    out = []
    for _ in range(n):
        claimed = types.SimpleNamespace(
            task_id=uuid.uuid4().hex,
            doc_id=uuid.uuid4().hex,
            row={"kb_id": uuid.uuid4().hex},
            doc=None,
            entry=types.SimpleNamespace(deliveries=1),
            task_type="noop",
        )
        out.append(types.SimpleNamespace(claimed=claimed, stop_reason=None))
    return out


def tracing_cost(ratio: float, n: int = 20000) -> tuple[float, float]:
    """(CPU µs a task at ``ratio``, CPU µs of one traced task)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from bench.traced_executor import DiscardingExporter
    from executor.tracing import Tracing

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
    try:
        results = []
        for r in (ratio, 1.0):
            tracing = Tracing(provider, r)
            runs = _runs(n)

            def one(i: int, tracing: Tracing = tracing, runs: list[types.SimpleNamespace] = runs) -> None:
                with tracing.task(runs[i], "bench_0"):
                    pass

            for i in range(min(n, 500)):  # warm: the SDK's first spans allocate its structures
                one(i)
            results.append(_cpu_us_each(one, n))
        return results[0], results[1]
    finally:
        provider.shutdown()


def measure(observe: str, ratio: float) -> Costs:
    metrics_us, scrape_ms = metrics_cost()
    trace_us = traced_us = None
    if observe in ("tracing", "both"):
        trace_us, traced_us = tracing_cost(ratio)
    return Costs(metrics_us, scrape_ms, trace_us, traced_us, ratio)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace-ratio", type=float, default=0.1)
    args = parser.parse_args()
    for line in measure("both", args.trace_ratio).lines():
        print(line)


if __name__ == "__main__":
    main()
