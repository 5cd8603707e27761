"""``ingest fleet`` shows each executor's health verdict from its heartbeat, and calls a heartbeat
three periods old unhealthy (its event loop or its Redis is stuck)."""

from __future__ import annotations

import json
import time

import orjson

from ingest.cli import main
from tests.ingest.factories import cli_args


def _beat(consumer: str, age_s: float, health: dict) -> bytes:
    now = time.time()
    return orjson.dumps(
        {
            "host": "h",
            "pid": 1,
            "consumer": consumer,
            "now": now - age_s,
            "heartbeat_s": 1.0,
            "health": health,
        }
    )


def test_fleet_shows_the_health_verdict_of_each_executor(settings, rclient, keys, capsys):
    down = {"ok": False, "reasons": ["database: OperationalError: (2003, 'refused')"]}
    rclient.set(keys.executor("h_0"), _beat("h_0", 0.5, {"ok": True, "reasons": []}), ex=60)
    rclient.set(keys.executor("h_1"), _beat("h_1", 0.5, down), ex=60)
    rclient.set(keys.executor("h_2"), _beat("h_2", 10.0, {"ok": True, "reasons": []}), ex=60)
    assert main(["fleet", "--json", *cli_args(settings)]) == 0
    health = {b["consumer"]: b["health"] for b in json.loads(capsys.readouterr().out)}
    assert health["h_0"] == {"ok": True, "reasons": []}
    assert health["h_1"] == down
    assert health["h_2"]["ok"] is False and health["h_2"]["reasons"][0].startswith("heartbeat 10 s old")
    assert main(["fleet", *cli_args(settings)]) == 0
    table = capsys.readouterr().out
    assert "health" in table and "unhealthy: database" in table and "unhealthy: heartbeat" in table
