"""Watching a real parse task run by a real executor (server-sent events), then its result
(single use: a second fetch does not extend its life) and a search of what it indexed."""

from __future__ import annotations

import redis

from db.config import Settings
from db.keys import Keys
from tests.api.support import ADMIN_KEY, ApiServer, new_tenant, read_events
from tests.helpers import wait_until
from tests.procs import ExecutorProcess

TEXT = b"The lighthouse keeper counted ships every night.\n\n" * 40


def _submit(c, name: str, data: bytes, kb: str = "harbour") -> dict:
    r = c.post("/v1/documents", data={"kb": kb}, files=[("files", (name, data))])
    assert r.status_code == 201, r.text
    return r.json()["documents"][0]


def test_a_watch_sees_a_parse_task_to_its_end(keyed: ApiServer, executor: ExecutorProcess):
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant(), timeout=60) as c:
        doc = _submit(c, "lighthouse.txt", TEXT)
        task_id = doc["task_ids"][0]
        with c.stream("GET", f"/v1/tasks/{task_id}/watch") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = read_events(r)
        names = [e for e, _ in events]
        assert names[0] == "state" and names[-1] == "end", names
        assert set(names) <= {"state", "progress", "end"}
        assert events[-1][1]["status"] == "done"
        assert events[-1][1]["task"]["chunk_count"] > 0
        # the document's own watch of a finished document: its state, then its end at once
        with c.stream("GET", f"/v1/documents/{doc['id']}/watch") as r:
            events = read_events(r)
        assert [e for e, _ in events] == ["state", "end"] and events[-1][1]["status"] == "done"


def test_a_single_use_result_is_not_extended_by_a_second_fetch(
    keyed: ApiServer, executor: ExecutorProcess, api_settings: Settings
):
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant(), timeout=60) as c:
        task_id = _submit(c, "result.txt", b"a result to fetch " * 20)["task_ids"][0]
        result = wait_until(
            lambda: (r := c.get(f"/v1/tasks/{task_id}/result")).status_code == 200 and r.json(), 60
        )
        assert result["task_id"] == task_id and result["kind"] == "success" and result["status"] == "done"
        client = redis.Redis.from_url(api_settings.redis_url)
        try:
            key = Keys(api_settings.key_prefix).result(task_id)
            first = client.pttl(key)
            assert 0 < first <= api_settings.result_removal_delay_s * 1000
            assert c.get(f"/v1/tasks/{task_id}/result").status_code == 200
            assert 0 < client.pttl(key) <= first
        finally:
            client.close()
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant()) as other:
        assert other.get(f"/v1/tasks/{task_id}/result").status_code == 404


def test_search_finds_what_a_task_indexed(keyed: ApiServer, executor: ExecutorProcess):
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant(), timeout=120) as c:
        task_id = _submit(c, "ships.txt", TEXT, kb="ships")["task_ids"][0]
        with c.stream("GET", f"/v1/tasks/{task_id}/watch") as r:
            assert read_events(r)[-1][1]["status"] == "done"
        r = c.get("/v1/search", params={"kb": "ships", "q": "who counts ships?", "k": 3})
        assert r.status_code == 200, r.text
        hits = r.json()["hits"]
        assert 1 <= len(hits) <= 3 and hits[0]["doc_name"] == "ships.txt"
        assert set(hits[0]) == {"chunk_id", "doc_id", "doc_name", "page", "last_page", "score", "content"}
        assert hits[0]["page"] is None and hits[0]["last_page"] is None  # a text file has no pages
        assert c.get("/v1/search", params={"kb": "ships", "q": "x", "mode": "sparse"}).status_code == 422
        r = c.post("/v1/search", json={"kb": "ships", "q": "lighthouse", "k": 1})
        assert r.status_code == 200 and len(r.json()["hits"]) == 1
        assert c.get("/v1/search", params={"kb": "nowhere", "q": "x"}).status_code == 404
