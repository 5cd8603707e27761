"""Benchmark: documents → searchable chunks through one executor, against the raw encode rate.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/ingest.py [--docs 240] [--keep] [--backend torch|onnx|onnx-int8] [--plot DIR]

Documents are real text found on the machine: the licences in /usr/share/common-licenses and
the ``copyright`` files under /usr/share/doc (UTF-8 ones, duplicates dropped). The bench uses a
database and key prefix of its own (dropped at the start, so no digest reuse), starts one
executor (``python -m executor bench_0``), warms it up with one small document (the model
load is not what is measured), then submits all documents through the producer
(``ingest.producer.submit_documents``) and times until every task is terminal. Then, in this
process, ``SentenceTransformer.encode`` embeds the very chunks the executor stored, with the
same batch size: the physical limit. It prints chunks/s end to end, the raw rate, their ratio
(goal ≥ 0.9) and the executor's peak RSS (and its parse workers').

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
import subprocess
import sys
import threading
import time
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
    """Samples a process's RSS (and its children's) every 0.1 s in a thread, and CPU times."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_main = self.peak_children = 0
        self.main_cpu = 0.0
        self.children_cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def cpu_s(self) -> float:
        """CPU seconds of the process and of every child seen so far (the parse workers)."""
        with contextlib.suppress(psutil.Error):
            self.main_cpu = sum(self.proc.cpu_times()[:2])
        return self.main_cpu + sum(self.children_cpu.values())

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.peak_main = max(self.peak_main, self.proc.memory_info().rss)
                for child in self.proc.children(recursive=True):
                    self.peak_children = max(self.peak_children, child.memory_info().rss)
                    self.children_cpu[child.pid] = sum(child.cpu_times()[:2])
            except psutil.Error:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def find_jemalloc() -> str:
    for path in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"):
        if os.path.exists(path):
            return path
    return ""


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
    """The physical limit of the settings' backend: its encoder called directly on a list."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=240, help="documents to ingest (≥ 200)")
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
    if args.plot:
        from bench import plots  # before the run: a missing matplotlib fails at once

    from ingest.producer import submit_documents

    settings = fresh_settings(Settings.from_env(os.environ)).replace(embedding_backend=args.backend)
    init_database(settings.db_url)
    docs = real_documents(args.docs)
    print(f"{len(docs)} documents, {sum(len(d) for _, d in docs) / 1e6:.1f} MB of text")

    env = {
        **os.environ,
        "INGEST_DB_URL": settings.db_url,
        "INGEST_KEY_PREFIX": PREFIX,
        "INGEST_STAGGER_S": "0",
        "INGEST_LOG_LEVEL": "WARNING",
        "INGEST_EMBEDDING_BACKEND": args.backend,
    }
    jemalloc = "" if args.allocator == "default" else find_jemalloc()
    if jemalloc:  # as entrypoint.sh runs executors
        env["LD_PRELOAD"] = jemalloc + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    print(f"executor allocator: {jemalloc or 'glibc malloc'}")
    executor = subprocess.Popen([sys.executable, "-m", "executor", "bench_0"], cwd=ROOT, env=env)
    rss = ProcessWatch(executor.pid)
    try:
        warm = [("warmup.txt", b"Warm up the model and a parse worker.")]
        wait_terminal(submit_documents(settings, warm, "warmup").task_ids, 300)

        started, cpu_before = time.monotonic(), rss.cpu_s()
        result = submit_documents(settings, docs, "bench")
        states = wait_terminal(result.task_ids, args.timeout)
        elapsed, executor_cpu = time.monotonic() - started, rss.cpu_s() - cpu_before
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
    print(f"{len(result.task_ids)} tasks: {states}; {len(contents)} chunks")
    print(f"end to end: {elapsed:.1f} s, {len(contents) / elapsed:.1f} chunks/s (submit → all terminal)")
    print(
        f"executor CPU: {executor_cpu:.1f} s with its parse workers, {1000 * executor_cpu / len(contents):.1f} ms a chunk"
    )

    encode, raw_name = raw_encoder(settings)
    encode(contents[:64])  # warm up, as the executor was
    me = psutil.Process()
    t0, cpu0 = time.monotonic(), sum(me.cpu_times()[:2])
    encode(contents)
    raw_s, raw_cpu = time.monotonic() - t0, sum(me.cpu_times()[:2]) - cpu0
    e2e_rate, raw_rate = len(contents) / elapsed, len(contents) / raw_s
    print(f"raw {raw_name}: {raw_s:.1f} s, {raw_rate:.1f} chunks/s (batch {settings.embedding_batch})")
    print(
        f"raw CPU: {raw_cpu:.1f} s, {1000 * raw_cpu / len(contents):.1f} ms a chunk; this process's RSS {me.memory_info().rss / 2**20:.0f} MiB"
    )
    print(
        f"ratio end to end / raw: {e2e_rate / raw_rate:.2f} (goal ≥ 0.9); per CPU second: {raw_cpu / executor_cpu:.2f}"
    )
    print(
        f"cores used on average: executor {executor_cpu / elapsed:.2f}, raw {raw_cpu / raw_s:.2f} of "
        f"{os.cpu_count()} (on a shared machine either phase may get less)"
    )
    print(
        f"executor peak RSS: {rss.peak_main / 2**20:.0f} MiB; parse workers' peak: {rss.peak_children / 2**20:.0f} MiB"
    )
    print(
        f"load average now: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (others' work slows either phase)"
    )
    if args.plot:
        out = plots.ingest_rates(
            args.plot / "ingest_rate.png",
            end_to_end=e2e_rate,
            raw=raw_rate,
            executor_ms_per_chunk=1000 * executor_cpu / len(contents),
            raw_ms_per_chunk=1000 * raw_cpu / len(contents),
            chunks=len(contents),
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
    sys.exit(main())
