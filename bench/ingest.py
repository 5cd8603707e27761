"""Benchmark: documents → searchable chunks through one executor, against the raw encode rate.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/ingest.py [--docs 240] [--runs 3] [--keep] [--backend torch|onnx|onnx-int8] [--plot DIR]

Documents are real text found on the machine: the licences in /usr/share/common-licenses and
the ``copyright`` files under /usr/share/doc (UTF-8 ones, duplicates dropped). The bench uses a
database and key prefix of its own (dropped at the start, so no digest reuse), starts one
executor (``python -m executor bench_0``), warms it up with one small document (the model
load is not what is measured), then submits all documents through the producer
(``ingest.producer.submit_documents``) and times until every task is terminal. Then, in this
process, ``SentenceTransformer.encode`` embeds the very chunks the executor stored, with the
same batch size: the physical limit. It prints chunks/s end to end, the raw rate, their ratio
(goal ≥ 0.95) and the executor's peak RSS (and its parse workers'), and the CPU the executor, its
parse workers and the local MariaDB and Redis servers spent (the raw phase has no servers to
feed). ``--runs N`` interleaves N pairs (a fresh database and executor for each end-to-end
run, then the raw encode of its chunks) and prints the medians: on a shared machine a run of
either kind may be slowed by others' work, and interleaving spreads that over both.

Both phases run on the same allocator: the executor as entrypoint.sh starts it (jemalloc,
``MALLOC_CONF=dirty_decay_ms:-1,narenas:1``, :mod:`ingest.allocator`), and the bench re-executes
itself the same way before it starts, so the raw encode in its own process gets that malloc too
(on glibc's it is about 0.8x as fast: bench/README.md, "the allocator was the cause").
``--allocator default`` runs the executor on the system's malloc (and the bench as it was started).

Measured here (2 cores shared with other engineers' test runs, load average 2.3–3.6), 240
documents, 8219 chunks of ≤ 192 word pieces, jemalloc: end to end 548 s, 15.0 chunks/s; raw
encode 378 s, 21.7 chunks/s: 0.69 by the wall clock, but the executor got 1.18 cores on average
against 1.56 for the raw phase; per CPU second 0.91 (78.5 against 71.8 ms a chunk, parse
workers included). Executor peak RSS 769 MiB, parse workers 166 MiB; an earlier run with
glibc malloc peaked at 1658 MiB (per-thread arenas, most likely), hence jemalloc, as
entrypoint.sh preloads it. With 60 documents (1106 chunks): 0.99 by the wall clock, 1.00 per CPU second.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import peewee  # noqa: E402
import psutil  # noqa: E402

from db.config import Settings  # noqa: E402
from db.database import DbUrl, close_database, init_database, unit  # noqa: E402
from db.keys import Keys  # noqa: E402
from db.models import TERMINAL_STATES, Chunk, Task  # noqa: E402
from db.schema import init_schema  # noqa: E402
from db.streams import Streams, connect  # noqa: E402
from ingest.allocator import describe as describe_allocator  # noqa: E402
from ingest.allocator import find_jemalloc, loaded_jemalloc, preload_env  # noqa: E402

DB_NAME = "ingest_bench"
PREFIX = "ingest_bench"


def real_documents(limit: int) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of distinct UTF-8 texts from licences and package copyright files."""
    candidates = [p for p in sorted(Path("/usr/share/common-licenses").glob("*")) if not p.is_symlink()]
    candidates += sorted(Path("/usr/share/doc").glob("*/copyright"))
    seen: set[str] = set()
    docs: list[tuple[str, bytes]] = []
    for path in candidates:
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        digest = hashlib.sha256(data).hexdigest()
        if len(data) < 512 or digest in seen:
            continue
        seen.add(digest)
        name = path.name if path.parent.name == "common-licenses" else f"{path.parent.name}.copyright.txt"
        docs.append((name, data))
        if len(docs) >= limit:
            break
    return docs


