"""Passwords from files (``INGEST_REDIS_PASSWORD_FILE``, ``INGEST_DB_PASSWORD_FILE``, the Docker
secrets convention, a trailing newline dropped): a unique password planted in a ``requirepass``
Redis and in a MariaDB user made for the test; an executor process and the CLI work from the
files alone, and the password is in no output: log lines (JSON, DEBUG), console trace spans,
the heartbeat, ``ingest fleet --json``, ``ingest status``, ``/metrics``, the errors of a wrong
password."""

from __future__ import annotations

import contextlib
import json
import urllib.request
import uuid
from urllib.parse import quote

import psutil
import pymysql
import pytest

from db.config import Settings
from db.database import DbUrl, close_database
from db.keys import Keys
from db.models import DONE, FAILED
from db.schema import init_schema
from db.streams import Streams, connect
from ingest.cli import main
from tests.api.support import ApiServer
from tests.conftest import MYSQL_BASE, _drop_database, make_settings
from tests.executor.support import enqueue, statuses, task_spec
from tests.handlers import EXTRA_HANDLERS
from tests.helpers import wait_until
from tests.procs import ExecutorProcess, free_port
from tests.redis_servers import plain_redis, require


def _root() -> pymysql.connections.Connection:
    base = DbUrl.parse(f"{MYSQL_BASE}/mysql")
    return pymysql.connect(host=base.host, port=base.port, user=base.user, password=base.password)


@contextlib.contextmanager
def mariadb_user(name: str, database: str, password: str):
    """A MariaDB user with ``password``, allowed the test's database only."""
    conn = _root()
    try:
        with conn.cursor() as cur:
            for host in ("%", "localhost", "127.0.0.1"):
                cur.execute(f"CREATE USER '{name}'@'{host.replace('%', '%%')}' IDENTIFIED BY %s", (password,))
                cur.execute(f"GRANT ALL ON `{database}`.* TO '{name}'@'{host}'")
        yield
    finally:
        with conn.cursor() as cur:
            for host in ("%", "localhost", "127.0.0.1"):
                cur.execute(f"DROP USER IF EXISTS '{name}'@'{host}'")
        conn.close()


@pytest.fixture
def secret() -> str:
    return f"Sx{uuid.uuid4().hex}@/:?#%"  # characters a URL would have to quote


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a test's own http:// URL
        return resp.read().decode()


@pytest.fixture
def secured(tmp_path, test_name, secret):
    """A ``requirepass`` Redis and a MariaDB user, both with ``secret``; yields the settings every
    process builds (URLs without passwords, the passwords from files) and the files' variables."""
    require("redis-server")
    server = plain_redis(tmp_path / "redis", password=secret)
    user = f"u{uuid.uuid4().hex[:12]}"
    base = DbUrl.parse(f"{MYSQL_BASE}/{test_name}")
    db_url = f"mysql://{user}@{base.host}:{base.port}/{test_name}"
    redis_url = f"redis://127.0.0.1:{server.port}/0"
    (tmp_path / "redis_password").write_text(secret + "\n")
    (tmp_path / "db_password").write_text(secret + "\n")
    files = {
        "INGEST_REDIS_PASSWORD_FILE": str(tmp_path / "redis_password"),
        "INGEST_DB_PASSWORD_FILE": str(tmp_path / "db_password"),
    }
    root_url = f"{MYSQL_BASE}/{test_name}"
    init_schema(root_url)
    close_database()
    try:
        with mariadb_user(user, test_name, secret):
            s = Settings.from_env(
                {**files, "INGEST_DB_URL": db_url, "INGEST_REDIS_URL": redis_url},
                **{
                    k: v
                    for k, v in vars(make_settings(test_name)).items()
                    if k not in ("db_url", "redis_url", "redis_password", "db_password")
                },
            ).replace(extra_handlers=EXTRA_HANDLERS)
            assert s.redis_password == secret and s.db_password == secret  # the newline dropped
            assert quote(secret, safe="") in s.db_url and secret not in repr(s)
            yield s, files, db_url, redis_url
    finally:
        close_database()
        _drop_database(root_url)
        server.close()


def test_passwords_from_files_work_and_appear_in_no_output(secured, tmp_path, secret, monkeypatch, capsys):
    s, files, db_url, redis_url = secured
    metrics_port = free_port()
    s = s.replace(metrics_port=metrics_port, log_format="json")
    _run_fleet_and_collect(s, tmp_path, files, secret, monkeypatch, capsys, db_url, redis_url, metrics_port)


