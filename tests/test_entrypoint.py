"""entrypoint.sh supervises real executors: names, ports, restart after kill -9, SIGTERM forwarding."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import psutil
import pytest

from db.keys import Keys
from db.streams import connect
from ingest.allocator import JEMALLOC_CONF, find_jemalloc
from tests.helpers import wait_until
from tests.observe import wait_health
from tests.procs import free_port

ROOT = Path(__file__).resolve().parent.parent


def _heartbeats(client, keys: Keys) -> dict[str, dict]:
    out = {}
    for key in client.scan_iter(match=keys.executor_pattern):
        raw = client.get(key)
        if raw:
            beat = orjson.loads(raw)
            out[beat["consumer"]] = beat
    return out


def _env(settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            "INGEST_DB_URL": settings.db_url,
            "INGEST_REDIS_URL": settings.redis_url,
            "INGEST_KEY_PREFIX": settings.key_prefix,
            "INGEST_STAGGER_S": "0",
            "INGEST_HEARTBEAT_S": "0.5",
            "INGEST_SHUTDOWN_GRACE_S": "2",
            "RESTART_BACKOFF_MIN_S": "0.2",
            "WS": "2",
            **extra,
        }
    )
    return env


def _free_base(offsets: tuple[int, ...]) -> int:
    """A port ``base`` such that ``base + o`` is free for every offset."""
    for _ in range(50):
        base = free_port()
        try:
            with contextlib.ExitStack() as stack:
                for o in offsets:
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", base + o))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def test_entrypoint_runs_restarts_and_stops_executors(settings, tmp_path):
    keys = Keys(settings.key_prefix)
    client = connect(settings.redis_url)
    env = _env(settings)
    log_path = tmp_path / "entrypoint.log"
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [str(ROOT / "entrypoint.sh"), "--host-id", "eph"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        beats = wait_until(lambda: len(b := _heartbeats(client, keys)) == 2 and b, timeout_s=60)
        assert set(beats) == {"eph_0", "eph_1"}
        victim = beats["eph_1"]["pid"]
        os.kill(victim, signal.SIGKILL)
        reborn = wait_until(
            lambda: (b := _heartbeats(client, keys).get("eph_1")) and b["pid"] != victim and b,
            timeout_s=60,
        )
        assert psutil.pid_exists(reborn["pid"])
        children = [beats["eph_0"]["pid"], reborn["pid"]]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        time.sleep(0.2)
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in children)
    finally:
        if proc.poll() is None:
            proc.kill()
        client.close()
    text = log_path.read_text()
    assert "restarting" in text and "all executors stopped" in text


def test_consumer_numbers_and_ports_are_base_plus_n(settings, tmp_path):
    """``--consumer-no-beg 2 --consumer-no-end 4``: executors 2 and 3, each serving health and
    metrics on the base port plus its number."""
    keys = Keys(settings.key_prefix)
    client = connect(settings.redis_url)
    health, metrics = _free_base((2, 3)), _free_base((2, 3))
    env = _env(settings, INGEST_HEALTHCHECK_PORT=str(health), INGEST_METRICS_PORT=str(metrics))
    with open(tmp_path / "entrypoint.log", "wb") as log:
        proc = subprocess.Popen(
            [
                str(ROOT / "entrypoint.sh"),
                "--host-id",
                "epn",
                "--consumer-no-beg",
                "2",
                "--consumer-no-end",
                "4",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        beats = wait_until(lambda: len(b := _heartbeats(client, keys)) == 2 and b, timeout_s=60)
        assert set(beats) == {"epn_2", "epn_3"}
        for n in (2, 3):
            assert wait_health(health + n, 200)["executor"] == f"epn_{n}"
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics + n}/metrics", timeout=5) as resp:
                assert f'executor="epn_{n}"' in resp.read().decode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        client.close()


def _allocator_env(tmp_path: Path, **extra: str) -> str:
    """What an executor started by entrypoint.sh sees as LD_PRELOAD and MALLOC_CONF."""
    probe = tmp_path / "probe.sh"
    probe.write_text(
        f'#!/bin/sh\necho "$LD_PRELOAD|$MALLOC_CONF" > {tmp_path}/seen.tmp\nmv {tmp_path}/seen.tmp {tmp_path}/seen\nexec sleep 30\n'
    )
    probe.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update({"WS": "1", "INGEST_EXECUTOR_CMD": str(probe), **extra})
    proc = subprocess.Popen(["bash", str(ROOT / "entrypoint.sh")], env=env, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (tmp_path / "seen").exists(), timeout_s=20)
        return (tmp_path / "seen").read_text().strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_entrypoint_sh_defaults_to_the_malloc_conf_the_python_started_executors_get():
    # ingest demo and the benches start executors through ingest.allocator, the fleet through this
    assert f"JEMALLOC_CONF=${{MALLOC_CONF:-{JEMALLOC_CONF}}}" in (ROOT / "entrypoint.sh").read_text()


def test_jemalloc_is_preloaded_without_purging_unless_the_operator_configures_it(tmp_path):
    if find_jemalloc() is None:
        pytest.skip(
            "libjemalloc2 is not installed: entrypoint.sh then runs executors on the default allocator"
        )
    # entrypoint.sh may find another copy first (pkg-config's libdir): any libjemalloc will do.
    preload, conf = _allocator_env(tmp_path).split("|")
    assert "libjemalloc" in preload and conf == JEMALLOC_CONF == "dirty_decay_ms:-1,narenas:1"
    (tmp_path / "seen").unlink()
    preload, conf = _allocator_env(tmp_path, MALLOC_CONF="dirty_decay_ms:5000").split("|")
    assert "libjemalloc" in preload and conf == "dirty_decay_ms:5000"


def _probe_executor(tmp_path: Path) -> Path:
    """An executor that records its pid under ``executors/`` and sleeps a minute (TERM ends it)."""
    (tmp_path / "executors").mkdir()
    probe = tmp_path / "probe.sh"
    probe.write_text(f"#!/bin/sh\ntouch {tmp_path}/executors/$$\nexec sleep 60\n")
    probe.chmod(0o755)
    return probe


def _executors_left(tmp_path: Path) -> list[int]:
    pids = [int(p.name) for p in (tmp_path / "executors").iterdir()]
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


# `date` as entrypoint.sh calls it, but the first call from WHERE (its pid then written to
# stub/window) takes 3 s: a race's window held open for the test's signal. WHERE is `main`, the
# main shell once it has forked supervisors, or `supervisor`, one reading the clock (`date +%s`)
# just before it starts its executor. The shell that called is told by its ancestry: the main
# shell is the test's child, a supervisor its grandchild.
_SLOW_DATE = """#!/bin/bash
caller=$PPID
parent_of() { awk '/^PPid:/ {print $2}' "/proc/$1/status"; }
grand=$(parent_of "$caller")
slow=
case $STUB_WINDOW in
  main) [ "$grand" = "$STUB_TEST_PID" ] && [ "$(grep -lx "PPid:[[:space:]]*$caller" /proc/[0-9]*/status 2>/dev/null | wc -l)" -gt 1 ] && slow=1 ;;
  supervisor) [ "$1" = +%s ] && [ "$(parent_of "$grand")" = "$STUB_TEST_PID" ] && slow=1 ;;
