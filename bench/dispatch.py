"""Dispatch benchmark: enqueue and drain N no-op tasks through the full path, beside baselines.

    .venv/bin/python -m bench.dispatch [--n 10000] [--concurrency 10] [--paced 300 --rate 25] [--plot DIR]
    .venv/bin/python -m bench.dispatch --compare-observability [--observe both|metrics|tracing] [--n 5000] [--runs 5]
    .venv/bin/python -m bench.dispatch --compare-fairness [--n 10000] [--tenants 1000] [--runs 3]
    .venv/bin/python -m bench.dispatch --compare-docket [--n 5000] [--runs 5]
    .venv/bin/python -m bench.dispatch --compare-cluster [--n 10000] [--runs 3]

Prints, in one run on the same services:
- enqueue tasks/s through the producer (rows upserted, guarded publish) beside a raw baseline
  (peewee ``insert_many`` plus pipelined XADD of the same messages);
- drain tasks/s of one executor process (read, validate, claim, route, terminal write, ack),
  measured from the first claim to the last terminal write in the task rows;
- start latency p50/p99 from a paced run: an idle executor, tasks enqueued one at a time;
- with the ``bench`` extra (pydocket) installed: Docket's no-op drain with the same N and
  concurrency (5 ms check interval), in a subprocess.
With ``--plot DIR`` (matplotlib: the ``plots`` or ``bench`` extra) it also writes the run's
figures as PNGs there (``bench.plots``): ``dispatch_drain.png``, ``start_latency.png``.
With ``--compare-observability`` it prints instead the drain rate with metrics and tracing on
(``INGEST_METRICS_PORT`` served and scraped every second, spans recorded by the OpenTelemetry SDK
and batched to an exporter that drops them: ``bench.traced_executor``) beside the rate with both
off, ``--runs`` interleaved runs each way (the order alternating, after one warm-up run), and
the medians, with the executor's CPU time a task (from its first heartbeat to the last task's end);
then each run's "on" over its own "off" and the median of those (the pair ran back to back, so a
machine drifting over the minutes moves both).
``--observe metrics`` or ``--observe tracing`` turns on only one of them; ``--trace-ratio R``
traces only that share of tasks (``INGEST_TRACE_RATIO``) in the traced runs.
With ``--compare-fairness`` it prints the drain rate through the fair gate (``db.gate``) with one
tenant and with ``--tenants`` tenants (each at the default cap of 5) beside the plain drain of
the same executor (messages put on the priority stream directly, as before the gate: read with
no admission), and one tenant whose cap equals the executor's slots (a slot is held until the
ack, so the executor waits for its own acks), ``--runs`` interleaved runs each, medians, ratios.
Measured here (2 shared cores, N=5000, 5 runs each way, no-op tasks of ~190-200 µs executor CPU):
metrics alone +10 µs CPU a task, drain -6 %; tracing alone (every span recorded) +44 µs, -15 %;
both -2, -10, -13, -17, -17, -20 % in six runs of one session (earlier sessions 7-28 %). Head
sampling (``OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.1``) still
cost +32 µs, -22 % in one run. The cost is the SDK's ``start_span`` (five attributes validated)
and ``end``: about 25 µs a span in a bare loop here. A real task (parse: hundreds of ms) does
not notice either.
With ``--compare-docket`` it prints our no-op drain with metrics served and scraped every second
(as in production) beside Docket's no-op drain, ``--runs`` interleaved runs each, medians, ratio.
With ``--compare-cluster`` it prints the enqueue and drain rates of no-op tasks on a private
Redis Cluster of three masters (``redis+cluster://``: the prefix one hash tag, so the fleet's
queue on one master) beside a private single ``redis-server`` started the same way (no
persistence, ``tests.redis_servers``), ``--runs`` interleaved runs each (default 3), medians
and the ratio; the database is the same MariaDB for both.
A benchmark, not a test: the machine is shared, so read ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import orjson

from bench import observe_cost
from db.config import Settings
from db.database import close_database, init_database, unit
from db.keys import Keys
from db.models import DONE, QUEUED, RUNNING, Task, now_ms
from db.schema import init_schema
from db.streams import Streams, connect

ROOT = Path(__file__).resolve().parent.parent


async def noop(ctx) -> None:
    """The benchmark's task type: does nothing, so the figures are the executor's own cost."""
    return None


async def stamp(ctx):
    """The paced run's task type: its first line notes the wall clock (ms), kept on the row."""
    first_line_ms = time.time() * 1000
    from executor.context import TaskResult

    return TaskResult(extra={"first_line_ms": first_line_ms})


