"""Enqueueing over HTTP: documents (multipart) and tasks (JSON), and how each is refused:
413 over the body cap, 422 with every problem, 429 from a tenant's limit."""

from __future__ import annotations

import pytest

from db.config import Settings
from ingest.producer import MAX_PAYLOAD_BYTES, _check_payload
from ingest.tenants import set_limits
from tests.api.conftest import OPEN_MAX_REQUEST_BYTES
from tests.api.support import ADMIN_KEY, ApiServer, new_tenant


def test_documents_are_enqueued_and_refused_files_listed(keyed: ApiServer):
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant()) as c:
        files = [("files", ("a.txt", b"first document")), ("files", ("empty.txt", b""))]
        r = c.post("/v1/documents", data={"kb": "books", "priority": "1"}, files=files)
        assert r.status_code == 201, r.text
        body = r.json()
        assert [d["name"] for d in body["documents"]] == ["a.txt"]
        assert body["refused"] == [["empty.txt", "is empty"]]
        doc = body["documents"][0]
        task = c.get(f"/v1/tasks/{doc['task_ids'][0]}").json()
        assert task["kind"] == "task" and task["task"]["priority"] == 1
        described = c.get(f"/v1/documents/{doc['id']}").json()
        assert described["kind"] == "document" and described["document"]["kb_name"] == "books"
        # a document id on the task route (and the other way round) is not found
        assert c.get(f"/v1/tasks/{doc['id']}").status_code == 404
        assert c.get(f"/v1/documents/{doc['task_ids'][0]}").status_code == 404
        r = c.post("/v1/documents", data={"kb": "books"}, files=[("files", ("e.txt", b""))])
        assert r.status_code == 200 and r.json()["documents"] == []


def test_an_unknown_dataflow_is_refused(keyed: ApiServer):
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant()) as c:
        r = c.post("/v1/documents", data={"kb": "k", "dataflow": "nope"}, files=[("files", ("a.md", b"# x"))])
        assert r.status_code == 422 and "nope" in r.json()["detail"]


def test_tasks_are_enqueued_for_the_callers_tenant(keyed: ApiServer):
    tenant = new_tenant()
    with keyed.client(key=ADMIN_KEY, tenant=tenant) as c:
        r = c.post(
            "/v1/tasks", json={"tasks": [{"task_type": "memory", "tenant_id": "someone-else", "note": 1}]}
        )
        assert r.status_code == 201, r.text
        (task_id,) = r.json()["task_ids"]
        row = c.get(f"/v1/tasks/{task_id}").json()["task"]
        assert row["tenant_id"] == tenant and row["task_type"] == "memory"
        assert row["payload"] == {"note": 1}


def test_every_problem_of_a_request_is_listed(keyed: ApiServer):
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant()) as c:
        r = c.post("/v1/tasks", json={"tasks": [{"priority": 5, "from_page": "x", "id": "a" * 40}]})
        assert r.status_code == 422
        locs = {tuple(p["loc"]) for p in r.json()["detail"]}
        assert {
            ("body", "tasks", 0, "priority"),
            ("body", "tasks", 0, "from_page"),
            ("body", "tasks", 0, "id"),
        } <= locs
        r = c.post("/v1/documents", data={"priority": "7"})
        assert r.status_code == 422
        locs = {tuple(p["loc"]) for p in r.json()["detail"]}
        assert {("body", "files"), ("body", "kb"), ("body", "priority")} <= locs
        r = c.get("/v1/search", params={"k": "1001"})
        assert {tuple(p["loc"]) for p in r.json()["detail"]} == {
            ("query", "kb"),
            ("query", "q"),
            ("query", "k"),
        }


def test_a_body_over_the_cap_is_refused_with_413(open_server: ApiServer):
    big = b"x" * (OPEN_MAX_REQUEST_BYTES + 1)
    with open_server.client(tenant=new_tenant()) as c:
        r = c.post("/v1/documents", data={"kb": "k"}, files=[("files", ("big.txt", big))])
        assert r.status_code == 413

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(8):
                yield b"y" * (OPEN_MAX_REQUEST_BYTES // 4)

        headers = {"Content-Type": "application/json"}
        r = c.post("/v1/tasks", content=chunks(), headers=headers)
        assert r.status_code == 413
        ok = c.post("/v1/documents", data={"kb": "k"}, files=[("files", ("small.txt", b"fits"))])
        assert ok.status_code == 201


def test_a_tenants_limit_refuses_with_429(keyed: ApiServer, api_settings: Settings):
    many_docs, full_queue = new_tenant(), new_tenant()
    set_limits(api_settings, many_docs, {"max_docs": 1})
    with keyed.client(key=ADMIN_KEY, tenant=many_docs) as c:
        files = [("files", ("a.txt", b"one")), ("files", ("b.txt", b"two"))]
        r = c.post("/v1/documents", data={"kb": "k"}, files=files)
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        assert r.json()["error"] == "SubmissionTooLarge" and r.json()["limit"] == "max_docs"
    set_limits(api_settings, full_queue, {"max_queued": 1, "max_running": 0})  # paused: stays queued
    with keyed.client(key=ADMIN_KEY, tenant=full_queue) as c:
        assert c.post("/v1/tasks", json={"tasks": [{"task_type": "memory"}]}).status_code == 201
        r = c.post("/v1/tasks", json={"tasks": [{"task_type": "memory"}]})
        assert r.status_code == 429 and r.json()["error"] == "TenantQueueFull"
        r = c.post("/v1/documents", data={"kb": "k"}, files=[("files", ("c.txt", b"three"))])
        assert r.status_code == 429 and "retry-after" in r.headers


def test_a_long_memory_message_is_taken_and_fields_json_cannot_carry_are_a_422(keyed: ApiServer):
    """A payload over TEXT's 64 KiB is stored whole; an integer past 64 bits or a payload over
    MAX_PAYLOAD_BYTES is refused with a 422 that says why (they were 500s)."""
    long = "word " * 14_000  # 70,000 characters
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant()) as c:
        r = c.post("/v1/tasks", json={"tasks": [{"task_type": "memory", "message_dict": {"content": long}}]})
        assert r.status_code == 201, r.text
        row = c.get(f"/v1/tasks/{r.json()['task_ids'][0]}").json()["task"]
        assert row["payload"]["message_dict"]["content"] == long
        r = c.post("/v1/tasks", json={"tasks": [{"task_type": "memory", "n": 10**20}]})
        assert r.status_code == 422 and "must be JSON" in r.json()["detail"], r.text
    with pytest.raises(ValueError, match="over the"):
        _check_payload({"content": "x" * (MAX_PAYLOAD_BYTES + 1)})
