"""Dashboard tests: one database and key prefix, one real ``ingest serve`` process, one real
executor (the real parse handler and model, plus the cheap test types) and one headless
Chromium (Debian's, through Playwright) for the whole module."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from db.config import Settings
from db.database import close_database
from db.keys import Keys
from db.schema import init_schema
from db.streams import Streams, connect
from tests.api.support import ApiServer
from tests.conftest import _delete_prefix, _drop_database, make_settings
from tests.handlers import EXTRA_HANDLERS
from tests.procs import ROOT, ExecutorProcess, free_port, settings_env

CHROMIUM = "/usr/bin/chromium"
ADMIN_KEY = "web-admin-key-0123456789"
TENANT_KEYS = {"alpha": "alpha-web-key-0123", "beta": "beta-web-key-4567"}

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


class WebServer(ApiServer):
    """``python -m ingest serve --port N`` (the ``ingest serve`` verb) on a free port."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings.replace(api_port=free_port())
        self.base_url = f"http://127.0.0.1:{self.settings.api_port}"
        self.log_path = log_path
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ingest", "serve", "--port", str(self.settings.api_port)],
                env=settings_env(self.settings),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )


@pytest.fixture(scope="module")
def web_settings() -> Iterator[Settings]:
    name = f"it_web_{uuid.uuid4().hex[:10]}"
    s = make_settings(
        name,
        api_keys=",".join(f"{t}={k}" for t, k in TENANT_KEYS.items()),
        api_admin_key=ADMIN_KEY,
        extra_handlers=EXTRA_HANDLERS,
        embedding_batch=4,
        max_concurrent_tasks=4,
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


@pytest.fixture(scope="module")
def server(web_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    server = WebServer(web_settings, tmp_path_factory.mktemp("web") / "server.log")
    try:
        server.wait_ready(60)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def executor(web_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExecutorProcess]:
    proc = ExecutorProcess(web_settings, "web_1", tmp_path_factory.mktemp("executor") / "ex.log")
    try:
        proc.wait_ready(60)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``WEB_SCREENSHOTS`` (docs/screenshots/ holds a committed set)."""
    folder = os.environ.get("WEB_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
