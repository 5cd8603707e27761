"""The health check answers 200 only when the executor can work: 503 with the reason while its
Redis is stopped, while its database is unreachable, while its event loop is blocked, and while it
drains; 200 again once each comes back. ``ingest fleet`` shows the same verdict."""

from __future__ import annotations

import sqlite3

import orjson
import pytest
import trio

from db.database import DbUrl
from db.models import RUNNING
from executor import health as health_module
from ingest.status import fleet
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until, wait_until
from tests.observe import TASK_TYPES, TcpProxy, health, wait_health
from tests.procs import ExecutorProcess, PrivateRedis, free_port


def _through(db_url: str, port: int) -> str:
    u = DbUrl.parse(db_url)
    return f"mysql://{u.user}@127.0.0.1:{port}/{u.name}"


def _fleet_reasons(settings) -> list[str]:
    (beat,) = fleet(settings)
    return beat["health"]["reasons"]


def test_503_with_the_reason_while_redis_or_the_database_is_down_then_200(xsettings, db, tmp_path):
    with (
        PrivateRedis(tmp_path) as server,
        TcpProxy(DbUrl.parse(xsettings.db_url).port, DbUrl.parse(xsettings.db_url).host) as proxy,
    ):
        port = free_port()
        settings = xsettings.replace(
            redis_url=server.url,
            db_url=_through(xsettings.db_url, proxy.port),
            healthcheck_port=port,
            log_format="json",
        )
        with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
            proc.wait_ready()
            body = wait_health(port, 200)
            assert (
                body["status"] == "ok" and body["checks"]["redis"]["ok"] and body["checks"]["database"]["ok"]
            )
            assert wait_until(lambda: proc.heartbeat()["health"]["ok"], 10)

            server.kill()
            body = wait_health(port, 503, "redis")
            assert body["status"] == "unhealthy" and not body["checks"]["redis"]["ok"]
            server.start()
            wait_health(port, 200)

            proxy.stop()
            body = wait_health(port, 503, "database")
            assert body["checks"]["redis"]["ok"] and not body["checks"]["database"]["ok"]
            assert wait_until(lambda: any("database" in r for r in _fleet_reasons(settings)), 10)
            proxy.start()
            wait_health(port, 200, timeout_s=30)
            assert wait_until(lambda: _fleet_reasons(settings) == [], 10)
            assert proc.stop() == 0
        lines = proc.log_lines()
    records = [orjson.loads(line) for line in lines]  # every line is one JSON object
    messages = [r["message"] for r in records]
    for service in ("redis", "database"):  # each outage: one line when it begins, one when it ends
        began = sum(m.startswith(f"{service} unreachable") for m in messages)
        ended = sum(m.startswith(f"{service} back after") for m in messages)
        # an idle executor may make no database call while the proxy is down (the health probe's
        # SELECT 1 is not an outage of the work path), so only Redis must have logged one
        assert began == ended and (began >= 1 or service == "database"), messages


async def test_503_while_the_event_loop_is_blocked_and_while_draining(xsettings, streams, db, monkeypatch):
    monkeypatch.setattr(health_module, "LOOP_STALE_S", 0.5)
    port = free_port()
    settings = xsettings.replace(
        healthcheck_port=port, shutdown_grace_s=10, extra_handlers=f"{xsettings.extra_handlers},{TASK_TYPES}"
    )
    async with running_daemon(settings, "host_1") as daemon:
        await trio.to_thread.run_sync(wait_health, port, 200)
        assert await trio.to_thread.run_sync(health_module.main, ["--port", str(port), "--workers", "1"]) == 0
        async with trio.open_nursery() as nursery:
            seen: list[dict] = []

            async def watch() -> None:  # in a thread: the loop is about to be blocked
                seen.append(await trio.to_thread.run_sync(wait_health, port, 503, "event loop", 10))

            nursery.start_soon(watch)
            await trio.sleep(0.2)
            enqueue(streams, [task_spec("block_loop", seconds=2.5)])
        assert seen and not seen[0]["checks"]["loop"]["ok"]
        await trio.to_thread.run_sync(wait_health, port, 200)

        (tid,) = enqueue(streams, [task_spec("sleep", seconds=1.5)])
        await await_until(lambda: row(tid)["status"] == RUNNING, 10)
        daemon.request_stop(voluntary=True)  # a recycle: its task finishes, however long
        await trio.sleep(0.3)
        status, body = await trio.to_thread.run_sync(health, port)
        assert status == 200 and body["draining"] is True and body["recycling"] is True, body
        assert any("recycling" in w for w in body["warnings"])
        daemon.request_stop()  # then a SIGTERM: a stop's drain
        body = await trio.to_thread.run_sync(wait_health, port, 503, "draining", 5)
        assert body["draining"] is True and body["recycling"] is False


def test_the_sqlite_probe_reads_the_file_and_never_creates_one(tmp_path):
    """``SELECT 1`` answers without the file: the probe reads the schema, and a path that lost
    its database (a volume not mounted) is an error, not a new empty database."""
    from executor.health import DatabaseProbe

    missing = tmp_path / "gone" / "ingest.db"
    probe = DatabaseProbe(f"sqlite:///{missing}")
    with pytest.raises(sqlite3.OperationalError):
        probe.ping()
    assert not missing.exists()
    path = tmp_path / "ingest.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    probe = DatabaseProbe(f"sqlite:///{path}")
    probe.ping()
    path.write_bytes(b"not a database, a file overwritten" * 200)
    probe.close()
    with pytest.raises(sqlite3.DatabaseError):
        probe.ping()
    probe.close()
