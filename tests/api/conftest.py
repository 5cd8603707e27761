"""API tests: one database and key prefix, one keyed server and one open server for the whole
run (each test acts for tenants of its own), and one executor for the tests that need tasks run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from db.config import Settings
from db.database import close_database
from db.keys import Keys
from db.schema import init_schema
from db.streams import Streams, connect
from tests.api.support import ADMIN_KEY, TENANT_KEYS, ApiServer
from tests.conftest import _delete_prefix, _drop_database, make_settings
from tests.procs import ExecutorProcess

OPEN_MAX_REQUEST_BYTES = 64 * 1024


@pytest.fixture(scope="session")
def api_settings() -> Iterator[Settings]:
    """The keyed server's settings: tenant keys, the admin key, a short single-use delay."""
    name = f"it_api_{uuid.uuid4().hex[:10]}"
    s = make_settings(
        name,
        api_keys=",".join(f"{t}={k}" for t, k in TENANT_KEYS.items()),
        api_admin_key=ADMIN_KEY,
        result_removal_delay_s=30.0,
    )
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


@pytest.fixture(scope="session")
def keyed(api_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(api_settings, tmp_path_factory.mktemp("keyed") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def open_server(api_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """No keys, a small body cap, one watcher at most."""
    s = api_settings.replace(
        api_keys="", api_admin_key="", api_max_request_bytes=OPEN_MAX_REQUEST_BYTES, api_max_watchers=1
    )
    server = ApiServer(s, tmp_path_factory.mktemp("open") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def executor(api_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExecutorProcess]:
    proc = ExecutorProcess(api_settings, "host_1", tmp_path_factory.mktemp("executor") / "ex.log")
    try:
        proc.wait_ready(60)
        yield proc
    finally:
        proc.stop()
