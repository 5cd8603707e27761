"""Executors as real subprocesses (``python -m executor NAME``) for signal and kill tests."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import redis

from db.config import Settings
from db.keys import Keys
from db.streams import connect
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that makes a child process build exactly ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    for f in dataclasses.fields(Settings):
        env[Settings.env_name(f.name)] = str(getattr(settings, f.name))
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


class ExecutorProcess:
    """One ``python -m executor NAME`` child; its output goes to ``log_path``."""

    def __init__(self, settings: Settings, name: str, log_path: Path, *args: str, **env: str) -> None:
        self.settings = settings
        self.name = name
        self.log_path = log_path
        self.keys = Keys(settings.key_prefix)
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "executor", name, *args],
                env=settings_env(settings, **env),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def heartbeat(self) -> dict[str, Any] | None:
        client = connect(self.settings)
        try:
            raw = client.get(self.keys.executor(self.name))
        finally:
            client.close()
        return orjson.loads(raw) if raw else None

    def wait_ready(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """Until this process's heartbeat is written (it has not exited meanwhile)."""

        def ready() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"executor {self.name} exited with {self.proc.returncode}:\n{self.log()}"
                )
            beat = self.heartbeat()
            return beat if beat and beat.get("pid") == self.pid else None

        return wait_until(ready, timeout_s)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing cleaned up."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def wait(self, timeout_s: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; kill if it does not exit in time."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self) -> list[str]:
        return self.log().splitlines()

    def __enter__(self) -> ExecutorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A Redis of a test's own (AOF, fsync always) that it may kill and start again."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        try:
            wait_until(answers, 10)
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def __enter__(self) -> PrivateRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