def _settings(name: str, concurrency: int) -> Settings:
    base = os.environ.get("BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306")
    return Settings.from_env(
        os.environ,
        db_url=f"{base}/{name}",
        key_prefix=f"bench:{name}",
        max_concurrent_tasks=concurrency,
        tenant_max_running=1000,  # one tenant: a cap that does not bind (the gate's cost alone)
        stagger_s=0.0,
        extra_handlers="noop=bench.dispatch:noop,stamp=bench.dispatch:stamp",
    )


def _drop(settings: Settings) -> None:
    close_database()
    init_database(settings.db_url)
    with unit() as db:
        db.execute_sql(f"DROP DATABASE IF EXISTS `{settings.db_url.rsplit('/', 1)[1]}`")
    close_database()
    client = connect(settings)
    keys = list(client.scan_iter(match=f"{settings.key_prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


def _tasks(n: int) -> list[dict]:
    return [{"task_type": "noop", "priority": 0, "doc_id": ""} for _ in range(n)]


def baseline_enqueue(settings: Settings, n: int) -> float:
    """Raw cost: one insert_many per 1,000 rows plus pipelined XADD; tasks/s."""
    rows = [{"id": uuid.uuid4().hex, "task_type": "noop", "create_time": now_ms()} for _ in range(n)]
    client = connect(settings)
    stream = f"{settings.key_prefix}:baseline"
    start = time.perf_counter()
    for i in range(0, n, 1000):
        with unit():
            Task.insert_many(rows[i : i + 1000]).execute()
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.xadd(stream, {"message": orjson.dumps({"id": row["id"], "task_type": "noop"}).decode()})
    pipe.execute()
    elapsed = time.perf_counter() - start
    with unit():
        Task.delete().where(Task.id.in_([r["id"] for r in rows])).execute()
    client.delete(stream)
    client.close()
    return n / elapsed


def producer_enqueue(settings: Settings, n: int) -> tuple[float, list[str]]:
    from ingest.producer import enqueue_tasks

    start = time.perf_counter()
    ids = enqueue_tasks(settings, _tasks(n))
    return n / (time.perf_counter() - start), ids


def _start_executor(
    settings: Settings,
    name: str,
    log: Path,
    extra_env: dict[str, str] | None = None,
    module: str = "executor",
) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        {
            "INGEST_DB_URL": settings.db_url,
            "INGEST_REDIS_URL": settings.redis_url,
            "INGEST_KEY_PREFIX": settings.key_prefix,
            "INGEST_MAX_CONCURRENT_TASKS": str(settings.max_concurrent_tasks),
            "INGEST_STAGGER_S": "0",
            "INGEST_EXTRA_HANDLERS": settings.extra_handlers,
            "INGEST_TENANT_MAX_RUNNING": str(settings.tenant_max_running),
            "INGEST_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
    )
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", module, name], env=env, stdout=out, stderr=out, cwd=ROOT
        )


def _wait_done(ids: list[str], timeout_s: float) -> None:
    """Until every one of ``ids`` is done. While it waits it counts the bench database's
    unfinished rows through the (status, update_time) index, a few rows near the end, rather
    than looking every id up: a 5,000-id IN list five times a second cost MariaDB about a
    third of the CPU the drain itself gave it, on the same cores. The ids are checked once at
    the end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with unit():
            left = Task.select().where(Task.status.in_([QUEUED, RUNNING])).count()
        if left == 0:
            break
        time.sleep(0.2)
    not_done = 0
    for i in range(0, len(ids), 5000):
        with unit():
            not_done += Task.select().where(Task.id.in_(ids[i : i + 5000]) & (Task.status != DONE)).count()
    if not_done:
        raise SystemExit(f"{not_done} tasks not done after {timeout_s} s")


def _spans(ids: list[str]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in range(0, len(ids), 5000):
        with unit():
            out += list(
                Task.select(Task.begin_at, Task.update_time).where(Task.id.in_(ids[i : i + 5000])).tuples()
            )
    return out


def drain(
    settings: Settings,
    ids: list[str],
    log: Path,
    extra_env: dict[str, str] | None = None,
    module: str = "executor",
) -> float:
    proc = _start_executor(settings, "bench_0", log, extra_env, module)
    try:
        _wait_done(ids, timeout_s=600)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return _drain_rate(ids)


def _drain_rate(ids: list[str]) -> float:
    spans = _spans(ids)
    first = min(b for b, _ in spans)
    last = max(u for _, u in spans)
    return len(ids) / max((last - first) / 1000, 1e-3)


def paced_run(
    settings: Settings,
    n: int,
    rate: float,
    log: Path,
    extra_env: dict[str, str] | None = None,
    module: str = "executor",
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """An idle executor (``python -m module``, consumer ``bench_1``), ``n`` stamp tasks submitted
    one at a time at ``rate``/s and waited for, the executor stopped. Returns each task's wall
    clock (ms) at the call, at its return and at its handler's first line: (called, returned,
    first line)."""
    from ingest.producer import enqueue_tasks

    called: dict[str, float] = {}
    returned: dict[str, float] = {}
    proc = _start_executor(settings, "bench_1", log, extra_env, module)
    client = connect(settings)
    try:
        up_by = time.monotonic() + 60
        while not client.exists(Keys(settings.key_prefix).executor("bench_1")):
            if proc.poll() is not None or time.monotonic() > up_by:
                raise SystemExit(f"the executor did not start: see {log}")
            time.sleep(0.05)
        time.sleep(0.5)
        period = 1.0 / rate
        next_at = time.monotonic()
        task = [{"task_type": "stamp", "priority": 0, "doc_id": ""}]
        for _ in range(n):
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
            t0 = time.time() * 1000
            (task_id,) = enqueue_tasks(settings, task)
            returned[task_id], called[task_id] = time.time() * 1000, t0
        _wait_done(list(called), timeout_s=120)
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=60)
    with unit():
        first = {
            t: r["first_line_ms"]
            for t, r in Task.select(Task.id, Task.result).where(Task.id.in_(list(called))).tuples()
        }
    return called, returned, first


def paced_latency(settings: Settings, n: int, rate: float, log: Path) -> dict[str, list[float]]:
    """An idle executor, ``n`` tasks submitted one at a time at ``rate``/s. Two measures, each
    task's latency in ms, sorted: ``returned`` from ``enqueue_tasks`` returning (rows committed,
    message published) to the handler's first line, as issue 13 defines start latency; ``called``
    from the call, so the producer's own insert, commit and publish are in it too (the figure
    printed before). :func:`p50_p99` reads them."""
    called, returned, first = paced_run(settings, n, rate, log)
    return {
        "returned": sorted(first[t] - returned[t] for t in returned),
        "called": sorted(first[t] - called[t] for t in called),
    }


def p50_p99(lat: list[float]) -> tuple[float, float]:
    """(p50, p99) of sorted latencies."""
    return statistics.median(lat), lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape_every_second(port: int, stop: threading.Event) -> None:
    """What a Prometheus does to the executor: GET /metrics every second."""
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                resp.read()
        except OSError:
            pass


OBSERVE = ("both", "metrics", "tracing")


def observed_drain(
    settings: Settings, n: int, on: bool, log: Path, observe: str = "both", trace_ratio: float = 1.0
) -> tuple[float, float]:
    """Drain ``n`` no-op tasks with one executor, ``observe`` (metrics, tracing or both) ``on`` or
    everything off: (tasks/s from the first claim to the last terminal write, the executor's CPU
    µs a task from its first heartbeat, written just before its first read, to the last task's
    end). The CPU figure moves less than the rate with a shared machine's load."""
    import psutil

    _, ids = producer_enqueue(settings, n)
    env = {"INGEST_METRICS_PORT": "0", "INGEST_TRACING": "off"}
    module, stop = "executor", threading.Event()
    if on and observe in ("both", "metrics"):
        port = _free_port()
        env["INGEST_METRICS_PORT"] = str(port)
        threading.Thread(target=_scrape_every_second, args=(port, stop), daemon=True).start()
    if on and observe in ("both", "tracing"):
        env["INGEST_TRACING"], module = "auto", "bench.traced_executor"
        env["INGEST_TRACE_RATIO"] = str(trace_ratio)
    client = connect(settings)
    heartbeat = Keys(settings.key_prefix).executor("bench_0")
    proc = _start_executor(settings, "bench_0", log, env, module)
    try:
        cpu = psutil.Process(proc.pid)
        while not client.exists(heartbeat):
            time.sleep(0.002)
        began = sum(cpu.cpu_times()[:2])
        _wait_done(ids, timeout_s=600)
        cpu_us = (sum(cpu.cpu_times()[:2]) - began) / n * 1e6
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=60)
        client.close()
    return _drain_rate(ids), cpu_us


