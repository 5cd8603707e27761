"""entrypoint.sh supervises real executors: names, ports, restart after kill -9, SIGTERM forwarding."""

from __future__ import annotations

import contextlib
import os
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
