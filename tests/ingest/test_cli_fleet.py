"""`ingest fleet` reads the executors' heartbeat keys and shows each."""

from __future__ import annotations

import json
import time

import orjson

from ingest.cli import main
from tests.ingest.factories import cli_args


def _beat(consumer: str, **extra) -> dict:
    now = time.time()
    return {
        "host": "host-a",
        "pid": 4242,
        "consumer": consumer,
        "boot_time": now - 100,
        "now": now - 3,
        "running": ["t1", "t2"],
        "done": 17,
        "failed": 1,
        "pending": 2,
        "lag": 0,
        "rss_mb": 512.5,
        "cpu_percent": 12.0,
        "draining": False,
        "task_types": ["parse", "memory"],
        **extra,
    }


def test_fleet_json_lists_each_live_heartbeat_with_its_age(settings, rclient, keys, capsys):
    rclient.set(keys.executor("host-a_0"), orjson.dumps(_beat("host-a_0")), ex=60)
    rclient.set(keys.executor("host-a_1"), orjson.dumps(_beat("host-a_1", draining=True)), ex=60)
    assert main(["fleet", "--json", *cli_args(settings)]) == 0
    beats = json.loads(capsys.readouterr().out)
    assert [b["consumer"] for b in beats] == ["host-a_0", "host-a_1"]
    assert beats[0]["running"] == ["t1", "t2"] and beats[0]["done"] == 17 and beats[1]["draining"] is True
    assert 2 <= beats[0]["age_s"] < 30


def test_fleet_table_shows_consumer_host_pid_age_running_done_failed_rss(settings, rclient, keys, capsys):
    rclient.set(keys.executor("host-a_0"), orjson.dumps(_beat("host-a_0")), ex=60)
    rclient.set(keys.executor("host-b_0"), b"not json", ex=60)
    assert main(["fleet", *cli_args(settings)]) == 0
    out = capsys.readouterr().out
    for text in ("host-a_0", "host-a", "4242", "ago", "17", "512", "host-b_0", "unreadable heartbeat"):
        assert text in out


def test_fleet_without_executors_says_so(settings, capsys):
    assert main(["fleet", *cli_args(settings)]) == 0
    assert "no live executors" in capsys.readouterr().out
    assert main(["fleet", "--json", *cli_args(settings)]) == 0
    assert json.loads(capsys.readouterr().out) == []