def _line(what: str, values: list[float], unit: str) -> str:
    listed = ", ".join(f"{x:.0f}" for x in values)
    return f"{what}: median {statistics.median(values):8.0f} {unit}   ({listed})"


def compare_observability(
    settings: Settings, n: int, runs: int, log: Path, observe: str = "both", trace_ratio: float = 1.0
) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    observed_drain(settings, n, False, log)  # warm-up, not counted: the database's caches, the task table
    for r in range(runs):
        for on in (False, True) if r % 2 == 0 else (True, False):
            rate, cpu_us = observed_drain(settings, n, on, log, observe, trace_ratio)
            rates[on].append(rate)
            cpus[on].append(cpu_us)
            print(
                f"run {r + 1}/{runs} {'on ' if on else 'off'}: {rate:8.0f} tasks/s, {cpu_us:5.0f} µs CPU a task",
                flush=True,
            )
    what = {"both": "metrics + tracing", "metrics": "metrics", "tracing": "tracing"}[observe]
    if observe != "metrics" and trace_ratio < 1.0:
        what += f" ({trace_ratio:g} of tasks traced)"
    print(_line(f"drain, {what} off".ljust(28), rates[False], "tasks/s"))
    print(_line(f"drain, {what} on".ljust(28), rates[True], "tasks/s"))
    print(_line("executor CPU, off".ljust(28), cpus[False], "µs/task"))
    print(_line("executor CPU, on".ljust(28), cpus[True], "µs/task"))
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    cpu_off, cpu_on = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(
        f"on / off: drain {on / off:.3f} ({(on / off - 1) * 100:+.1f} %), CPU a task {cpu_on / cpu_off:.3f} "
        f"({(cpu_on / cpu_off - 1) * 100:+.1f} %, {cpu_on - cpu_off:+.0f} µs); N={n}, {runs} interleaved runs each way"
    )
    paired = paired_ratios(rates[True], rates[False])
    listed = ", ".join(f"{x:.3f}" for x in paired)
    print(
        f"on / off, run by run: median {statistics.median(paired):.3f} "
        f"({(statistics.median(paired) - 1) * 100:+.1f} %)   ({listed})"
    )
    costs = observe_cost.measure(observe, trace_ratio)
    for line in costs.lines():
        print(line)
    extra = costs.per_task_us(observe, off)
    print(
        f"predicted: +{extra:.1f} µs CPU a task, {extra / cpu_off * 100:.1f} % of the executor's {cpu_off:.0f}"
        " (the drain loses at most that share where the executor's CPU bounds it)"
    )


