"""Where an idle start's time goes: issue 13's start latency (goal p50 ≤ 2 ms), step by step.

    .venv/bin/python -m bench.start_steps [--n 300] [--rate 25]

As ``bench.dispatch``'s paced run: an idle executor, ``--n`` tasks submitted one at a time at
``--rate``/s, each task's latency from ``enqueue_tasks`` returning to the handler's first line.
The executor is ``bench.stamped_executor``, which stamps each step of its read-and-claim hop with
the wall clock (the same clock as this process's), so every task's latency splits into:

- ``wake-up``: submit returning → the gate's dispatch script starts (the blocked read's wake-up;
  negative when the executor was already dispatching as the producer's call returned);
- ``dispatch``: the fair gate's dispatch script (one Redis round trip);
- ``to select``: the message parsed; the transaction was begun before the read;
- ``select``: the validating SELECT of the task, document and knowledge base rows;
- ``judge``: the rules applied to the row;
- ``update``: the claim UPDATE, fenced by attempt;
- ``hop to trio``: the worker thread hands the run to the trio thread (the COMMIT follows in
  the worker thread, overlapping what comes next);
- ``runner starts``: the run spawned until ``Runner.run`` begins;
- ``to handler``: the slot, progress, metrics and routing until the handler's first line.

Prints each step's p50 and p90 in ms, the sum of the p50s, and the whole latency's p50 and p99.
A task whose hop claimed more than one task is left out (the executor was not idle). A
benchmark, not a test: read it beside the other figures of the same run.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import tempfile
import uuid
from pathlib import Path

import orjson

from bench.dispatch import _drop, _settings, paced_run
from db.keys import Keys
from db.schema import init_schema
from db.streams import Streams, connect

STEPS = (
    "wake-up",
    "dispatch",
    "to select",
    "select",
    "judge",
    "update",
    "hop to trio",
    "runner starts",
    "to handler",
)


def _last_before(stamps: list[tuple[float, float]], t: float) -> tuple[float, float] | None:
    """The stamp (began, ended) that began last at or before ``t``; stamps sorted by began."""
    i = bisect.bisect_right(stamps, (t, float("inf")))
    return stamps[i - 1] if i else None


def split(
    stamps: list[tuple[str, float, float]], returned: dict[str, float], first_line: dict[str, float]
) -> tuple[dict[str, list[float]], list[float], int]:
    """Each task's steps in ms (by step), the tasks' whole latencies, and how many were left out."""
    by_step: dict[str, list[tuple[float, float]]] = {}
    for step, began, ended in stamps:
        by_step.setdefault(step, []).append((began, ended))
    for v in by_step.values():
        v.sort()
    steps: dict[str, list[float]] = {s: [] for s in STEPS}
    whole: list[float] = []
    skipped = 0
    for tid, ret in returned.items():
        first = first_line[tid]
        runner = _last_before(by_step.get("runner", []), first)
        trio_start = runner and _last_before(by_step.get("trio_start", []), runner[0])
        update = trio_start and _last_before(by_step.get("update", []), trio_start[0])
        select = update and _last_before(by_step.get("select", []), update[0])
        dispatch = select and _last_before(by_step.get("dispatch", []), select[0])
        if not (runner and trio_start and update and select and dispatch):
            skipped += 1
            continue
        # more than one run started by this hop: the executor was not idle for this task
        if sum(1 for b, _ in by_step["runner"] if trio_start[0] <= b <= first) > 1:
            skipped += 1
            continue
        marks = (
            ret,
            dispatch[0],
            dispatch[1],
            select[0],
            select[1],
            update[0],
            update[1],
            trio_start[0],
            runner[0],
            first,
        )
        for name, a, b in zip(STEPS, marks[:-1], marks[1:], strict=True):
            steps[name].append(b - a)
        whole.append(first - ret)
    return steps, whole, skipped


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(n: int, rate: float) -> tuple[dict[str, list[float]], list[float], int]:
    """The paced run on a database and key prefix of its own (dropped after): :func:`split`'s
    figures."""
    name = f"bench_{uuid.uuid4().hex[:8]}"
    settings = _settings(name, 10)
    init_schema(settings.db_url)
    Streams(connect(settings), Keys(settings.key_prefix)).ensure_group()
    log = Path(f"/tmp/{name}.log")
    stamps_file = Path(tempfile.gettempdir()) / f"{name}.stamps.json"
    try:
        _, returned, first = paced_run(
            settings, n, rate, log, {"BENCH_STAMPS_FILE": str(stamps_file)}, module="bench.stamped_executor"
        )
        stamps = [(str(s), float(b), float(e)) for s, b, e in orjson.loads(stamps_file.read_bytes())]
    finally:
        stamps_file.unlink(missing_ok=True)
        _drop(settings)
    return split(stamps, returned, first)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rate", type=float, default=25.0)
    args = parser.parse_args()
    steps, whole, skipped = measure(args.n, args.rate)
    print(f"{'step':14s} {'p50 ms':>7s} {'p90 ms':>7s}")
    for step in STEPS:
        print(f"{step:14s} {statistics.median(steps[step]):7.3f} {_pct(steps[step], 0.9):7.3f}")
    total = sum(statistics.median(steps[s]) for s in STEPS)
    print(f"{'sum of p50s':14s} {total:7.3f}")
    print(
        f"start latency p50 {statistics.median(whole):.2f} ms, p99 {_pct(whole, 0.99):.2f} ms"
        f" (goal p50 <= 2, p99 <= 10); {len(whole)} tasks, {skipped} left out"
        f" (not alone in their hop); load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
