"""The Milvus backend of the vector store (``pymilvus``): a server or cluster, or Milvus Lite.

``http(s)://HOST:19530`` talks to a Milvus server or cluster. ``milvus:///PATH.db`` (relative,
as sqlite URLs are; ``milvus:////abs/PATH.db`` absolute) is Milvus Lite: a data directory one
process at a time may open (it holds an exclusive ``flock`` on ``PATH.db/LOCK``; a second opener
gets ``DataDirLockedError``), and whose engine is not safe under concurrent writes to one
collection. So, with several processes on one host (executors, the CLI, the API):

- the first process to need the directory opens it and serves it in its own threads, a gRPC
  server on 127.0.0.1 whose write calls (insert, upsert, delete, collection and index changes,
  flush) take one lock, one at a time (searches run side by side); it writes the address to
  ``PATH.db.addr`` (replaced atomically);
- every other process finds the lock held and connects to that address, as to a server;
- when the owner exits (an executor recycled, a CLI run ended), the others' next call fails to
  connect: each one reopens once (one of them becomes the owner, the rest read its new
  address) and repeats the call. A call that still fails raises :class:`VectorStoreUnavailable`
  (retryable: the task is tried again in place).

One collection per vector space, ``chunks_d{dim}_{model hash}``, with the chunk id as primary
key and the tenant, knowledge base, document and task as fields; every search filters on tenant
and knowledge base, so one tenant's query never reads another's chunks. The index is HNSW on
inner product (the vectors are normalised; ``tenant_id`` and ``kb_id`` carry scalar indexes
that the filter reads, made with the collection or before it is next loaded), searched with
``ef`` of at least 4x the limit, or
``INGEST_VECTOR_SEARCH_EF`` where set (never below the limit, which Milvus requires): the
breadth trades recall for latency, and the right value depends on the data and the cores.

Reads: Milvus Lite sees every write at once; a server reads at the collection's consistency
level, Milvus's default Bounded. Searches keep it (Strong waits for the next time tick, about
0.2 s a search on a 2.3 standalone server): a chunk is found a moment after its write, and a
removed one that is still found is dropped by the check against the rows. The counts and id
lists (``ingest status``, reindex, the checks) read Strong, so they see every finished write.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import xxhash

from ingest.errors import RetryableError
from ingest.vectors import KbRef, VectorRow

log = logging.getLogger("ingest.milvus")
T = TypeVar("T")
PREFIX = "chunks_d"
UPSERT_BATCH = 1000
DELETE_BATCH = 500
CONNECT_WAIT_S = 15.0
HNSW_PARAMS = {"M": 16, "efConstruction": 200}
FILTERED = ("tenant_id", "kb_id")  # every search filters on both: each gets a scalar index
MAX_LIMIT = 16384  # Milvus's top-k cap


class VectorStoreUnavailable(RetryableError):
    """The vector engine could not be reached or refused a call."""


def collection_name(dim: int, model: str) -> str:
    return f"{PREFIX}{int(dim)}_{xxhash.xxh64_hexdigest(model.encode())}"


def collection_schema(dim: int) -> Any:
    """The fields of a collection: the chunk id (primary key), its tenant, knowledge base,
    document and task, and the vector."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=32)
    schema.add_field("tenant_id", DataType.VARCHAR, max_length=64)
    schema.add_field("kb_id", DataType.VARCHAR, max_length=32)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=32)
    schema.add_field("task_id", DataType.VARCHAR, max_length=32)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=int(dim))
    return schema


def scalar_index_types(server_version: str) -> tuple[str, ...]:
    """The scalar index types to ask for, the one the engine takes first: INVERTED on Milvus
    2.4 and later and on Milvus Lite (``milvus_lite-3.2.2``), Trie (marisa-trie) on a 2.3
    server (``v2.3.5-lite``), which refuses INVERTED ("index type not match")."""
    found = re.match(r"v?(\d+)\.(\d+)", server_version)
    if found and (int(found[1]), int(found[2])) < (2, 4):
        return ("Trie", "INVERTED")
    return ("INVERTED", "Trie")