def paired_ratios(on: list[float], off: list[float]) -> list[float]:
    """Each run's "on" figure over the "off" figure of the same run (the two drains next to each
    other in time): a machine that slows down or speeds up over the runs moves both alike, so
    their ratio's median is steadier than the ratio of the two medians."""
    return [a / b for a, b in zip(on, off, strict=True)]


FAIR_MODES = ("plain", "1 tenant", "many tenants", "1 tenant at cap")


def fairness_drain(settings: Settings, n: int, mode: str, tenants: int, log: Path) -> float:
    """Drain ``n`` no-op tasks with one executor: ``plain`` (rows written, messages XADDed to the
    priority stream directly: no admission), ``1 tenant`` or ``many tenants`` (published into
    the tenants' backlogs by the producer, admitted by the gate). Tasks/s, first claim to last
    terminal write."""
    from db.bulk import bulk_insert_into_db
    from ingest.producer import enqueue_tasks

    if mode == "plain":
        rows = [{"id": uuid.uuid4().hex, "task_type": "noop", "priority": 0} for _ in range(n)]
        for i in range(0, n, 1000):
            with unit():
                bulk_insert_into_db(Task, rows[i : i + 1000])
        client = connect(settings)
        stream = Keys(settings.key_prefix).queue(0)
        for i in range(0, n, 1000):
            pipe = client.pipeline(transaction=False)
            for r in rows[i : i + 1000]:
                pipe.xadd(stream, {"message": orjson.dumps({**r, "tenant_id": "default"}).decode()})
            pipe.execute()
        client.close()
        ids = [r["id"] for r in rows]
    else:
        count = tenants if mode == "many tenants" else 1
        tasks = [{**t, "tenant_id": f"t{i % count}"} for i, t in enumerate(_tasks(n))]
        ids = enqueue_tasks(settings, tasks)
    return drain(settings, ids, log)


