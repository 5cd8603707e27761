"""Redis or the database unreachable: 503 with Retry-After, and /healthz says which."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from db.config import Settings
from tests.api.support import ApiServer
from tests.procs import free_port


@pytest.fixture(scope="module")
def stranded(api_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A server whose Redis and database are ports nobody listens on."""
    s = api_settings.replace(
        api_keys="",
        api_admin_key="",
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        db_url=f"mysql://root@127.0.0.1:{free_port()}/nowhere",
    )
    server = ApiServer(s, tmp_path_factory.mktemp("stranded") / "server.log")
    try:
        server.wait_ready(healthy=False)
        yield server
    finally:
        server.stop()


def test_unreachable_stores_read_as_503_with_retry_after(stranded: ApiServer):
    with stranded.client() as c:
        health = c.get("/healthz")
        assert health.status_code == 503
        assert health.json()["redis"].startswith("unreachable") and health.json()["database"].startswith(
            "unreachable"
        )
        for method, path in (
            ("GET", "/v1/tasks/abc/result"),
            ("GET", "/v1/tasks/abc"),
            ("POST", "/v1/tasks/abc/cancel"),
        ):
            r = c.request(method, path)
            assert r.status_code == 503, (path, r.text)
            assert int(r.headers["retry-after"]) > 0
