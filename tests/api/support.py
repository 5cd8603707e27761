"""Helpers for API tests: a real ``python -m ingest.api`` process and clients of it."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from db.config import Settings
from tests.helpers import wait_until
from tests.procs import ROOT, free_port, settings_env

ADMIN_KEY = "admin-key-0123456789"
TENANT_KEYS = {"alpha": "alpha-key-0123", "beta": "beta-key-4567"}


def new_tenant() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


class ApiServer:
    """One server process on a free port; its output goes to ``log_path``."""

    def __init__(self, settings: Settings, log_path: Path, *args: str, **env: str) -> None:
        self.settings = settings.replace(api_port=free_port())
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{self.settings.api_port}"
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ingest.api", *args],
                env=settings_env(self.settings, **env),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout_s: float = 30.0, *, healthy: bool = True) -> None:
        def answers() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.base_url + "/healthz", timeout=5)
            except httpx.TransportError:
                return False
            return r.status_code == 200 or not healthy

        wait_until(answers, timeout_s, interval_s=0.1)

    def client(self, *, tenant: str | None = None, key: str | None = None, **kw: Any) -> httpx.Client:
        headers = {}
        if tenant is not None:
            headers[self.settings.api_tenant_header] = tenant
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=kw.pop("timeout", 30), **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)


def read_events(response: httpx.Response, *, limit: int = 200) -> list[tuple[str, Any]]:
    """The (event, data) pairs of a server-sent-event stream until it closes."""
    events: list[tuple[str, Any]] = []
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: ") and name is not None:
            events.append((name, orjson.loads(line[len("data: ") :])))
            name = None
            if len(events) >= limit:
                break
    return events
