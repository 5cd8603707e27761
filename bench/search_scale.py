"""Search at scale, per vector store backend: insert rate, search p50/p99, recall@10.

    .venv/bin/python bench/search_scale.py [--sizes 10000,100000] [--queries 50] [--dim 384]
        [--backends mysql,milvus-lite,milvus=http://127.0.0.1:19530] [--ef 0,256,512] [--plot DIR]
        [--vectors FILE.npy] [--keep] [--reuse]

One knowledge base of N chunks with synthetic vectors (normalised, drawn around 1,000 random
centres with heavy noise: a hard case for an HNSW index), or real ones with ``--vectors``,
written as chunk rows in a MariaDB database of the bench's own (dropped at the end) and, for
Milvus Lite, into a data directory under /tmp.
Reports for each N and backend: rows (or engine upserts) per second; search latency of the
whole search path below the embedding (``ingest.search.nearest``: for Milvus, the engine plus
the check of its hits against the rows), p50 and p99 over the queries; and recall@10 against
exact search (numpy over all N vectors). Synthetic queries are stored vectors moved a little
off; the mysql backend gets at most 10 of them above 100k chunks (a search there takes seconds).

``--vectors FILE.npy``: real embeddings (``bench/embed_texts.py`` makes them from a file of
texts): the first N rows are the chunks, the last ``--queries`` rows the queries (texts never
stored, as a user's question is not one of the chunks). ``--keep`` leaves the last size's rows and
server collections in place after the run; ``--reuse`` (one size; it keeps them too) then skips
writing again what the database and each server already hold of that size (the same count, and
in the database the same first and last vectors), and measures at once: a 1M load and its
index take 10-50 minutes on 2 cores, and a server's compaction goes on for as long again.

``--backends``: ``mysql``, ``milvus-lite`` (the default pair) and ``NAME=URL`` for any
``INGEST_VECTOR_STORE`` URL, e.g. ``milvus=http://127.0.0.1:19530`` for a Milvus server. On a
server the bench's collection (``chunks_d{dim}_`` of the model "synthetic") is dropped before
and after each size, and after the flush the bench waits until the server searches an index over
every row (built and loaded; the wait is printed on a line of its own) before it searches.
The chunk rows are written once per size whatever the backends (the engines' hits are
checked against them).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from db.config import Settings  # noqa: E402
from db.database import close_database, init_database, unit  # noqa: E402
from db.models import Chunk as ChunkRow  # noqa: E402
from db.models import Document, KnowledgeBase  # noqa: E402
from db.schema import init_schema  # noqa: E402
from ingest import ids, vectors  # noqa: E402
from ingest.search import nearest  # noqa: E402

MODEL = "synthetic"
ROWS_PER_INSERT = 1000
DEFAULT_BACKENDS = "mysql,milvus-lite"
MYSQL_QUERIES_ABOVE_100K = 10
INDEX_WAIT_S = 3600.0
MIN_INDEXED_ROWS = 1024  # Milvus indexes no smaller segment (indexCoord.minSegmentNumRowsToEnableIndex)


def parse_backends(text: str, folder: str) -> list[tuple[str, str]]:
    """``(name, INGEST_VECTOR_STORE URL)`` pairs of ``--backends`` (Milvus Lite under ``folder``)."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if "=" in item:
            name, url = (part.strip() for part in item.split("=", 1))
        elif item in ("mysql", "milvus-lite"):
            name, url = item, "mysql" if item == "mysql" else f"milvus:///{folder}/vectors.db"
        else:
            raise SystemExit(f"--backends: {item!r} is not mysql, milvus-lite or NAME=URL")
        out.append((name, url))
    return out


