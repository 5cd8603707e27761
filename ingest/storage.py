"""Where documents' bytes live, so an executor on any host can read what a producer stored.

``INGEST_STORAGE_URL`` chooses: empty (the default) stores them in the database itself, in
parts small enough for MySQL's packet limit; ``file:///DIR`` stores them under a directory that
every host mounts. Another store (an object store) fits behind the same small interface.
``put_many`` stores many documents at once (the producer's batches): one transaction for the
database, instead of one a document.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Protocol
from urllib.parse import unquote, urlparse

import peewee

from db.config import redact_url
from db.database import unit
from db.models import DocumentBlob

PART_BYTES = 1 << 20  # 1 MiB: well under max_allowed_packet (16 MiB by default)
STATEMENT_BYTES = 4 << 20  # parts per INSERT: escaped, still well under the packet limit
DEADLOCK_TRIES = 4  # a write that lost a deadlock (InnoDB rolled it back whole) runs again


class Storage(Protocol):
    def put(self, location: str, data: bytes) -> None: ...
    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None: ...
    def get(self, location: str) -> bytes: ...
    def delete(self, location: str) -> None: ...


def location_for(kb_id: str, doc_id: str, content_hash: str) -> str:
    return f"{kb_id}/{doc_id}/{content_hash}"


def _deadlocked(exc: BaseException) -> bool:
    args: tuple[object, ...] = getattr(exc, "args", ())
    return bool(args) and args[0] in (1213, 1205)  # deadlock, lock wait timeout


def _retrying_deadlocks(write: Callable[[], None]) -> None:
    """``write`` (one whole transaction) again when it lost a deadlock: parallel submits delete
    absent parts (gap locks) and insert into the same gaps, and InnoDB picks one to roll back."""
    for attempt in range(1, DEADLOCK_TRIES + 1):
        try:
            write()
            return
        except peewee.OperationalError as exc:
            if not _deadlocked(exc) or attempt == DEADLOCK_TRIES:
                raise
            time.sleep(random.uniform(0.01, 0.05) * attempt)  # noqa: S311 - jitter, not a secret


class DatabaseStorage:
    """Bytes in the ``document_blob`` table; each call is its own transaction."""

    def put(self, location: str, data: bytes) -> None:
        rows = [
            {"location": location, "part": i, "data": data[off : off + PART_BYTES]}
            for i, off in enumerate(range(0, max(len(data), 1), PART_BYTES))
        ]

        def write() -> None:
            with unit():
                DocumentBlob.delete().where(DocumentBlob.location == location).execute()
                for row in rows:  # one statement a part keeps each packet small
                    DocumentBlob.insert(row).execute()

        _retrying_deadlocks(write)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Store several documents in one transaction, several parts per statement."""
        if items:
            _retrying_deadlocks(lambda: self._put_many(items))

    def _put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        with unit():
            locations = sorted({loc for loc, _ in items})
            for start in range(0, len(locations), 1000):
                DocumentBlob.delete().where(
                    DocumentBlob.location.in_(locations[start : start + 1000])
                ).execute()
            batch: list[dict[str, object]] = []
            size = 0
            for location, data in dict(items).items():
                for i, off in enumerate(range(0, max(len(data), 1), PART_BYTES)):
                    part = data[off : off + PART_BYTES]
                    if batch and size + len(part) > STATEMENT_BYTES:
                        DocumentBlob.insert_many(batch).execute()
                        batch, size = [], 0
                    batch.append({"location": location, "part": i, "data": part})
                    size += len(part) + 64
            if batch:
                DocumentBlob.insert_many(batch).execute()

    def get(self, location: str) -> bytes:
        with unit():
            parts = list(
                DocumentBlob.select(DocumentBlob.data)
                .where(DocumentBlob.location == location)
                .order_by(DocumentBlob.part)
                .tuples()
            )
        if not parts:
            raise FileNotFoundError(f"no stored bytes at {location!r}")
        return b"".join(bytes(p[0]) for p in parts)

    def delete(self, location: str) -> None:
        with unit():
            DocumentBlob.delete().where(DocumentBlob.location == location).execute()


class FileStorage:
    """Bytes as files under a directory every host mounts (written atomically).

    A location never leaves the directory: an empty, absolute or ``..`` location is refused, and
    so is one whose real path (links resolved) is outside the directory's real path, e.g. a link
    somebody planted inside it. The final name is opened without following a link at all.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, location: str) -> str:
        """The file's path under the root; ValueError for a location outside it."""
        parts = location.split("/")
        if not location or location.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"location escapes the storage directory: {location!r}")
        root = os.path.realpath(self.root)
        path = os.path.join(root, *parts)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise ValueError(f"location {location!r} resolves outside the storage directory {self.root}")
        return path

    def put(self, location: str, data: bytes) -> None:
        path = self._path(location)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._path(location)  # a folder link swapped in while the folders were made
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)  # replaces a link at ``path`` itself, never writes through it
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        for location, data in items:
            self.put(location, data)

    def get(self, location: str) -> bytes:
        fd = os.open(self._path(location), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def delete(self, location: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(location))


def open_storage(storage_url: str) -> Storage:
    """The store named by ``INGEST_STORAGE_URL`` (empty or ``db:`` = the database)."""
    if not storage_url or storage_url in ("db", "db:", "database"):
        return DatabaseStorage()
    parsed = urlparse(storage_url)
    if parsed.scheme == "file":
        return FileStorage(unquote(parsed.path))
    raise ValueError(
        f"unsupported INGEST_STORAGE_URL {redact_url(storage_url)!r}: use file:///DIR or leave it empty"
    )
