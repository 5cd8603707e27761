"""The health check: 200 only when this executor can really work, served from a thread.

``GET /`` on ``INGEST_HEALTHCHECK_PORT`` answers 200 with a JSON body when all of these hold,
otherwise 503 with the reasons in the body:

- the event loop ticked within the last :data:`LOOP_STALE_S` seconds (a task that blocks the
  loop, or a wedged loop, shows here: the endpoint runs in a thread of its own, not on the loop);
- Redis answered ``PING`` and the database answered ``SELECT 1`` within :data:`DEADLINE_S`, on
  the latest probe (each service is probed about every second by a thread of its own, on a
  connection of its own; the endpoint only reads the cached results, so it is cheap);
- the executor is not draining for a stop (SIGTERM). A recycle's drain (``recycling``: its
  running tasks finish, however long, then the process starts again) is a warning, not a 503:
  the container's health check would have the whole container replaced, handing back the long
  tasks the recycle lets finish.

The ``serving`` check says what this executor's own ports could not serve: connections shed at
the cap or cut for being slow (:mod:`executor.serving`), per port, and the process's thread
count. It is a warning (``warnings``, also in the heartbeat), not a reason for 503: a flood of
idle connections on a port is no reason to restart an executor that works.

The same verdict goes into the heartbeat (``health``), so ``ingest fleet`` shows it per executor.
``python -m executor.health`` checks every executor of this host (the compose health check).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from db.config import Settings
from db.database import DbUrl
from db.streams import connect
from executor.serving import SHED_RECENT_S, ServingStatistics, SmallServer

log = logging.getLogger("executor.health")

LOOP_STALE_S = 5.0  # the event loop must have ticked this recently
TICK_S = 0.5  # how often the loop ticks
PROBE_S = 1.0  # how often each service is probed
DEADLINE_S = 2.0  # a probe that takes longer is a failure


@dataclass
class ProbeState:
    """One service's latest probe, written by its probe thread, read by anyone."""

    ok: bool = False
    error: str = "not checked yet"
    latency_ms: float = 0.0
    checked_at: float = 0.0  # monotonic time the latest probe ended
    started_at: float = 0.0  # monotonic time the probe in flight began (0: none)

    def verdict(self, now: float, service: str) -> tuple[bool, str]:
        if self.started_at and now - self.started_at > DEADLINE_S:
            return False, f"{service}: no answer for {now - self.started_at:.1f} s"
        if not self.ok:
            return False, f"{service}: {self.error}"
        if now - self.checked_at > PROBE_S + 2 * DEADLINE_S:
            return False, f"{service}: last answer {now - self.checked_at:.1f} s ago"
        return True, ""


class RedisProbe:
    """``PING`` on a client of the probe's own, without hidden retries."""

    def __init__(self, settings: Settings) -> None:
        self.client = connect(
            settings, socket_timeout=DEADLINE_S, socket_connect_timeout=DEADLINE_S, retries=False
        )

    def ping(self) -> None:
        self.client.ping()

    def close(self) -> None:
        self.client.close()


class DatabaseProbe:
    """A read on a connection of the probe's own, opened again after any failure: ``SELECT 1``
    on MySQL; on SQLite, the schema's row count (``SELECT 1`` reads no file), on a connection
    that may not create the file (a path that lost its database is not made a new, empty one)."""

    def __init__(self, url: str) -> None:
        self.url = DbUrl.parse(url)
        self.conn: Any = None

    def _connect(self) -> Any:
        u = self.url
        if u.kind == "sqlite":
            uri = f"file:{urllib.parse.quote(u.name)}?mode=rw"
            return sqlite3.connect(uri, uri=True, timeout=DEADLINE_S, check_same_thread=False)
        import pymysql

        return pymysql.connect(
            host=u.host,
            port=u.port,
            user=u.user,
            password=u.password,
            database=u.name,
            connect_timeout=DEADLINE_S,
            read_timeout=DEADLINE_S,
            write_timeout=DEADLINE_S,
        )

    def ping(self) -> None:
        try:
            if self.conn is None:
                self.conn = self._connect()
            cur = self.conn.cursor()
            cur.execute("SELECT count(*) FROM sqlite_master" if self.url.kind == "sqlite" else "SELECT 1")
            cur.fetchall()
            cur.close()
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                self.conn.close()
        self.conn = None


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 200 else text[:200] + "…"


