"""Cancel and retry over HTTP, the watcher cap (503) and a watcher whose client went away."""

from __future__ import annotations

import orjson

from db.config import Settings
from db.keys import Keys
from db.results import Announcement, Results, result_record
from db.streams import connect
from ingest.tenants import set_limits
from tests.api.support import ADMIN_KEY, ApiServer, new_tenant
from tests.helpers import wait_until


def _paused_tenant(settings: Settings) -> str:
    tenant = new_tenant()
    set_limits(settings, tenant, {"max_running": 0})  # its tasks stay queued
    return tenant


def test_cancel_then_retry_a_task_and_a_document(keyed: ApiServer, api_settings: Settings):
    with keyed.client(key=ADMIN_KEY, tenant=_paused_tenant(api_settings)) as c:
        r = c.post("/v1/documents", data={"kb": "k"}, files=[("files", ("a.txt", b"to cancel"))])
        doc = r.json()["documents"][0]
        task_id = doc["task_ids"][0]
        assert c.post(f"/v1/tasks/{task_id}/retry").json()["skipped"][0][0] == task_id  # still queued
        r = c.post(f"/v1/tasks/{task_id}/cancel")
        assert r.status_code == 200 and r.json() == {
            "target": "task",
            "task_ids": [task_id],
            "doc_ids": [doc["id"]],
        }
        assert c.get(f"/v1/tasks/{task_id}").json()["task"]["status"] == "cancelled"
        r = c.post(f"/v1/documents/{doc['id']}/retry")
        assert r.status_code == 200 and r.json()["task_ids"] == [task_id]
        assert c.get(f"/v1/tasks/{task_id}").json()["task"]["status"] == "queued"
        assert c.post(f"/v1/documents/{doc['id']}/cancel").json()["task_ids"] == [task_id]
        assert c.post(f"/v1/tasks/{doc['id']}/cancel").status_code == 404  # a document id on the task route
        assert c.post("/v1/documents/0123456789abcdef/retry").status_code == 404


def test_one_watcher_too_many_is_503_and_a_gone_client_frees_its_place(
    open_server: ApiServer, api_settings: Settings
):
    with open_server.client(tenant=_paused_tenant(api_settings)) as c:
        r = c.post("/v1/tasks", json={"tasks": [{"task_type": "memory"}]})
        (task_id,) = r.json()["task_ids"]
        with c.stream("GET", f"/v1/tasks/{task_id}/watch") as first:
            assert first.status_code == 200
            lines = first.iter_lines()
            assert "event: state" in [next(lines) for _ in range(3)]
            r = c.get(f"/v1/tasks/{task_id}/watch")
            assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
        wait_until(lambda: c.get("/healthz").json()["watchers"]["watchers"] == 0, 10)
        with c.stream("GET", f"/v1/tasks/{task_id}/watch") as again:
            assert again.status_code == 200
            c.post(f"/v1/tasks/{task_id}/cancel")
            events = [line for line in again.iter_lines() if line.startswith("event: ")]
        assert events[0] == "event: state" and events[-1] == "event: end"


def test_admin_clears_results_by_tenant_and_age(keyed: ApiServer, api_settings: Settings):
    tenant = new_tenant()
    client = connect(api_settings.redis_url)
    try:
        results = Results(client, Keys(api_settings.key_prefix))
        row = {"id": new_tenant(), "tenant_id": tenant, "doc_id": "", "task_type": "parse"}
        record = result_record(row, "done", finished_at=1000)
        assert results.announce([Announcement({"task_id": row["id"]}, record)], ttl_s=600) == 1
    finally:
        client.close()
    with keyed.client(key=ADMIN_KEY) as c:
        assert c.delete("/v1/results", params={"older_than": "abc"}).status_code == 422
        r = c.delete("/v1/results", params={"older_than": "1d", "tenant": tenant})
        assert r.json()["removed"] == 1 and r.json()["older_than_ms"] == 86_400_000
        assert orjson.loads(r.content)["tenant"] == tenant
