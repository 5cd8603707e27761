"""entrypoint.sh supervises real executors: names, ports, restart after kill -9, SIGTERM forwarding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psutil

from db.keys import Keys
from db.streams import connect
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent


def _heartbeats(client, keys: Keys) -> dict[str, dict]:
    out = {}
    for key in client.scan_iter(match=keys.executor_pattern):
        raw = client.get(key)
        if raw:
            beat = orjson.loads(raw)
            out[beat["consumer"]] = beat
    return out


def test_entrypoint_runs_restarts_and_stops_executors(settings, tmp_path):
    keys = Keys(settings.key_prefix)
    client = connect(settings.redis_url)
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
        }
    )
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