def test_api_workers_read_the_password_files_themselves(secured, tmp_path, secret):
    """``--workers 2`` from password files alone: each worker builds its settings from the same
    files (the variable and its file both set would be refused), and no password is in any
    worker's environment."""
    s, files, db_url, _ = secured
    env = {**files, "INGEST_REDIS_PASSWORD": "", "INGEST_DB_PASSWORD": "", "INGEST_DB_URL": db_url}
    server = ApiServer(
        s.replace(api_keys="", api_admin_key=""), tmp_path / "api.log", "--workers", "2", **env
    )
    try:
        server.wait_ready(60)
        with server.client(tenant="filed") as c:
            for _ in range(6):
                r = c.get("/v1/tenants/me")
                assert r.status_code == 200, (r.text, server.log())
            assert c.get("/healthz").status_code == 200
        workers = psutil.Process(server.proc.pid).children(recursive=True)
        assert workers
        for w in workers:
            environ = w.environ()
            assert environ["INGEST_DB_PASSWORD_FILE"] == files["INGEST_DB_PASSWORD_FILE"]
            assert not any(secret in v or quote(secret, safe="") in v for v in environ.values())
    finally:
        assert server.stop() == 0, server.log()
    assert secret not in server.log()


def _run_fleet_and_collect(s, tmp_path, files, secret, monkeypatch, capsys, db_url, redis_url, metrics_port):
    client = connect(s)
    keys = Keys(s.key_prefix)
    Streams(client, keys).ensure_group()
    for name, value in files.items():
        monkeypatch.setenv(name, value)
    cli = ["--db-url", db_url, "--redis-url", redis_url, "--key-prefix", s.key_prefix]
    child_env = {**files, "INGEST_REDIS_PASSWORD": "", "INGEST_DB_PASSWORD": "", "INGEST_DB_URL": db_url}
    outputs: dict[str, str] = {}
    with ExecutorProcess(
        s, "host_1", tmp_path / "x.log", INGEST_LOG_LEVEL="DEBUG", INGEST_TRACING="console", **child_env
    ) as proc:
        proc.wait_ready(60)
        from db.database import init_database

        init_database(s.db_url)
        ids = enqueue(
            Streams(client, keys), [task_spec("noop") for _ in range(3)] + [task_spec("fail", error="no")]
        )
        wait_until(lambda: set(statuses(ids).values()) <= {DONE, FAILED} and len(statuses(ids)) == 4, 30)
        outputs["heartbeat"] = client.get(keys.executor("host_1")) or ""
        outputs["/metrics"] = _get(f"http://127.0.0.1:{metrics_port}/metrics")
        capsys.readouterr()
        assert main(["fleet", "--json", *cli]) == 0
        assert main(["status", "--json", *cli]) == 0
        assert main(["status", ids[-1], *cli]) == 0
        assert main(["dead", "list", *cli]) == 0
        printed = capsys.readouterr()
        outputs["ingest fleet/status/dead"] = printed.out + printed.err
        fleet, _ = json.JSONDecoder().raw_decode(printed.out)
        assert [b["consumer"] for b in fleet] == ["host_1"]  # the fleet's JSON came out
        assert proc.stop() == 0
        outputs["executor log and console spans"] = proc.log()
    assert '"attributes"' in outputs["executor log and console spans"]  # console spans were printed
    assert statuses(ids)[ids[0]] == DONE
    client.close()
    # wrong passwords: each error says what failed and holds neither password
    wrong = f"Wx{uuid.uuid4().hex}"
    (tmp_path / "wrong").write_text(wrong)
    monkeypatch.setenv("INGEST_REDIS_PASSWORD_FILE", str(tmp_path / "wrong"))
    assert main(["status", *cli]) != 0
    monkeypatch.setenv("INGEST_REDIS_PASSWORD_FILE", files["INGEST_REDIS_PASSWORD_FILE"])
    monkeypatch.setenv("INGEST_DB_PASSWORD_FILE", str(tmp_path / "wrong"))
    assert main(["status", *cli]) != 0
    monkeypatch.setenv("INGEST_DB_PASSWORD", "also-set")
    assert main(["status", *cli]) != 0  # both the variable and the file: refused
    errors = capsys.readouterr()
    outputs["errors"] = errors.out + errors.err
    assert "WRONGPASS" in outputs["errors"] or "invalid username-password" in outputs["errors"], outputs[
        "errors"
    ]
    assert "refused the credentials" in outputs["errors"], outputs["errors"]
    assert "not both" in outputs["errors"]
    for where, text in outputs.items():
        for form in (secret, quote(secret, safe=""), wrong):
            assert form not in text, f"a password is in the {where}"
