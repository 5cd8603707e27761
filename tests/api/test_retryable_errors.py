"""A transient failure of the project's own (the vector engine unreachable, a submit that kept
losing lock waits) reads as 503 with Retry-After, like Redis or the database unreachable, not as
a 500 with a traceback."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ingest.api.errors import UNAVAILABLE_RETRY_S, install
from ingest.errors import PublishError, SubmitBusy
from ingest.milvus import VectorStoreUnavailable


@pytest.mark.parametrize(
    "error",
    [
        VectorStoreUnavailable("vector engine at http://127.0.0.1:19530: connection refused"),
        SubmitBusy("the submit lost 5 lock waits to concurrent writers"),
    ],
)
def test_a_retryable_error_is_a_503_with_retry_after(error: Exception):
    app = FastAPI()
    install(app)

    @app.get("/boom")
    async def boom() -> None:
        raise error

    r = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) == getattr(error, "retry_after_s", UNAVAILABLE_RETRY_S)
    assert r.json() == {"error": type(error).__name__, "detail": str(error)}


def test_a_publish_error_keeps_its_own_body():
    app = FastAPI()
    install(app)

    @app.get("/boom")
    async def boom() -> None:
        raise PublishError("redis refused", task_ids=["t1"])

    r = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert r.status_code == 503 and r.json()["committed"] is True and r.json()["task_ids"] == ["t1"]
