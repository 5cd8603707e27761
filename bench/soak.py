"""Soak: does one executor's memory stay flat over many tasks? And do its parse workers stay torch-free?

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.soak --kind noop  [--n 100000] [--wave 1000]
    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.soak --kind parse [--n 10000]  [--wave 1000]

One executor process (``python -m executor soak_0``, jemalloc preloaded as entrypoint.sh does)
runs ``--n`` tasks in waves of ``--wave``: each wave is enqueued through the producer and waited
for until every task is terminal, then the executor's RSS (and its parse workers', the largest)
is sampled and printed: a line every wave. ``noop`` tasks do nothing (the executor's own path:
read, claim, route, finish, ack); ``parse`` tasks are real documents (the licences and copyright
texts bench/ingest.py reads, cut to ``--doc-bytes`` (1,500: two or three chunks each) and made
distinct by a line of their own, so no digest reuse), parsed
in the worker processes, chunked, embedded and stored.

Growth is the last sample against the first (after one wave of warm-up, which loads the model
and starts the workers): goal ≤ 5 %. For every parse worker seen, the bench reads its memory
maps and says whether any torch library is mapped (goal: none). A benchmark, not a test: the
figures go to bench/README.md ("Soak").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil  # noqa: E402

from bench.ingest import fresh_settings, real_documents, wait_terminal  # noqa: E402
from db.config import Settings  # noqa: E402
from db.database import close_database, init_database  # noqa: E402
from db.models import DONE  # noqa: E402
from ingest.allocator import preload_env  # noqa: E402

MIB = 2**20


def _torch_mapped(proc: psutil.Process) -> bool:
    """Whether any torch shared library is mapped into ``proc`` (it imported torch)."""
    with contextlib.suppress(psutil.Error):
        return any("torch" in Path(m.path).name or "/torch/" in m.path for m in proc.memory_maps())
    return False


class Samples:
    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.rows: list[tuple[int, float, float]] = []  # (tasks done, executor MiB, worker MiB)
        self.workers: dict[int, bool] = {}  # pid -> torch mapped

    def take(self, done: int) -> tuple[float, float]:
        main = self.proc.memory_info().rss / MIB
        worker = 0.0
        for child in self.proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                worker = max(worker, child.memory_info().rss / MIB)
                if child.pid not in self.workers:
                    self.workers[child.pid] = _torch_mapped(child)
        self.rows.append((done, main, worker))
        return main, worker


def _documents(n: int, start: int, size: int) -> list[tuple[str, bytes]]:
    """``n`` distinct documents: the real texts in turn, each cut to about ``size`` bytes (at a
    line end) and given a line naming its number."""
    texts = real_documents(400)
    out = []
    for i in range(start, start + n):
        name, data = texts[i % len(texts)]
        cut = data[:size].rsplit(b"\n", 1)[0] if len(data) > size else data
        out.append((f"{i:06d}-{name}", cut + f"\n\nSoak document number {i}.\n".encode()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("noop", "parse"), default="noop")
    parser.add_argument("--n", type=int, default=None, help="tasks (default 100,000 noop, 10,000 parse)")
    parser.add_argument("--wave", type=int, default=1000, help="tasks a wave (a sample after each)")
    parser.add_argument("--doc-bytes", type=int, default=1500, help="parse: each document cut to this size")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for one wave")
    args = parser.parse_args(argv)
    n = args.n or (100_000 if args.kind == "noop" else 10_000)

    from ingest.producer import enqueue_tasks, submit_documents

    # a database and key prefix of each kind's own: two soaks of different kinds at once, or one beside
    # bench/ingest.py, would otherwise drop and create the other's tables under it
    settings = fresh_settings(
        Settings.from_env(os.environ, tenant_max_running=1000),
        db_name=f"soak_bench_{args.kind}",
        prefix=f"soak_bench_{args.kind}",
    )
    init_database(settings.db_url)
    env = {
        **os.environ,
        "INGEST_DB_URL": settings.db_url,
        "INGEST_KEY_PREFIX": settings.key_prefix,
        "INGEST_STAGGER_S": "0",
        "INGEST_LOG_LEVEL": "WARNING",
        "INGEST_TENANT_MAX_RUNNING": "1000",
        "INGEST_EXTRA_HANDLERS": "noop=bench.dispatch:noop",
        "PYTHONPATH": str(ROOT),
    }
    env = preload_env(env)  # as entrypoint.sh runs executors
    jemalloc = next((lib for lib in env.get("LD_PRELOAD", "").split(":") if "libjemalloc" in lib), None)
    allocator = (
        f"{jemalloc} (MALLOC_CONF={env.get('MALLOC_CONF', 'its defaults')})" if jemalloc else "glibc malloc"
    )
    executor = subprocess.Popen([sys.executable, "-m", "executor", "soak_0"], cwd=ROOT, env=env)
    samples = Samples(executor.pid)
    print(f"soak: {n} {args.kind} tasks in waves of {args.wave}; allocator {allocator}")
    print(f"{'tasks':>8} {'executor MiB':>13} {'worker MiB':>11} {'wave s':>7}")
    failed = 0
    try:
        done = 0
        while done < n:
            size = min(args.wave, n - done)
            started = time.monotonic()
            if args.kind == "noop":
                ids = enqueue_tasks(settings, [{"task_type": "noop", "priority": 0, "doc_id": ""}] * size)
            else:
                ids = submit_documents(settings, _documents(size, done, args.doc_bytes), "soak").task_ids
            states = wait_terminal(ids, args.timeout)
            failed += sum(c for s, c in states.items() if s != DONE)
            done += size
            main_mib, worker_mib = samples.take(done)
            print(
                f"{done:>8} {main_mib:>13.0f} {worker_mib:>11.0f} {time.monotonic() - started:>7.1f}",
                flush=True,
            )
    finally:
        executor.terminate()
        try:
            executor.wait(60)
        except subprocess.TimeoutExpired:
            executor.kill()
        close_database()

    first, last = samples.rows[0], samples.rows[-1]
    peak = max(r[1] for r in samples.rows)
    growth = (last[1] - first[1]) / first[1] * 100
    print(
        f"executor RSS after the first wave {first[1]:.0f} MiB, at the end {last[1]:.0f} MiB, peak {peak:.0f}: "
        f"growth {growth:+.1f} % (goal ≤ 5 %)"
    )
    if args.kind == "parse":
        worker_growth = (last[2] - first[2]) / first[2] * 100 if first[2] else 0.0
        torch_in = [pid for pid, mapped in samples.workers.items() if mapped]
        print(f"largest parse worker {first[2]:.0f} → {last[2]:.0f} MiB ({worker_growth:+.1f} %)")
        print(
            f"parse workers seen: {len(samples.workers)}; with torch mapped: {len(torch_in)} (goal 0)"
            + (f" {torch_in}" if torch_in else "")
        )
    print(f"tasks not done: {failed}; load average now {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