def literal(value: str) -> str:
    """``value`` as a quoted string of Milvus's filter language."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _in(field: str, values: Sequence[str]) -> str:
    return f"{field} in [{', '.join(literal(v) for v in values)}]"


class MilvusStore:
    name = "milvus"
    exact = False

    def __init__(self, url: str, search_ef: int = 0) -> None:
        self.url = url
        self.search_ef = search_ef  # 0: the rule in ef()
        self.lite_path = lite_path(url) if url.startswith("milvus://") else None
        self._client: Any = None
        self._known: set[str] = set()
        self._lock = threading.Lock()

    # -- connection ---------------------------------------------------------------------------
    def _connect(self) -> Any:
        from pymilvus import MilvusClient

        uri = lite_uri(self.lite_path) if self.lite_path else self.url
        return MilvusClient(uri=uri, timeout=CONNECT_WAIT_S)

    def _call(self, what: Callable[[Any], T]) -> T:
        from pymilvus.exceptions import MilvusException

        for tries in (1, 2):
            try:
                with self._lock:
                    if self._client is None:
                        self._client = self._connect()
                    client = self._client
                return what(client)
            except (MilvusException, OSError, ConnectionError) as exc:
                log.warning("vector engine call failed (try %d): %s", tries, exc)
                with self._lock:
                    self._client, self._known = None, set()
                if tries == 2:
                    raise VectorStoreUnavailable(f"vector engine at {self.url}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _collection(self, client: Any, dim: int, model: str, *, create: bool) -> str | None:
        """The collection's name, made (``create``) and loaded on first use by this process.

        A loaded collection is used as it is. One that is not loaded (new, or released: a
        restarted server, a new Lite owner) gets the indexes it lacks before it is loaded: a
        2.3 server refuses to load a collection whose indexes changed while it was loaded
        ("can't change the index for loaded collection") until it is released, so a process
        that finds another one's new collection not loaded yet makes sure of every index
        before its load, never after, and a loaded collection's indexes are never changed."""
        from pymilvus.client.types import LoadState

        name = collection_name(dim, model)
        if name in self._known:
            return name
        created = False
        if not client.has_collection(name):
            if not create:
                return None
            client.create_collection(name, schema=collection_schema(dim))  # not loaded: indexed first
            created = True  # (Milvus Lite calls a new collection loaded at once)
        if created or client.get_load_state(name).get("state") != LoadState.Loaded:
            self._indexes(client, name)
            client.load_collection(name)
        self._known.add(name)
        return name

    def _indexes(self, client: Any, name: str) -> None:
        """The vector index and a scalar index on each field every search filters on, those the
        collection lacks (it is not loaded).

        Without a scalar index the engine compares the filter's strings with every row of every
        segment a search reads (at 1M chunks on a 2.3 server, 4 ms of a 10 ms search against
        2-3 ms with it: bench/README.md). Its type is chosen by the engine's version; one the
        engine refuses all the same gives way to the next, and where it refuses them all the
        collection is searched without one (logged). An index that another process made
        meanwhile counts as made."""
        from pymilvus.exceptions import MilvusException

        have = set(client.list_indexes(name))
        if "vector" not in have:
            params = client.prepare_index_params()
            params.add_index(field_name="vector", index_type="HNSW", metric_type="IP", params=HNSW_PARAMS)
            try:
                client.create_index(name, params)
            except MilvusException:
                if "vector" not in client.list_indexes(name):  # not a racer's: a real failure
                    raise
        types = scalar_index_types(str(client.get_server_version()))
        for field in FILTERED:
            if field in have:
                continue
            refused: list[str] = []
            for index_type in types:
                params = client.prepare_index_params()
                params.add_index(field_name=field, index_type=index_type)
                try:
                    client.create_index(name, params)
                    break
                except MilvusException as exc:
                    if field in client.list_indexes(name):
                        break  # another process's
                    refused.append(f"{index_type}: {exc.message}")
            else:
                log.warning("no scalar index on %s.%s (%s)", name, field, "; ".join(refused))

    def _collections(self, client: Any) -> list[str]:
        return [c for c in client.list_collections() if c.startswith(PREFIX)]

    # -- the interface ----------------------------------------------------------------------
    def upsert(self, kb: KbRef, rows: Sequence[VectorRow]) -> None:
        if not rows:
            return
        data = [
            {
                "id": r.id,
                "tenant_id": kb.tenant_id,
                "kb_id": kb.kb_id,
                "doc_id": r.doc_id,
                "task_id": r.task_id,
                "vector": np.asarray(r.vector, dtype=np.float32).tolist(),
            }
            for r in rows
        ]

        def work(client: Any) -> None:
            name = self._collection(client, kb.dim, kb.model, create=True)
            for start in range(0, len(data), UPSERT_BATCH):
                client.upsert(name, data[start : start + UPSERT_BATCH])

        self._call(work)

    def delete(
        self,
        *,
        ids: Sequence[str] = (),
        task_ids: Sequence[str] = (),
        doc_ids: Sequence[str] = (),
        kb_id: str | None = None,
    ) -> None:
        filters = [_in("id", ids[i : i + DELETE_BATCH]) for i in range(0, len(ids), DELETE_BATCH)]
        filters += [
            _in("task_id", task_ids[i : i + DELETE_BATCH]) for i in range(0, len(task_ids), DELETE_BATCH)
        ]
        filters += [
            _in("doc_id", doc_ids[i : i + DELETE_BATCH]) for i in range(0, len(doc_ids), DELETE_BATCH)
        ]
        if kb_id:
            filters.append(f"kb_id == {literal(kb_id)}")
        if not filters:
            return

        def work(client: Any) -> None:
            for name in self._collections(client):
                for expr in filters:
                    client.delete(name, filter=expr)

        self._call(work)

    def ef(self, limit: int) -> int:
        """The HNSW search breadth for ``limit`` hits: the setting, else max(64, 4 x limit)."""
        return max(limit, self.search_ef) if self.search_ef > 0 else max(64, 4 * limit)

    def search(self, kb: KbRef, query_vector: np.ndarray, limit: int) -> list[tuple[str, float]]:
        limit = min(int(limit), MAX_LIMIT)
        vector = np.asarray(query_vector, dtype=np.float32).tolist()

        def work(client: Any) -> list[tuple[str, float]]:
            name = self._collection(client, kb.dim, kb.model, create=False)
            if name is None:
                return []
            found = client.search(
                name,
                data=[vector],
                filter=f"tenant_id == {literal(kb.tenant_id)} and kb_id == {literal(kb.kb_id)}",
                limit=limit,
                output_fields=["id"],
                search_params={"metric_type": "IP", "params": {"ef": self.ef(limit)}},
            )
            return [(str(hit["id"]), float(hit["distance"])) for hit in found[0]]

        return self._call(work)

    def count(self, kb: KbRef) -> int:
        def work(client: Any) -> int:
            name = self._collection(client, kb.dim, kb.model, create=False)
            if name is None:
                return 0
            rows = client.query(
                name,
                filter=f"tenant_id == {literal(kb.tenant_id)} and kb_id == {literal(kb.kb_id)}",
                output_fields=["count(*)"],
                consistency_level="Strong",
            )
            return int(rows[0]["count(*)"]) if rows else 0

        return self._call(work)

    def flush(self) -> None:
        """Seal what the engine holds in memory into indexed segments (after a bulk load)."""

        def work(client: Any) -> None:
            for name in self._collections(client):
                client.flush(name)

        self._call(work)

    def chunk_ids(self, kb: KbRef, limit: int = MAX_LIMIT) -> list[str]:
        """The chunk ids the engine holds for the knowledge base (up to ``limit``; for checks)."""

        def work(client: Any) -> list[str]:
            name = self._collection(client, kb.dim, kb.model, create=False)
            if name is None:
                return []
            rows = client.query(
                name,
                filter=f"kb_id == {literal(kb.kb_id)}",
                output_fields=["id"],
                limit=limit,
                consistency_level="Strong",
            )
            return [str(r["id"]) for r in rows]

        return self._call(work)

    def chunk_id_pages(self, kb: KbRef, page: int = 1000) -> Iterator[list[str]]:
        """Every chunk id the engine holds for the knowledge base, a page at a time (reindex's
        sweep of ids with no row). Each page is its own call: a failure raises
        :class:`VectorStoreUnavailable` as any call does."""
        opened = self._call(lambda client: self._id_iterator(client, kb, page))
        if opened is None:
            return
        try:
            while True:
                ids = self._call(lambda _client: [str(r["id"]) for r in opened.next()])
                if not ids:
                    return
                yield ids
        finally:
            with contextlib.suppress(Exception):
                opened.close()

    def _id_iterator(self, client: Any, kb: KbRef, page: int) -> Any:
        name = self._collection(client, kb.dim, kb.model, create=False)
        if name is None:
            return None
        return client.query_iterator(
            name,
            batch_size=page,
            filter=f"kb_id == {literal(kb.kb_id)}",
            output_fields=["id"],
        )

    def close(self) -> None:
        with self._lock:
            client, self._client, self._known = self._client, None, set()
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        if self.lite_path:
            release_lite(self.lite_path)