def drop_database(url: str) -> None:
    import pymysql

    parsed = DbUrl.parse(url)
    conn = pymysql.connect(host=parsed.host, port=parsed.port, user=parsed.user, password=parsed.password)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{parsed.name}`")
    finally:
        conn.close()


def fresh_settings(base: Settings, db_name: str = DB_NAME, prefix: str = PREFIX) -> Settings:
    """The bench's own database (dropped and created again) and key prefix (emptied). The benches
    measure the services: with neither URL set (the embedded default), MariaDB and Redis on
    127.0.0.1 (``BENCH_MYSQL_URL`` for another server), as the executors they start get too."""
    if base.db_url.startswith("sqlite"):
        base = base.replace(db_url=os.environ.get("BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306") + "/x")
    if base.embedded:
        base = base.replace(redis_url=Settings.redis_url)
    url = base.db_url.rsplit("/", 1)[0] + f"/{db_name}"
    settings = base.replace(db_url=url, key_prefix=prefix, stagger_s=0.0)
    drop_database(url)
    client = connect(settings)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    init_schema(settings.db_url)
    Streams(client, Keys(prefix)).ensure_group()
    client.close()
    return settings


class ProcessWatch:
    """A process's peak RSS and its children's (the parse workers), and their CPU times.

    The peaks are the kernel's high-water marks (``VmHWM``), exact however rarely they are read
    (a parse worker that exits between two reads takes its last second with it), so the watch
    wakes once a second: sampling RSS ten times a second (and listing the children through /proc
    each time) cost the bench 2.6 % of a core, taken from the end-to-end phase's two cores and
    not from the raw phase's.
    """

    INTERVAL_S = 1.0

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_main = self.peak_children = 0
        self.main_cpu = 0.0
        self.children_cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the watch thread and cpu_s() both sample
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def cpu_s(self) -> float:
        """CPU seconds of the process and of every child seen so far (the parse workers); the
        peaks are read again too (at the run's end, they are the run's)."""
        with contextlib.suppress(psutil.Error):
            self.main_cpu = sum(self.proc.cpu_times()[:2])
        self._sample()
        return self.main_cpu + sum(self.children_cpu.values())

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self._sample()

    def _sample(self) -> None:
        with self._lock:
            self._sample_locked()

    def _sample_locked(self) -> None:
        try:
            self.peak_main = max(self.peak_main, peak_rss(self.proc))
            for child in self.proc.children(recursive=True):
                self.peak_children = max(self.peak_children, peak_rss(child))
                self.children_cpu[child.pid] = sum(child.cpu_times()[:2])
        except psutil.Error:
            pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def peak_rss(proc: psutil.Process) -> int:
    """The process's peak RSS so far: the kernel's ``VmHWM``, or its RSS now where that is absent."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return int(proc.memory_info().rss)


REEXEC_MARK = "BENCH_INGEST_REEXECUTED"  # set for the second start: never a third


def same_allocator(allocator: str) -> None:
    """Start this bench again under the executor's allocator unless it already is, so that its
    raw phase measures the same malloc as the executor (jemalloc as entrypoint.sh sets it). Only
    from the command line (``__main__``), and once: a preloaded jemalloc that fails to load is
    reported, not retried."""
    if allocator != "jemalloc" or loaded_jemalloc() is not None or not find_jemalloc():
        return
    if os.environ.get(REEXEC_MARK):
        print(
            f"jemalloc did not load (LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}): the raw phase runs on the system's malloc"
        )
        return
    sys.stdout.flush()
    env = {**preload_env(os.environ), REEXEC_MARK: "1"}
    os.execve(sys.executable, sys.orig_argv, env)  # noqa: S606 - this interpreter, as the user ran it


def executor_env(env: dict[str, str], allocator: str) -> dict[str, str]:
    """The executor's environment: jemalloc as entrypoint.sh sets it, or (``default``) with any
    jemalloc taken out of ``LD_PRELOAD`` and no ``MALLOC_CONF``: the system's malloc."""
    if allocator == "jemalloc":
        return preload_env(env)
    env = dict(env)
    kept = [lib for lib in env.pop("LD_PRELOAD", "").split(":") if lib and "libjemalloc" not in lib]
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    env.pop("MALLOC_CONF", None)
    return env


def wait_terminal(task_ids: list[str], timeout_s: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        with unit():
            states = dict(
                (s, n)
                for s, n in Task.select(Task.status, peewee.fn.COUNT(Task.id))
                .where(Task.id.in_(task_ids))
                .group_by(Task.status)
                .tuples()
            )
        if sum(n for s, n in states.items() if s in TERMINAL_STATES) >= len(task_ids):
            return states
        if time.monotonic() > deadline:
            raise TimeoutError(f"tasks not finished after {timeout_s} s: {states}")
        time.sleep(0.2)


def raw_encoder(settings: Settings) -> tuple[Any, str]:
    """The physical limit of the settings' backend: its encoder called directly on a list, with
    the settings' batch size and no cap on a batch's tokens (``INGEST_EMBEDDING_BATCH_TOKENS`` is
    the executor's choice, measured against this; run the bench with it at 0 to compare it off)."""
    batch = settings.embedding_batch
    if settings.embedding_backend == "torch":
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model = SentenceTransformer(settings.embedding_model, device="cpu")
        return (
            lambda texts: model.encode(texts, batch_size=batch, normalize_embeddings=True),
            "SentenceTransformer.encode",
        )
    from ingest.query_encoder import backend_encoder

    encoder = backend_encoder(settings)
    return (lambda texts: encoder.encode(texts, batch)), f"{settings.embedding_backend} encode (ONNX Runtime)"


def service_processes() -> dict[str, list[psutil.Process]]:
    """The local MariaDB and Redis servers (their CPU is the e2e phase's too: the raw phase has
    none); empty where they run elsewhere or cannot be read."""
    found: dict[str, list[psutil.Process]] = {"MariaDB": [], "Redis": []}
    for proc in psutil.process_iter(["name"]):
        name = proc.info["name"] or ""
        if name in ("mariadbd", "mysqld"):
            found["MariaDB"].append(proc)
        elif name.startswith("redis-server"):
            found["Redis"].append(proc)
    return found


def cpu_of(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += sum(proc.cpu_times()[:2])
    return total


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def encoder_seconds(port: int) -> float:
    """The executor's ``ingest_embed_seconds_total``: wall seconds inside encode calls."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ingest_embed_seconds_total")
    )


@dataclass
class EndToEnd:
    """One end-to-end run: the chunks the executor stored and what it took."""

    elapsed: float
    executor_cpu: float  # with its parse workers
    workers_cpu: float  # the parse workers' part
    encoder_busy_s: float  # wall seconds the executor's encoder spent in encode calls
    services_cpu: dict[str, float]
    contents: list[str]
    states: dict[str, int]
    tasks: int
    peak_main: int
    peak_children: int


def end_to_end(
    base: Settings, docs: list[tuple[str, bytes]], backend: str, allocator: str, timeout: float
) -> EndToEnd:
    """A fresh database, one executor, the documents submitted at once, timed to the last task."""
    from ingest.producer import submit_documents

    settings = fresh_settings(base).replace(embedding_backend=backend)
    close_database()
    init_database(settings.db_url)
    env = {
        **os.environ,
        "INGEST_DB_URL": settings.db_url,
        "INGEST_KEY_PREFIX": PREFIX,
        "INGEST_STAGGER_S": "0",
        "INGEST_LOG_LEVEL": "WARNING",
        "INGEST_EMBEDDING_BACKEND": backend,
        "INGEST_METRICS_PORT": str(port := free_port()),  # read twice: the encoder's busy seconds
    }
    executor = subprocess.Popen(
        [sys.executable, "-m", "executor", "bench_0"], cwd=ROOT, env=executor_env(env, allocator)
    )
    rss = ProcessWatch(executor.pid)
    services = service_processes()
    try:
        warm = [("warmup.txt", b"Warm up the model and a parse worker.")]
        wait_terminal(submit_documents(settings, warm, "warmup").task_ids, 300)

        before = {name: cpu_of(procs) for name, procs in services.items()}
        started, cpu_before = time.monotonic(), rss.cpu_s()
        workers_before = sum(rss.children_cpu.values())
        busy_before = encoder_seconds(port)
        result = submit_documents(settings, docs, "bench")
        states = wait_terminal(result.task_ids, timeout)
        elapsed, executor_cpu = time.monotonic() - started, rss.cpu_s() - cpu_before
        workers_cpu = sum(rss.children_cpu.values()) - workers_before
        encoder_busy_s = encoder_seconds(port) - busy_before
        services_cpu = {name: cpu_of(procs) - before[name] for name, procs in services.items() if procs}
    finally:
        executor.terminate()
        try:
            executor.wait(60)
        except subprocess.TimeoutExpired:
            executor.kill()
        rss.stop()
    with unit():
        contents = [
            c
            for (c,) in Chunk.select(Chunk.content)
            .where(Chunk.kb_id == result.kb_id)
            .order_by(Chunk.id)
            .tuples()
        ]
    return EndToEnd(
        elapsed,
        executor_cpu,
        workers_cpu,
        encoder_busy_s,
        services_cpu,
        contents,
        states,
        len(result.task_ids),
        rss.peak_main,
        rss.peak_children,
    )


def main(argv: list[str] | None = None, *, may_reexec: bool = False) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=240, help="documents to ingest (≥ 200)")
    parser.add_argument(
        "--runs", type=int, default=1, help="interleaved pairs (end to end, then raw); medians printed"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the drain")
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    parser.add_argument(
        "--allocator", choices=("jemalloc", "default"), default="jemalloc", help="executor malloc"
    )
    parser.add_argument(
        "--backend",
        choices=("torch", "onnx", "onnx-int8"),
        default="torch",
        help="INGEST_EMBEDDING_BACKEND of the executor, and of the raw baseline (onnx*: make the export first, "
        "`ingest model export [--int8]`)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="also write ingest_rate.png of this run there (the plots extra)",
    )
    args = parser.parse_args(argv)
    if may_reexec:
        same_allocator(args.allocator)
    if args.plot:
        from bench import plots  # before the run: a missing matplotlib fails at once

    base = Settings.from_env(os.environ)
    settings = fresh_settings(base).replace(embedding_backend=args.backend)
    docs = real_documents(args.docs)
    print(f"{len(docs)} documents, {sum(len(d) for _, d in docs) / 1e6:.1f} MB of text")
    wanted = executor_env(dict(os.environ), args.allocator)
    executor_malloc = (
        f"jemalloc ({next(lib for lib in wanted['LD_PRELOAD'].split(':') if 'libjemalloc' in lib)}, "
        f"MALLOC_CONF={wanted.get('MALLOC_CONF', 'its defaults')})"
        if "libjemalloc" in wanted.get("LD_PRELOAD", "")
        else "the system's malloc"
    )
    print(
        f"allocator: executor {executor_malloc}; this process (the raw phase) {describe_allocator(os.environ)[0]}"
    )

    encode: Any = None
    raw_name = ""
    raw_cpu = 0.0
    me = psutil.Process()
    ratios: list[float] = []
    per_cpu: list[float] = []
    e2e_rates: list[float] = []
    raw_rates: list[float] = []
    last: EndToEnd | None = None
    for run in range(1, max(1, args.runs) + 1):
        last = run_ = end_to_end(base, docs, args.backend, args.allocator, args.timeout)
        n = len(run_.contents)
        tag = f"run {run}: " if args.runs > 1 else ""
        print(f"{tag}{run_.tasks} tasks: {run_.states}; {n} chunks")
        print(
            f"{tag}end to end: {run_.elapsed:.1f} s, {n / run_.elapsed:.1f} chunks/s (submit → all terminal); "
            f"the encoder in encode calls {run_.encoder_busy_s:.1f} s "
            f"({100 * run_.encoder_busy_s / run_.elapsed:.0f} % of the run: the rest it waited for texts)"
        )
        print(
            f"{tag}executor CPU: {run_.executor_cpu:.1f} s with its parse workers, "
            f"{1000 * run_.executor_cpu / n:.1f} ms a chunk (the workers {1000 * run_.workers_cpu / n:.1f}); "
            + ", ".join(
                f"{name} {cpu:.1f} s ({1000 * cpu / n:.1f} ms a chunk)"
                for name, cpu in run_.services_cpu.items()
            )
        )
        if encode is None:
            encode, raw_name = raw_encoder(settings)
            encode(run_.contents[:64])  # warm up, as the executor was
        t0, cpu0 = time.monotonic(), sum(me.cpu_times()[:2])
        encode(run_.contents)
        raw_s, raw_cpu = time.monotonic() - t0, sum(me.cpu_times()[:2]) - cpu0
        e2e_rate, raw_rate = n / run_.elapsed, n / raw_s
        all_cpu = run_.executor_cpu + sum(run_.services_cpu.values())
        ratios.append(e2e_rate / raw_rate)
        per_cpu.append(raw_cpu / run_.executor_cpu)
        e2e_rates.append(e2e_rate)
        raw_rates.append(raw_rate)
        print(
            f"{tag}raw {raw_name}: {raw_s:.1f} s, {raw_rate:.1f} chunks/s (batch {settings.embedding_batch})"
        )
        print(
            f"{tag}raw CPU: {raw_cpu:.1f} s, {1000 * raw_cpu / n:.1f} ms a chunk; this process's RSS "
            f"{me.memory_info().rss / 2**20:.0f} MiB, peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
        )
        print(
            f"{tag}ratio end to end / raw: {ratios[-1]:.2f} (goal ≥ 0.95); per CPU second: {per_cpu[-1]:.2f} "
            f"(executor alone), {raw_cpu / all_cpu:.2f} (with the services)"
        )
        print(
            f"{tag}cores used on average: executor {run_.executor_cpu / run_.elapsed:.2f}, with the services "
            f"{all_cpu / run_.elapsed:.2f}; raw {raw_cpu / raw_s:.2f} of {os.cpu_count()} "
            "(on a shared machine either phase may get less)"
        )
        print(
            f"{tag}executor peak RSS: {run_.peak_main / 2**20:.0f} MiB; parse workers' peak: "
            f"{run_.peak_children / 2**20:.0f} MiB; load average now {os.getloadavg()[0]:.2f}"
        )
    if args.runs > 1:
        print(
            f"median of {args.runs} interleaved runs: end to end {statistics.median(e2e_rates):.1f} chunks/s, raw "
            f"{statistics.median(raw_rates):.1f}; ratio {statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}; "
            f"goal ≥ 0.95); per CPU second {statistics.median(per_cpu):.2f}"
        )
    assert last is not None
    if args.plot:
        n = len(last.contents)
        out = plots.ingest_rates(
            args.plot / "ingest_rate.png",
            end_to_end=e2e_rates[-1],
            raw=raw_rates[-1],
            executor_ms_per_chunk=1000 * last.executor_cpu / n,
            raw_ms_per_chunk=1000 * raw_cpu / n,
            chunks=n,
            documents=len(docs),
        )
        print(f"plot: {out}")
    if not args.keep:
        close_database()
        drop_database(settings.db_url)
        client = connect(settings)
        leftover = list(client.scan_iter(match=f"{PREFIX}:*", count=1000))
        if leftover:
            client.delete(*leftover)
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(may_reexec=True))
