"""``rediss://``: a TLS-only redis-server with certificates made here (a CA, a server certificate
for 127.0.0.1 and localhost, a client certificate); the task path (submit, an executor parses,
search, status) runs over it; an untrusted CA and a host the certificate does not name are
refused with a clear error (the hostname check is on unless turned off)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import trio

from db.streams import connect
from ingest.cli import main
from ingest.search import search
from tests.executor.support import running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.ingest.factories import cli_args
from tests.redis.conftest import settings_on
from tests.redis_servers import make_certificates, require, tls_redis

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def certs(tmp_path):
    require("redis-server", "openssl")
    return make_certificates(tmp_path / "certs")


@pytest.fixture
def server(tmp_path, certs):
    s = tls_redis(tmp_path / "redis", certs, "--bind", "127.0.0.1 127.0.0.2")
    yield s
    s.close()


def _tls_env(monkeypatch, certs, ca: Path | None = None) -> dict[str, object]:
    """The TLS settings, as fields for the test's Settings and as the CLI's environment."""
    fields: dict[str, object] = {
        "redis_tls_ca_file": str(ca or certs.ca),
        "redis_tls_cert_file": str(certs.client_cert),
        "redis_tls_key_file": str(certs.client_key),
    }
    for name, value in fields.items():
        monkeypatch.setenv(f"INGEST_{name.upper()}", str(value))
    return fields


@pytest.mark.usefixtures("embedder")
async def test_the_task_path_runs_over_tls(server, certs, test_name, monkeypatch, capsys):
    fields = _tls_env(monkeypatch, certs)
    with settings_on(test_name, redis_url=f"rediss://localhost:{server.port}/0", **fields) as settings:
        argv = ["submit", str(EXAMPLES / "sourdough.txt"), "--kb", "bread", "--wait", "--json"]
        async with running_daemon(settings):
            code = await trio.to_thread.run_sync(main, [*argv, "--timeout", "90", *cli_args(settings)])
        out, err = capsys.readouterr()
        assert code == 0, err
        (task_id,) = json.loads(out)["documents"][0]["task_ids"]
        hits = await trio.to_thread.run_sync(
            lambda: search(settings, "bread", "a starter of flour and water", k=1)
        )
        assert hits and hits[0].doc_name == "sourdough.txt"
        assert await trio.to_thread.run_sync(main, ["status", task_id, "--json", *cli_args(settings)]) == 0
        status = json.loads(capsys.readouterr().out)
        assert "done" in json.dumps(status)
        # the client certificate was the one presented: the server counts TLS clients
        client = connect(settings)
        try:
            assert client.info("clients")["connected_clients"] >= 1
        finally:
            client.close()


def test_an_untrusted_ca_is_refused_with_a_clear_error(server, certs, settings, monkeypatch, capsys):
    fields = _tls_env(monkeypatch, certs, ca=certs.other_ca)
    url = f"rediss://127.0.0.1:{server.port}/0"
    client = connect(url_settings(url, fields))
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        client.ping()
    client.close()
    assert main(["status", "--db-url", settings.db_url, "--redis-url", url]) != 0
    err = capsys.readouterr().err
    assert f"Redis unreachable at {url}" in err and "certificate verify failed" in err, err


def test_a_host_the_certificate_does_not_name_is_refused_unless_the_check_is_off(server, certs, monkeypatch):
    fields = _tls_env(monkeypatch, certs)
    url = f"rediss://127.0.0.2:{server.port}/0"  # the server listens there; its certificate names 127.0.0.1
    client = connect(url_settings(url, fields))
    with pytest.raises(redis.ConnectionError, match="match|mismatch"):
        client.ping()
    client.close()
    client = connect(url_settings(url, {**fields, "redis_tls_check_hostname": False}))
    try:
        assert client.ping()
    finally:
        client.close()


def test_without_a_client_certificate_the_server_refuses(server, certs):
    client = connect(
        url_settings(f"rediss://127.0.0.1:{server.port}/0", {"redis_tls_ca_file": str(certs.ca)})
    )
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()


def url_settings(url: str, fields: dict[str, object]):
    from db.config import Settings

    return Settings.from_env({}, redis_url=url, **fields)