def compare_fairness(settings: Settings, n: int, tenants: int, runs: int, log: Path) -> None:
    many = settings.replace(tenant_max_running=5)
    capped = settings.replace(tenant_max_running=settings.max_concurrent_tasks)
    rates: dict[str, list[float]] = {m: [] for m in FAIR_MODES}
    fairness_drain(settings, min(n, 2000), "plain", tenants, log)  # warm-up, not counted
    for r in range(runs):
        order = FAIR_MODES if r % 2 == 0 else tuple(reversed(FAIR_MODES))
        for mode in order:
            s = {"many tenants": many, "1 tenant at cap": capped}.get(mode, settings)
            rate = fairness_drain(s, n, mode, tenants, log)
            rates[mode].append(rate)
            print(f"run {r + 1}/{runs} {mode:>12}: {rate:8.0f} tasks/s", flush=True)
    plain = statistics.median(rates["plain"])
    for mode in FAIR_MODES:
        label = {"many tenants": f"{tenants} tenants"}.get(mode, mode)
        med = statistics.median(rates[mode])
        print(_line(f"drain, {label}".ljust(22), rates[mode], "tasks/s") + f"   {med / plain:.3f}× plain")
    print(
        f"N={n}, concurrency {settings.max_concurrent_tasks}, {runs} interleaved runs each; "
        f"cap {settings.tenant_max_running} with one tenant, 5 with {tenants}, "
        f"{settings.max_concurrent_tasks} (the executor's slots) at cap"
    )


def compare_docket(settings: Settings, n: int, runs: int, log: Path) -> None:
    """Ours with metrics served and scraped every second beside Docket's no-op drain, interleaved."""
    if docket_drain(min(n, 500), settings.max_concurrent_tasks) is None:  # warm-up, and is it there?
        print("docket: not installed (pip install -e '.[bench]')")
        return
    observed_drain(settings, n, True, log, "metrics")  # warm-up, not counted
    ours: list[float] = []
    theirs: list[float] = []
    for r in range(runs):
        for side in ("ours", "docket") if r % 2 == 0 else ("docket", "ours"):
            if side == "ours":
                ours.append(observed_drain(settings, n, True, log, "metrics")[0])
            else:
                theirs.append(docket_drain(n, settings.max_concurrent_tasks) or float("nan"))
        print(f"run {r + 1}/{runs}: ours {ours[-1]:8.0f}, docket {theirs[-1]:8.0f} tasks/s", flush=True)
    print(_line("drain, ours, metrics on".ljust(28), ours, "tasks/s"))
    print(_line("drain, docket".ljust(28), theirs, "tasks/s"))
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(
        f"ours / docket: {ratio:.2f} (goal >= 2); N={n}, concurrency {settings.max_concurrent_tasks}, "
        f"{runs} interleaved runs each, load average {os.getloadavg()[0]:.1f}"
    )