def is_server(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def drop_bench_collection(url: str, dim: int) -> None:
    """Drop the bench's own collection on a Milvus server (left by an earlier or killed run)."""
    from pymilvus import MilvusClient

    from ingest.milvus import collection_name

    client = MilvusClient(uri=url)
    try:
        name = collection_name(dim, MODEL)
        if client.has_collection(name):
            client.drop_collection(name)
    finally:
        client.close()


def wait_indexed(url: str, dim: int, rows: int) -> float:
    """Wait until the server searches an index over all ``rows`` rows; returns the seconds waited.

    The index built (``describe_index``) is not enough: until the query node has loaded the
    indexed segments it searches the rows in their growing segments, through Milvus's interim
    IVF index (nlist 128, nprobe 16 by default: recall@10 0.75 at 10k chunks here, 0.99 once
    the HNSW segments were loaded). So also every loaded segment must carry the index.
    ``pending_index_rows`` is not asked: at 1M on 2.3.5 it stayed at 926,000 (or 1,000,000)
    with every row indexed, every loaded segment indexed and the index "Finished". A segment
    under 1,024 rows is never indexed (Milvus's ``minSegmentNumRowsToEnableIndex``): it is
    searched whole, and not waited for (a 1M run's flush sealed a last one of 1,000 rows)."""
    from pymilvus import MilvusClient

    from ingest.milvus import collection_name

    client = MilvusClient(uri=url)
    name = collection_name(dim, MODEL)
    started = time.perf_counter()
    try:
        while True:
            info = client.describe_index(name, "vector")
            if int(info.get("indexed_rows", 0)) >= rows:
                loaded = client.list_loaded_segments(name)
                indexed = all(s.index_id or s.num_rows < MIN_INDEXED_ROWS for s in loaded)
                if sum(s.num_rows for s in loaded) == rows and indexed:
                    return time.perf_counter() - started
            if time.perf_counter() - started > INDEX_WAIT_S:
                raise SystemExit(f"{url}: index not built and loaded in {INDEX_WAIT_S:.0f} s: {info}")
            time.sleep(2.0)
    finally:
        client.close()


def filled(db_url: str, kb: vectors.KbRef, matrix: np.ndarray) -> bool:
    """Whether the database already holds the bench's knowledge base as ``matrix`` would write
    it: as many rows, and its first and last rows' vectors equal to the matrix's."""
    try:
        init_database(db_url)
        with unit():
            if ChunkRow.select().where(ChunkRow.kb_id == kb.kb_id).count() != len(matrix):
                return False
            ends = {0, len(matrix) - 1}
            stored = dict(
                ChunkRow.select(ChunkRow.id, ChunkRow.vector)
                .where(ChunkRow.id.in_([f"{i:032x}" for i in ends]))
                .tuples()
            )
    except Exception:  # noqa: BLE001 - no database or schema yet: nothing to reuse
        return False
    return all(bytes(stored.get(f"{i:032x}") or b"") == matrix[i].tobytes() for i in ends)


def server_rows(url: str, dim: int) -> int:
    """The rows of the bench's collection on a Milvus server (-1: no collection)."""
    from pymilvus import MilvusClient

    from ingest.milvus import collection_name

    client = MilvusClient(uri=url)
    try:
        name = collection_name(dim, MODEL)
        if not client.has_collection(name):
            return -1
        rows = client.query(name, filter="", output_fields=["count(*)"], consistency_level="Strong")
        return int(rows[0]["count(*)"]) if rows else 0
    finally:
        client.close()


def synthetic(n: int, dim: int, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((1000, dim)).astype(np.float32)
    out = centres[rng.integers(0, len(centres), n)] + 0.35 * rng.standard_normal((n, dim)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def fill_rows(kb: vectors.KbRef, matrix: np.ndarray) -> float:
    """The chunk rows (one document); returns rows per second."""
    doc_id = ids.doc_id(kb.kb_id, "synthetic")
    with unit():
        KnowledgeBase.create(id=kb.kb_id, name="scale", embedding_model=MODEL, embedding_dim=kb.dim)
        Document.create(id=doc_id, kb_id=kb.kb_id, name="synthetic", generation=1)
    started = time.perf_counter()
    for start in range(0, len(matrix), ROWS_PER_INSERT):
        rows = [
            {"id": f"{i:032x}", "kb_id": kb.kb_id, "doc_id": doc_id, "task_id": "t", "generation": 1,
             "position": i, "content": f"chunk {i}", "vector": matrix[i].tobytes()}
            for i in range(start, min(start + ROWS_PER_INSERT, len(matrix)))
        ]  # fmt: skip
        with unit():
            ChunkRow.insert_many(rows).execute()
    return len(matrix) / (time.perf_counter() - started)


def fill_engine(store: vectors.VectorStore, kb: vectors.KbRef, matrix: np.ndarray) -> float:
    doc_id = ids.doc_id(kb.kb_id, "synthetic")
    started = time.perf_counter()
    for start in range(0, len(matrix), ROWS_PER_INSERT):
        end = min(start + ROWS_PER_INSERT, len(matrix))
        store.upsert(kb, [vectors.VectorRow(f"{i:032x}", doc_id, "t", matrix[i]) for i in range(start, end)])
    store.flush()  # type: ignore[attr-defined]  # sealed into indexed segments, as a reindex does
    assert store.count(kb) == len(matrix)
    return len(matrix) / (time.perf_counter() - started)


def latencies(
    store: vectors.VectorStore, kb: vectors.KbRef, queries: np.ndarray
) -> tuple[list[float], list[list[str]]]:
    nearest(store, kb, queries[0], 10)  # warm: caches, the engine's index loaded
    times, found = [], []
    for q in queries:
        started = time.perf_counter()
        top = nearest(store, kb, q, 10)
        times.append(time.perf_counter() - started)
        found.append([cid for cid, _ in top])
    return times, found


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def run(
    size: int,
    dim: int,
    n_queries: int,
    db_url: str,
    backends: str = DEFAULT_BACKENDS,
    efs: tuple[int, ...] = (0,),
    *,
    real: np.ndarray | None = None,
    keep: bool = False,
    reuse: bool = False,
) -> list[dict[str, object]]:
    """One size on each backend: prints a line each, returns the figures (for ``--plot``).

    ``real``: the ``--vectors`` matrix (chunks first, the queries its last ``n_queries`` rows);
    ``keep`` leaves the rows and the server collections; ``reuse`` measures what a kept run left
    where it holds this ``size``'s rows (an insert rate of 0 is printed for what was not written)."""
    from tests.conftest import _drop_database

    measured: list[dict[str, object]] = []
    settings = Settings.from_env({}, db_url=db_url)
    kb = vectors.KbRef("default", ids.kb_id("default", "scale"), dim, MODEL)
    folder = tempfile.mkdtemp(prefix="bench-milvus-")
    chosen = parse_backends(backends, folder)
    servers = [url for _, url in chosen if is_server(url)]
    if real is None:
        matrix = synthetic(size, dim)
        rng = np.random.default_rng(11)
        picks = matrix[rng.integers(0, size, n_queries)] + 0.2 * rng.standard_normal((n_queries, dim)).astype(
            np.float32
        )
        queries = picks / np.linalg.norm(picks, axis=1, keepdims=True)
    else:
        matrix = np.ascontiguousarray(real[:size])
        queries = np.ascontiguousarray(real[len(real) - n_queries :])
    reusing = reuse and filled(db_url, kb, matrix)
    if reuse and not reusing:
        print(f"{size:>9,} --reuse: the database does not hold these {size:,} rows; writing them", flush=True)
    reused: set[str] = set()  # the servers whose collection a kept run left whole
    for url in servers:
        if reusing and server_rows(url, dim) == size:
            reused.add(url)
        else:
            drop_bench_collection(url, dim)
    if not reusing:
        _drop_database(db_url)
        init_schema(db_url)
    try:
        exact = [[f"{i:032x}" for i in np.argsort(-(matrix @ q), kind="stable")[:10]] for q in queries]
        rows_rate = 0.0 if reusing else fill_rows(kb, matrix)
        for name, url in chosen:
            store = vectors.use(settings.replace(vector_store=url))
            rate = rows_rate if store.exact or url in reused else fill_engine(store, kb, matrix)
            if is_server(url):
                waited = wait_indexed(url, dim, size)
                print(
                    f"{size:>9,} {name:<12} index built and loaded {waited:,.0f} s after the flush",
                    flush=True,
                )
            qs = queries if store.exact is False or size <= 100_000 else queries[:MYSQL_QUERIES_ABOVE_100K]
            for ef in (0,) if store.exact else efs:  # an engine: each search breadth asked for
                store = vectors.use(settings.replace(vector_store=url, vector_search_ef=ef))
                label = f"{name} ef {ef}" if ef else name
                times, found = latencies(store, kb, qs)
                recall = np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=False)])
                print(
                    f"{size:>9,} {label:<12} insert {rate:>9,.0f}/s  p50 {1000 * statistics.median(times):>8.1f} ms  "
                    f"p99 {1000 * pct(times, 99):>8.1f} ms  recall@10 {recall:.3f}  ({len(qs)} queries)",
                    flush=True,
                )
                measured.append(
                    {"size": size, "backend": label, "p50_ms": 1000 * statistics.median(times),
                     "p99_ms": 1000 * pct(times, 99), "recall": float(recall), "insert_rate": rate}
                )  # fmt: skip
    finally:
        vectors.close_all()
        close_database()
        shutil.rmtree(folder, ignore_errors=True)
        if not keep:
            _drop_database(db_url)
            for url in servers:
                drop_bench_collection(url, dim)
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--db-url", default="mysql://root@127.0.0.1:3306/bench_search_scale")
    parser.add_argument(
        "--backends",
        default=DEFAULT_BACKENDS,
        help="comma-separated: mysql, milvus-lite, NAME=URL (e.g. milvus=http://127.0.0.1:19530)",
    )
    parser.add_argument(
        "--ef",
        default="0",
        help="comma-separated HNSW search breadths to measure on each engine (0: the store's rule, "
        "max(64, 4 x the candidates asked)); INGEST_VECTOR_SEARCH_EF sets one for the product",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="also write search_latency.png of this run there (the plots extra)",
    )
    parser.add_argument(
        "--vectors",
        type=Path,
        metavar="FILE.npy",
        help="real embeddings (bench/embed_texts.py): the first N rows are the chunks, the last "
        "--queries rows the queries; --dim is the file's",
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the rows and server collection after the run"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="measure what a --keep run left, where it holds exactly N rows"
    )
    args = parser.parse_args(argv)
    parse_backends(args.backends, "")  # a wrong name fails before any work
    sizes = [int(s) for s in args.sizes.split(",")]
    real = None
    if args.vectors:
        real = np.load(args.vectors, mmap_mode="r")
        args.dim = real.shape[1]
        if max(sizes) + args.queries > len(real):
            raise SystemExit(
                f"{args.vectors} holds {len(real):,} vectors: fewer than {max(sizes):,} + {args.queries}"
            )
    if args.reuse and len(sizes) != 1:
        raise SystemExit("--reuse measures one size (what a --keep run of that size left)")
    efs = tuple(int(e) for e in args.ef.split(",") if e.strip())
    if args.plot:
        from bench import plots  # before the run: a missing matplotlib fails at once
    print(f"{'chunks':>9} {'backend':<12} (insert: rows/s for mysql, engine upserts/s for milvus)")
    measured = []
    for size in sizes:
        last = size == sizes[-1]
        measured += run(
            size,
            args.dim,
            args.queries,
            args.db_url,
            args.backends,
            efs,
            real=real,
            keep=(args.keep or args.reuse) and last,
            reuse=args.reuse,
        )
    if args.plot:
        print(f"plot: {plots.search_latency(args.plot / 'search_latency.png', measured)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