class Health:
    """The loop tick, the probes and the verdict; :meth:`serve` answers ``GET /`` from a thread."""

    def __init__(self, consumer: str, settings: Settings) -> None:
        self.consumer = consumer
        self.draining = False
        self.recycling = False  # the drain is a recycle's: a warning, not a reason
        self.loop_tick = time.monotonic()
        self.probes = {"redis": ProbeState(), "database": ProbeState()}
        self._probes: dict[str, Any] = {
            "redis": RedisProbe(settings),
            "database": DatabaseProbe(settings.db_url),
        }
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: SmallServer | None = None
        self.ports: dict[str, Callable[[], ServingStatistics | None]] = {}  # port name → its statistics

    # -- the loop's side ------------------------------------------------------------------
    def tick(self) -> None:
        self.loop_tick = time.monotonic()

    async def ticker(self) -> None:
        """Runs on the event loop: proves, every :data:`TICK_S`, that the loop turns."""
        import trio

        while True:
            self.tick()
            await trio.sleep(TICK_S)

    # -- probes --------------------------------------------------------------------------
    def start_probes(self) -> None:
        for service in self.probes:
            thread = threading.Thread(
                target=self._probe_loop, args=(service,), name=f"health-{service}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _probe_loop(self, service: str) -> None:
        state, probe = self.probes[service], self._probes[service]
        try:
            self._probe(state, probe)
        finally:
            probe.close()

    def _probe(self, state: ProbeState, probe: Any) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            state.started_at = began
            try:
                probe.ping()
            except Exception as exc:  # noqa: BLE001 - every failure is a verdict, never a crash
                state.ok, state.error = False, _short(exc)
            else:
                state.ok, state.error = True, ""
            ended = time.monotonic()
            state.latency_ms = round((ended - began) * 1000, 2)
            state.checked_at, state.started_at = ended, 0.0
            self._stop.wait(max(0.0, PROBE_S - (ended - began)))

    # -- the verdict -----------------------------------------------------------------------
    def verdict(self) -> tuple[bool, dict[str, Any]]:
        now = time.monotonic()
        reasons: list[str] = []
        age = now - self.loop_tick
        checks: dict[str, Any] = {"loop": {"ok": age <= LOOP_STALE_S, "last_tick_s": round(age, 3)}}
        if age > LOOP_STALE_S:
            reasons.append(f"event loop: no tick for {age:.1f} s")
        for service, state in self.probes.items():
            ok, why = state.verdict(now, service)
            checks[service] = {"ok": ok, "latency_ms": state.latency_ms, **({"error": why} if why else {})}
            if not ok:
                reasons.append(why)
        checks["serving"], warnings = self._serving()
        if self.draining and self.recycling:
            warnings.append("recycling: running tasks finish, then the process starts again")
        elif self.draining:
            reasons.append("draining")
        healthy = not reasons
        body = {
            "status": "ok" if healthy else "unhealthy",
            "executor": self.consumer,
            "draining": self.draining,
            "recycling": self.draining and self.recycling,
            "checks": checks,
            "reasons": reasons,
            "warnings": warnings,
        }
        return healthy, body

    def _serving(self) -> tuple[dict[str, Any], list[str]]:
        """What the ports could not serve (shed at their cap, cut for being slow), and the threads."""
        check: dict[str, Any] = {"threads": threading.active_count()}
        warnings: list[str] = []
        for name, statistics in self.ports.items():
            stats = statistics()
            if stats is None:
                continue
            check[name] = asdict(stats)
            if stats.last_shed_s is not None and stats.last_shed_s < SHED_RECENT_S:
                warnings.append(
                    f"{name} port: at its cap of {stats.max_connections} connections, shedding the "
                    f"oldest ({stats.shed} so far, {stats.timed_out} cut after the client timeout)"
                )
        check["ok"] = not warnings
        return check, warnings

    def summary(self) -> dict[str, Any]:
        """The heartbeat's ``health`` field."""
        healthy, body = self.verdict()
        return {"ok": healthy, "reasons": body["reasons"], "warnings": body["warnings"]}

    # -- serving ----------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Answer ``GET /`` on ``addr:port`` from one thread (:mod:`executor.serving`)."""
        self._server = SmallServer(addr, port, self._route, name="health-http")
        self.ports["health"] = self._server.statistics
        log.info("health check on http://%s:%d/", addr, port)

    def _route(self, path: str) -> tuple[int, str, bytes]:
        if path not in ("/", "/health", "/healthz"):
            return 404, "application/json", orjson.dumps({"error": "not found: GET / for the health check"})
        healthy, body = self.verdict()
        return 200 if healthy else 503, "application/json", orjson.dumps(body)

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
            self._server = None


# -- the container's health check: every executor of this host ---------------------------------


def check(port: int, timeout_s: float = 3.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=timeout_s) as resp:
            return resp.status == 200, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return False, exc.read().decode(errors="replace")
    except OSError as exc:
        return False, f"no answer on port {port}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m executor.health",
        description="Exit 0 when every executor of this host answers its health check with 200: "
        "ports base .. base + workers - 1 (what entrypoint.sh gives executors 0 .. workers - 1).",
    )
    parser.add_argument("--port", type=int, default=None, help="base port [env INGEST_HEALTHCHECK_PORT]")
    parser.add_argument(
        "--workers", type=int, default=None, help="executors on this host [env WS, default 1]"
    )
    args = parser.parse_args(argv)
    base = args.port if args.port is not None else int(os.environ.get("INGEST_HEALTHCHECK_PORT") or 0)
    workers = args.workers if args.workers is not None else int(os.environ.get("WS") or 1)
    if not base:
        print("health: no port (set INGEST_HEALTHCHECK_PORT or --port)", file=sys.stderr)
        return 2
    healthy = True
    for n in range(workers):
        ok, body = check(base + n)
        healthy &= ok
        if not ok:
            print(f"executor on port {base + n}: {body}", file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
