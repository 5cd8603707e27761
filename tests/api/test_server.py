"""How the server starts: its bind address, the settings its worker processes get, several workers."""

from __future__ import annotations

import pytest

from db.config import Settings
from ingest.api.server import hypercorn_config, settings_environ
from tests.api.support import ApiServer


def test_the_default_bind_is_the_settings_address():
    s = Settings.from_env({})
    assert (s.api_host, s.api_port) == ("127.0.0.1", 8080)
    config = hypercorn_config(s.api_host, s.api_port, 1)
    assert config.bind == ["127.0.0.1:8080"] and config.worker_class == "trio"
    assert hypercorn_config("::1", 9000, 2).bind == ["[::1]:9000"]


def test_worker_processes_build_the_same_settings(api_settings: Settings):
    s = api_settings.replace(single_use_results=False, api_workers=3, results_ttl_s=12.5)
    assert Settings.from_env(settings_environ(s)) == s


def test_several_workers_serve_one_port(api_settings: Settings, tmp_path_factory: pytest.TempPathFactory):
    s = api_settings.replace(api_keys="", api_admin_key="")
    server = ApiServer(s, tmp_path_factory.mktemp("workers") / "server.log", "--workers", "2")
    try:
        server.wait_ready(60)
        with server.client(tenant="multi") as c:
            for _ in range(6):
                assert c.get("/v1/tenants/me").json()["tenant_id"] == "multi"
    finally:
        assert server.stop() == 0, server.log()


def test_a_password_file_beside_a_sqlite_url_leaves_the_url_alone(tmp_path):
    """The password goes into a MySQL URL only (as Settings puts it there): a SQLite URL given
    to the workers stays a path."""
    (tmp_path / "pw").write_text("s3cret\n")
    environ = {"INGEST_DB_URL": f"sqlite:///{tmp_path}/x.db", "INGEST_DB_PASSWORD_FILE": str(tmp_path / "pw")}
    s = Settings.from_env(environ)
    out = settings_environ(s, environ)
    assert out["INGEST_DB_URL"] == f"sqlite:///{tmp_path}/x.db" and "INGEST_DB_PASSWORD" not in out
    assert Settings.from_env({**environ, **out}) == s