# -- Milvus Lite: one owner per data directory, the others its clients --------------------------

_served: dict[str, tuple[Any, Any, int]] = {}  # data dir -> (grpc server, MilvusLite, port)
_served_lock = threading.Lock()
_WRITE_CALLS = (
    "Insert", "Upsert", "Delete", "CreateCollection", "DropCollection", "CreateIndex", "DropIndex",
    "Flush", "TruncateCollection", "CreatePartition", "DropPartition", "ManualCompaction",
)  # fmt: skip


def lite_path(url: str) -> str:
    if not url.startswith("milvus:///") or len(url) <= len("milvus:///"):
        raise ValueError(
            f"a Milvus Lite URL is milvus:///relative/PATH.db or milvus:////abs/PATH.db: {url!r}"
        )
    return os.path.abspath(url[len("milvus:///") :])


def address_file(path: str) -> str:
    return f"{path}.addr"


def lite_uri(path: str) -> str:
    """The address of the server of Milvus Lite directory ``path``: this process's own when it
    could take the directory's lock, else the owner's (from ``PATH.addr``, once it answers)."""
    with _served_lock:
        if path in _served:
            return f"http://127.0.0.1:{_served[path][2]}"
        port = _serve(path)
        if port is not None:
            return f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        port = _owner_port(path)
        if port is not None:
            return f"http://127.0.0.1:{port}"
        if time.monotonic() > deadline:
            raise VectorStoreUnavailable(f"Milvus Lite at {path}: its owner process gives no address")
        time.sleep(0.1)
        with _served_lock:  # the owner may have exited meanwhile: take over
            port = _serve(path)
            if port is not None:
                return f"http://127.0.0.1:{port}"