def compare_cluster(settings: Settings, n: int, runs: int, log: Path) -> None:
    """Enqueue and drain ``n`` no-op tasks on a three-master Cluster and on one server, both
    private and started the same way, ``runs`` interleaved runs each, after one warm-up run."""
    import tempfile

    from tests.redis_servers import Cluster, plain_redis

    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        single = plain_redis(Path(tmp) / "single")
        cluster = None
        try:
            cluster = Cluster(Path(tmp) / "cluster")
            targets = {
                "single": settings.replace(redis_url=f"redis://127.0.0.1:{single.port}/0"),
                "cluster": settings.replace(redis_url=cluster.url),  # the prefix becomes {…}
            }
            for s in targets.values():
                client = connect(s)
                Streams(client, Keys(s.key_prefix)).ensure_group()
                client.close()
            enqueued: dict[str, list[float]] = {m: [] for m in targets}
            drained: dict[str, list[float]] = {m: [] for m in targets}
            for s in targets.values():  # warm-up, not counted: the task table, each server's scripts
                drain(s, producer_enqueue(s, min(n, 1000))[1], log)
            for r in range(runs):
                for mode in ("single", "cluster") if r % 2 == 0 else ("cluster", "single"):
                    rate, ids = producer_enqueue(targets[mode], n)
                    enqueued[mode].append(rate)
                    drained[mode].append(drain(targets[mode], ids, log))
                    print(
                        f"run {r + 1}/{runs} {mode:>7}: enqueue {rate:8.0f} tasks/s, "
                        f"drain {drained[mode][-1]:8.0f} tasks/s",
                        flush=True,
                    )
        finally:
            if cluster is not None:
                cluster.close()
            single.close()
    for what, rates in (("enqueue", enqueued), ("drain", drained)):
        for mode in targets:
            print(_line(f"{what}, {mode}".ljust(18), rates[mode], "tasks/s"))
    e = statistics.median(enqueued["cluster"]) / statistics.median(enqueued["single"])
    d = statistics.median(drained["cluster"]) / statistics.median(drained["single"])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"cluster / single: drain {d:.3f} ({(d - 1) * 100:+.1f} %), enqueue {e:.3f} ({(e - 1) * 100:+.1f} %); "
        f"N={n}, concurrency {settings.max_concurrent_tasks}, one executor, {runs} interleaved runs each; "
        f"3 masters, every key of the prefix on one (load average {load})"
    )


