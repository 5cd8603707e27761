"""Batched upserts: ``bulk_insert_into_db``, the producer's way of writing many rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
import peewee

from db.database import database, is_mysql, unit
from db.models import now_ms

BATCH_SIZE = 1000
# A batch is cut before its rows' text passes this, whatever their count: one INSERT is one
# packet, and MySQL refuses one over max_allowed_packet (16 MiB by default).
BATCH_BYTES = 4 << 20
_KEEP_ON_CONFLICT = frozenset({"create_time", "create_date"})


def bulk_insert_into_db(
    model: type[peewee.Model],
    rows: Iterable[Mapping[str, Any]],
    replace_on_conflict: bool = False,
    *,
    batch_size: int = BATCH_SIZE,
) -> int:
    """Insert ``rows`` in batches of ``batch_size``, each batch in one transaction.

    With ``replace_on_conflict`` an existing row (same primary key) takes the new values of
    every column given, except ``create_time``, which it keeps. The caller's dicts are not
    changed and no table is created here (``ingest init`` does that). Returns rows written.
    """
    now = now_ms()
    prepared: list[dict[str, Any]] = []
    for row in rows:
        item = dict(row)
        item.setdefault("create_time", now)
        item["update_time"] = now
        prepared.append(item)
    if not prepared:
        return 0
    columns = sorted(set().union(*(r.keys() for r in prepared)))
    fields = model._meta.fields
    unknown = [c for c in columns if c not in fields]
    if unknown:
        raise ValueError(f"{model.__name__} has no column(s) {', '.join(unknown)}")
    for item in prepared:  # rows may name different columns: the rest take their defaults
        for c in columns:
            if c not in item:
                default = fields[c].default
                item[c] = default() if callable(default) else default
    preserve = [fields[c] for c in columns if c not in _KEEP_ON_CONFLICT and not fields[c].primary_key]
    conflict_target = [f for f in model._meta.get_primary_keys()]
    written = 0
    for batch in statement_batches(prepared, batch_size):
        with unit():
            query = model.insert_many(batch)
            if replace_on_conflict:
                if is_mysql():
                    query = query.on_conflict(preserve=preserve)
                else:
                    query = query.on_conflict(conflict_target=conflict_target, preserve=preserve)
            query.execute()
        written += len(batch)
    return written


def statement_batches(
    rows: Sequence[Mapping[str, Any]], max_rows: int, max_bytes: int = BATCH_BYTES
) -> Iterator[list[Any]]:
    """``rows`` in runs of at most ``max_rows`` rows and ``max_bytes`` of statement (a row over it
    goes alone): one INSERT is one packet, and MySQL refuses one over max_allowed_packet."""
    batch: list[Any] = []
    size = 0
    for row in rows:
        n = statement_bytes(row)
        if batch and (len(batch) >= max_rows or size + n > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += n
    if batch:
        yield batch


def statement_bytes(row: Mapping[str, Any]) -> int:
    """What a row adds to an INSERT, at most: its text's UTF-8 bytes and its binary values twice
    over (escaped, or hex), JSON as its text, and 256 for the rest."""
    n = 256
    for value in row.values():
        if isinstance(value, str):
            n += len(value.encode()) * 2
        elif isinstance(value, (bytes, bytearray)):
            n += len(value) * 2
        elif isinstance(value, (dict, list)):
            n += len(orjson.dumps(value)) * 2
    return n


def create_tables(models: Iterable[type[peewee.Model]]) -> None:
    with unit() as db:
        db.create_tables(list(models), safe=True)


__all__ = ["bulk_insert_into_db", "create_tables", "statement_batches", "BATCH_SIZE", "database"]
