"""Garbage at every route is never a 5xx (a 4xx, or taken as it reads): wrong types, huge numbers, bad JSON, bytes
that are not UTF-8, missing fields, odd headers and ids."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.support import ADMIN_KEY, ApiServer

BAD_IDS = ["%FF%FE", "x" * 500, "..%2F..%2Fetc", "a%00b", "%E2%80%AE"]
JSON = {"Content-Type": "application/json"}
# a form whose file name and kb are not UTF-8
RAW_FORM = (
    b'--b\r\nContent-Disposition: form-data; name="kb"\r\n\r\n\xff\xfe\r\n'
    b'--b\r\nContent-Disposition: form-data; name="files"; filename="\xff\xfe.txt"\r\n'
    b"Content-Type: text/plain\r\n\r\n\xff\xfe\x00\r\n--b--\r\n"
)

REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "POST",
        "/v1/documents",
        {"content": b"\xff\xfe\x00garbage", "headers": {"Content-Type": "multipart/form-data"}},
    ),
    (
        "POST",
        "/v1/documents",
        {"content": b"--x\r\n\xff\r\n", "headers": {"Content-Type": "multipart/form-data; boundary=x"}},
    ),
    ("POST", "/v1/documents", {"data": {"kb": "k", "priority": "high"}, "files": [("files", ("a", b"1"))]}),
    ("POST", "/v1/documents", {"data": {"kb": "k" * 1000}, "files": [("files", ("a", b"1"))]}),
    (
        "POST",
        "/v1/documents",
        {"content": RAW_FORM, "headers": {"Content-Type": "multipart/form-data; boundary=b"}},
    ),
    ("POST", "/v1/documents", {"data": {"kb": "k"}, "files": [("files", ("n" * 400, b"1"))]}),
    ("POST", "/v1/documents", {"data": {"kb": "k", "dataflow": "\x00"}, "files": [("files", ("a", b"1"))]}),
    ("POST", "/v1/documents", {"json": {"kb": "k"}}),
    ("POST", "/v1/tasks", {"content": b"{not json", "headers": JSON}),
    ("POST", "/v1/tasks", {"content": b'{"tasks": ["\xff"]}', "headers": JSON}),
    ("POST", "/v1/tasks", {"json": {"tasks": "all of them"}}),
    ("POST", "/v1/tasks", {"json": {"tasks": [1, None, []]}}),
    ("POST", "/v1/tasks", {"json": {"tasks": []}}),
    ("POST", "/v1/tasks", {"json": [1, 2]}),
    ("POST", "/v1/tasks", {"json": {"tasks": [{"priority": True, "from_page": 1e300, "to_page": -1}]}}),
    ("POST", "/v1/tasks", {"json": {"tasks": [{"payload": "x", "generation": 2**80}]}}),
    ("POST", "/v1/tasks", {"json": {"tasks": [{"task_type": "", "digest": "d" * 99, "doc_id": "../x"}]}}),
    ("POST", "/v1/tasks", {"json": {"tasks": [{"id": "same"}, {"id": "same"}]}}),
    ("POST", "/v1/tasks", {"json": {"tasks": [{"kb_id": 5, "nested": {"deep": [1, {"x": None}]}}]}}),
    ("POST", "/v1/tasks", {"content": b"", "headers": JSON}),
    ("POST", "/v1/tasks", {"content": b"null", "headers": {"Content-Type": "text/plain"}}),
    ("GET", "/v1/search", {"params": {"kb": "k", "q": "x", "k": "10" * 50}}),
    ("GET", "/v1/search", {"params": {"kb": "k", "q": "x", "k": "-1"}}),
    ("GET", "/v1/search", {"params": {"kb": "k", "q": "x", "k": "1.5"}}),
    ("GET", "/v1/search", {"params": {"kb": "k", "q": "", "k": "abc"}}),
    ("GET", "/v1/search?kb=%FF&q=%FE%00&k=2", {}),
    ("POST", "/v1/search", {"content": b"\xff", "headers": JSON}),
    ("POST", "/v1/search", {"json": {"kb": 1, "q": None, "k": 10**30}}),
    ("DELETE", "/v1/results", {"params": {"older_than": "-5d"}}),
    ("DELETE", "/v1/results", {"params": {"older_than": "9" * 30, "tenant": "bad tenant"}}),
    ("DELETE", "/v1/results", {"params": {"older_than": "1e999d"}}),
    ("GET", "/v1/tenants/me", {"headers": {"X-Tenant-Id": b"\xff\xfe"}}),
    ("GET", "/v1/tenants/me", {"headers": {"X-Tenant-Id": "t" * 65}}),
]
for bad in BAD_IDS:
    for suffix in ("", "/result", "/watch"):
        REQUESTS.append(("GET", f"/v1/tasks/{bad}{suffix}", {}))
    REQUESTS.append(("GET", f"/v1/documents/{bad}", {}))
    for verb in ("cancel", "retry"):
        REQUESTS.append(("POST", f"/v1/tasks/{bad}/{verb}", {}))
        REQUESTS.append(("POST", f"/v1/documents/{bad}/{verb}", {}))


@pytest.mark.parametrize("server_name", ["keyed", "open_server"])
def test_no_garbage_gets_a_5xx(server_name: str, request: pytest.FixtureRequest):
    server: ApiServer = request.getfixturevalue(server_name)
    key = ADMIN_KEY if server_name == "keyed" else None
    failures = []
    with server.client(key=key, tenant="garbage", timeout=30) as c:
        for method, path, kwargs in REQUESTS:
            r = c.request(method, path, **kwargs)
            if r.status_code >= 500:
                failures.append((method, path, kwargs, r.status_code, r.text[:200]))
    assert not failures, "\n".join(map(repr, failures))