def docket_drain(n: int, concurrency: int) -> float | None:
    try:
        import docket  # noqa: F401
    except ImportError:
        return None
    result = subprocess.run(
        [sys.executable, "-m", "bench.docket_noop", str(n), str(concurrency)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if result.returncode != 0:
        print(result.stderr[-2000:], file=sys.stderr)
        return None
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--paced", type=int, default=300, help="tasks in the paced latency run")
    parser.add_argument("--rate", type=float, default=25.0, help="tasks/s in the paced run")
    parser.add_argument("--no-docket", action="store_true")
    parser.add_argument(
        "--compare-observability",
        action="store_true",
        help="only the drain rate with metrics and tracing on vs off, interleaved runs, medians",
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="with --compare-*: runs each way (5; 3 with --compare-cluster)"
    )
    parser.add_argument(
        "--compare-fairness",
        action="store_true",
        help="only the drain through the fair gate (1 tenant, --tenants tenants) beside the plain drain",
    )
    parser.add_argument(
        "--compare-docket",
        action="store_true",
        help="only our drain with metrics served and scraped beside Docket's, interleaved runs, medians",
    )
    parser.add_argument("--tenants", type=int, default=1000, help="with --compare-fairness: the many")
    parser.add_argument(
        "--compare-cluster",
        action="store_true",
        help="only enqueue and drain on a private 3-master Redis Cluster beside a private single server",
    )
    parser.add_argument(
        "--observe",
        choices=OBSERVE,
        default="both",
        help="with --compare-observability: what is on in the 'on' runs (default both)",
    )
    parser.add_argument(
        "--trace-ratio",
        type=float,
        default=1.0,
        help="with --compare-observability: INGEST_TRACE_RATIO of the traced runs (default 1: every task)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="also write dispatch_drain.png and start_latency.png of this run there (the plots extra)",
    )
    args = parser.parse_args()
    if args.runs is None:
        args.runs = 3 if args.compare_cluster else 5
    if args.plot and (
        args.compare_observability or args.compare_fairness or args.compare_docket or args.compare_cluster
    ):
        parser.error("--plot draws the default run's figures, not a --compare-* run's")
    if args.plot:
        from bench import plots  # before the run: a missing matplotlib fails at once

    name = f"bench_{uuid.uuid4().hex[:8]}"
    settings = _settings(name, args.concurrency)
    log = Path(f"/tmp/{name}.log")
    init_schema(settings.db_url)
    Streams(connect(settings), Keys(settings.key_prefix)).ensure_group()
    try:
        if args.compare_observability:
            compare_observability(settings, args.n, args.runs, log, args.observe, args.trace_ratio)
            return
        if args.compare_docket:
            compare_docket(settings, args.n, args.runs, log)
            return
        if args.compare_fairness:
            compare_fairness(settings, args.n, args.tenants, args.runs, log)
            return
        if args.compare_cluster:
            compare_cluster(settings, args.n, args.runs, log)
            return
        base = baseline_enqueue(settings, args.n)
        rate, ids = producer_enqueue(settings, args.n)
        print(
            f"enqueue   : {rate:8.0f} tasks/s   (raw insert_many + XADD baseline {base:8.0f} tasks/s, "
            f"ratio {rate / base:.2f})"
        )
        drained = drain(settings, ids, log)
        print(
            f"drain     : {drained:8.0f} tasks/s   (one executor, concurrency {args.concurrency}, N={args.n})"
        )
        lat = paced_latency(settings, args.paced, args.rate, log)
        (p50, p99), (c50, c99) = p50_p99(lat["returned"]), p50_p99(lat["called"])
        print(
            f"latency   : p50 {p50:.1f} ms, p99 {p99:.1f} ms from submit returning to the handler's first line "
            f"(goal p50 <= 2, p99 <= 10); from the call: p50 {c50:.1f}, p99 {c99:.1f}   "
            f"({args.paced} tasks at {args.rate:g}/s, idle executor)"
        )
        dk = None
        if not args.no_docket:
            dk = docket_drain(args.n, args.concurrency)
            if dk is None:
                print("docket    : not installed (pip install -e '.[bench]')")
            else:
                print(
                    f"docket    : {dk:8.0f} tasks/s   (no-op drain, same N and concurrency; "
                    f"ours/docket {drained / dk:.2f})"
                )
        if args.plot:
            for out in (
                plots.dispatch_rates(
                    args.plot / "dispatch_drain.png",
                    enqueue=rate,
                    enqueue_raw=base,
                    drain=drained,
                    docket=dk,
                    n=args.n,
                    concurrency=args.concurrency,
                ),
                plots.start_latency(
                    args.plot / "start_latency.png",
                    returned_ms=lat["returned"],
                    called_ms=lat["called"],
                    rate=args.rate,
                ),
            ):
                print(f"plot      : {out}")
    finally:
        _drop(settings)
    print(f"executor log: {log}")


if __name__ == "__main__":
    main()
