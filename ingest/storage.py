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
import tempfile
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import unquote, urlparse

from db.database import unit
from db.models import DocumentBlob

PART_BYTES = 1 << 20  # 1 MiB: well under max_allowed_packet (16 MiB by default)
STATEMENT_BYTES = 4 << 20  # parts per INSERT: escaped, still well under the packet limit


class Storage(Protocol):
    def put(self, location: str, data: bytes) -> None: ...
    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None: ...
    def get(self, location: str) -> bytes: ...
    def delete(self, location: str) -> None: ...


def location_for(kb_id: str, doc_id: str, content_hash: str) -> str:
    return f"{kb_id}/{doc_id}/{content_hash}"


class DatabaseStorage:
    """Bytes in the ``document_blob`` table; each call is its own transaction."""

    def put(self, location: str, data: bytes) -> None:
        rows = [
            {"location": location, "part": i, "data": data[off : off + PART_BYTES]}
            for i, off in enumerate(range(0, max(len(data), 1), PART_BYTES))
        ]
        with unit():
            DocumentBlob.delete().where(DocumentBlob.location == location).execute()
            for row in rows:  # one statement a part keeps each packet small
                DocumentBlob.insert(row).execute()

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Store several documents in one transaction, several parts per statement."""
        if not items:
            return
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
    """Bytes as files under a directory every host mounts (written atomically)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, location: str) -> str:
        path = os.path.normpath(os.path.join(self.root, location))
        if not path.startswith(os.path.normpath(self.root) + os.sep):
            raise ValueError(f"location escapes the storage directory: {location!r}")
        return path

    def put(self, location: str, data: bytes) -> None:
        path = self._path(location)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        for location, data in items:
            self.put(location, data)

    def get(self, location: str) -> bytes:
        with open(self._path(location), "rb") as fh:
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
    raise ValueError(f"unsupported INGEST_STORAGE_URL {storage_url!r}: use file:///DIR or leave it empty")
