"""An INGEST_HOME whose path holds characters that mean something in a URL (``%41``, ``#``,
``?``, a space) still gives the embedded default: the SQLite file and the socket at that very
path (each URL quotes it; redis-py and ``DbUrl.parse`` unquote it once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from db.config import Settings
from db.database import DbUrl, close_database
from db.embedded import held
from db.schema import init_schema
from db.streams import connect
from tests.db.embedded_support import servers_on


@pytest.mark.parametrize("name", ["pct%41", "hash#x", "q?x", "sp ace"])
def test_a_home_with_url_characters_is_used_as_it_is_named(tmp_path_factory, name):
    home = str(tmp_path_factory.mktemp("o") / name)
    s = Settings.from_env({"INGEST_HOME": home})
    assert s.embedded
    assert DbUrl.parse(s.db_url).name == f"{home}/ingest.db"
    init_schema(s.db_url)
    close_database()
    assert Path(home, "ingest.db").exists()
    with held(s.redis_url, s.home):
        client = connect(s)
        try:
            assert client.ping()
            assert client.connection_pool.connection_kwargs["path"] == f"{home}/redis.sock"
        finally:
            client.close()
        assert len(servers_on(home)) == 1
    assert servers_on(home) == []
    assert sorted(p.name for p in Path(home).parent.iterdir()) == [name]  # no "pctA", no "hash"
