"""Issue 17 hole 5: a daemon stops when asked at any point, also during its start-up while Redis or
the database cannot be reached or refuses the password (it used to take SIGKILL after 40 s)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from db.database import DbUrl
from tests.helpers import wait_until
from tests.procs import ExecutorProcess, free_port
from tests.reliability.support import fleet_settings


def _closed_db(db_url: str) -> str:
    u = DbUrl.parse(db_url)
    return f"mysql://{u.user}@127.0.0.1:{free_port()}/{u.name}"


@pytest.fixture
def password_redis(tmp_path):
    """A private redis-server that wants a password the executor does not have."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--requirepass", "s3cret"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"redis://:wrong-password@127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _stops_within(settings, tmp_path, waiting_for: str, within_s: float = 5.0) -> str:
    with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
        wait_until(lambda: waiting_for in proc.log(), 20)
        time.sleep(0.5)  # well into the backoff
        asked = time.monotonic()
        proc.signal(signal.SIGTERM)
        try:
            code = proc.wait(within_s + 5)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {within_s + 5} s after SIGTERM:\n{proc.log()}") from None
        took = time.monotonic() - asked
        log = proc.log()
    assert took < within_s, f"exited {took:.1f} s after SIGTERM:\n{log}"
    assert code == 0, log
    assert "SIGTERM during start-up: stopping" in log, log
    assert "Traceback" not in log, log
    return log


def test_sigterm_stops_an_executor_that_cannot_reach_redis(settings, tmp_path):
    settings = fleet_settings(settings, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    log = _stops_within(settings, tmp_path, "redis unreachable")
    assert "waiting for redis" in log


def test_sigterm_stops_an_executor_that_cannot_reach_the_database(settings, tmp_path):
    settings = fleet_settings(settings, db_url=_closed_db(settings.db_url))
    log = _stops_within(settings, tmp_path, "database unreachable")
    assert "waiting for database" in log


def test_sigterm_stops_an_executor_whose_redis_refuses_the_password(settings, tmp_path, password_redis):
    settings = fleet_settings(settings, redis_url=password_redis)
    log = _stops_within(settings, tmp_path, "redis unreachable")
    assert "wrong-password" not in log  # and the password is never written down