def _owner_port(path: str) -> int | None:
    try:
        with open(address_file(path)) as f:
            port = int(f.read().strip())
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return port
    return None


def _serve(path: str) -> int | None:
    """Open and serve ``path`` here; None when another process holds it. Call under the lock."""
    from concurrent import futures

    import grpc
    from milvus_lite.adapter.grpc.servicer import MilvusServicer
    from milvus_lite.db import MilvusLite
    from milvus_lite.exceptions import DataDirLockedError
    from pymilvus.grpc_gen import milvus_pb2_grpc

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        db = MilvusLite(path)
    except DataDirLockedError:
        return None
    servicer = MilvusServicer(db)
    write_lock = threading.Lock()
    for call in _WRITE_CALLS:
        method = getattr(servicer, call, None)
        if method is not None:
            setattr(servicer, call, _one_at_a_time(method, write_lock))
    limit = 256 * 1024 * 1024
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)],
    )
    milvus_pb2_grpc.add_MilvusServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = f"{address_file(path)}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, address_file(path))
    _served[path] = (server, db, port)
    log.info("serving Milvus Lite %s on 127.0.0.1:%d", path, port)
    return int(port)


def _one_at_a_time(method: Callable[..., Any], lock: threading.Lock) -> Callable[..., Any]:
    def call(request: Any, context: Any) -> Any:
        with lock:
            return method(request, context)

    return call


def release_lite(path: str) -> None:
    """Stop serving ``path`` from this process (its lock goes; another process may take it)."""
    with _served_lock:
        entry = _served.pop(path, None)
    if entry is None:
        return
    server, db, port = entry
    with contextlib.suppress(Exception):
        server.stop(grace=1).wait(2)
    with contextlib.suppress(Exception):
        db.close()
    with contextlib.suppress(OSError):
        with open(address_file(path)) as f:
            mine = f.read().strip() == str(port)
        if mine:
            os.unlink(address_file(path))


@atexit.register
def _release_all() -> None:
    for path in list(_served):
        release_lite(path)
