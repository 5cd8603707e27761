"""`ingest init` creates a missing database, the tables and the consumer group; a second run
says nothing changed. Run as a person would: `python -m ingest init` with the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from db.keys import Keys
from db.streams import connect
from tests.conftest import _delete_prefix, _drop_database, make_settings
from tests.ingest.factories import cli_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh():
    """Settings naming a database that does not exist yet."""
    s = make_settings(f"it_init_{uuid.uuid4().hex[:10]}")
    yield s
    _drop_database(s.db_url)
    client = connect(s.redis_url)
    _delete_prefix(client, s.key_prefix)
    client.close()


def _ingest(settings, *args):
    env = {**os.environ, **cli_env(settings)}
    return subprocess.run(
        [sys.executable, "-m", "ingest", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_init_creates_everything_then_changes_nothing(fresh):
    first = _ingest(fresh, "init", "--skip-model-export")  # the export: test_query_encoder.py
    assert first.returncode == 0, first.stderr
    assert f"created database {fresh.db_url}" in first.stdout
    assert "created table task" in first.stdout and "created table document" in first.stdout
    keys = Keys(fresh.key_prefix)
    for stream in keys.queues:
        assert f"created consumer group {keys.group} on {stream}" in first.stdout
    second = _ingest(fresh, "init", "--skip-model-export")
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("nothing changed:")
    third = _ingest(fresh, "init", "--json", "--skip-model-export")
    data = json.loads(third.stdout)
    assert data["changed"] is False and data["created_tables"] == [] and data["created_groups"] == []
    client = connect(fresh.redis_url)
    try:
        assert [g["name"] for g in client.xinfo_groups(keys.queue(0))] == [keys.group]
    finally:
        client.close()