esac
if [ -n "$slow" ] && mkdir "$STUB_DIR/slowed" 2>/dev/null; then
  echo "$caller" >"$STUB_DIR/window.tmp" && mv "$STUB_DIR/window.tmp" "$STUB_DIR/window"
  sleep 3
fi
exec {date} "$@"
"""


def _race_env(tmp_path: Path, window: str) -> dict[str, str]:
    stub = tmp_path / "stub"
    stub.mkdir()
    date = stub / "date"
    real_date = shutil.which("date")
    assert real_date is not None
    date.write_text(_SLOW_DATE.replace("{date}", real_date))
    date.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(
        {
            "PATH": f"{stub}:{env.get('PATH', '')}",
            "STUB_DIR": str(stub),
            "STUB_WINDOW": window,
            "STUB_TEST_PID": str(os.getpid()),
            "INGEST_EXECUTOR_CMD": str(_probe_executor(tmp_path)),
            "RESTART_BACKOFF_MIN_S": "0.1",
            "WS": "2",
        }
    )
    return env


def _end_everything(proc: subprocess.Popen[bytes], tmp_path: Path, supervisors: list[psutil.Process]) -> None:
    """What a failed run leaves (orphaned supervisors first, so none starts another executor)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for sup in supervisors:
        with contextlib.suppress(psutil.Error):
            sup.kill()
    for pid in _executors_left(tmp_path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_stop_while_the_supervisors_are_being_started_stops_every_executor(tmp_path):
    """A TERM after the supervisors are forked but before the main shell's handler was installed
    killed the main shell and left them restarting executors for ever."""
    env = _race_env(tmp_path, "main")
    supervisors: list[psutil.Process] = []
    with open(tmp_path / "entrypoint.log", "wb") as log:
        proc = subprocess.Popen([str(ROOT / "entrypoint.sh")], env=env, stderr=log)
    try:
        wait_until(lambda: (tmp_path / "stub" / "window").exists(), timeout_s=20)
        supervisors = [c for c in psutil.Process(proc.pid).children() if c.name() != "date"]
        assert len(supervisors) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not any(s.is_running() and s.status() != "zombie" for s in supervisors)
        wait_until(lambda: not _executors_left(tmp_path), timeout_s=10)
    finally:
        _end_everything(proc, tmp_path, supervisors)
    assert "all executors stopped" in (tmp_path / "entrypoint.log").read_text()


def test_a_stop_just_before_an_executor_starts_stops_it(tmp_path):
    """A TERM reaching a supervisor between its loop's check and the executor's start found no
    child to forward to: the executor ran, and was waited for, until the container's SIGKILL."""
    env = _race_env(tmp_path, "supervisor")
    env["WS"] = "1"
    supervisors: list[psutil.Process] = []
    with open(tmp_path / "entrypoint.log", "wb") as log:
        proc = subprocess.Popen([str(ROOT / "entrypoint.sh")], env=env, stderr=log)
    try:
        window = tmp_path / "stub" / "window"
        wait_until(window.exists, timeout_s=20)
        supervisor = int(window.read_text())
        supervisors = [psutil.Process(supervisor)]
        os.kill(supervisor, signal.SIGTERM)
        # its executor (a minute's sleep) is stopped at once, and with it the supervisor and the main shell
        assert proc.wait(timeout=15) == 0
        wait_until(lambda: not _executors_left(tmp_path), timeout_s=10)
    finally:
        _end_everything(proc, tmp_path, supervisors)
    assert "stopped (exit " in (tmp_path / "entrypoint.log").read_text()


def test_an_executor_that_cannot_start_is_restarted_with_backoff_not_as_a_clean_exit(tmp_path):
    """An exec failure ends the child within milliseconds; bash reaped it before the supervisor
    looked, and it was logged as a clean exit and restarted at once, for ever."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(
        {"WS": "1", "INGEST_EXECUTOR_CMD": str(tmp_path / "no-such-executor"), "RESTART_BACKOFF_MIN_S": "0.1"}
    )
    log_path = tmp_path / "entrypoint.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(ROOT / "entrypoint.sh")], env=env, stderr=log)
    try:

        def exits() -> list[str]:
            return [line for line in log_path.read_text().splitlines() if " exited " in line]

        lines = wait_until(lambda: len(found := exits()) >= 3 and found, timeout_s=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert all("exited with status 127" in line for line in lines[:3]), lines
    assert [line.rsplit(" ", 1)[-1] for line in lines[:3]] == ["0.1s", "0.2s", "0.4s"]
