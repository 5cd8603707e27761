"""Keys and tenants: 401 without a good key, 403 for another tenant's header or an admin route,
and another tenant's task or document reads as absent (404, never 403)."""

from __future__ import annotations

from tests.api.support import ADMIN_KEY, TENANT_KEYS, ApiServer, new_tenant

ALPHA, BETA = TENANT_KEYS["alpha"], TENANT_KEYS["beta"]


def test_a_keyed_server_refuses_a_request_without_a_good_key(keyed: ApiServer):
    with keyed.client() as c:
        r = c.get("/v1/tenants/me")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        for value in ("Bearer wrong", "Basic YWxhZGRpbjpvcGVu", "Bearer", "Token x"):
            assert c.get("/v1/tenants/me", headers={"Authorization": value}).status_code == 401
        assert c.get("/v1/tenants/me", headers={"Authorization": b"Bearer \xff\xfe"}).status_code == 401


def test_a_tenant_key_fixes_its_tenant(keyed: ApiServer):
    with keyed.client(key=ALPHA) as c:
        assert c.get("/v1/tenants/me").json()["tenant_id"] == "alpha"
        assert c.get("/v1/tenants/me", headers={"X-Tenant-Id": "alpha"}).status_code == 200
        r = c.get("/v1/tenants/me", headers={"X-Tenant-Id": "beta"})
        assert r.status_code == 403
        assert c.get("/v1/tenants/me", headers={"X-Tenant-Id": "no spaces!"}).status_code == 422


def test_the_admin_key_acts_for_the_tenant_its_header_names(keyed: ApiServer):
    tenant = new_tenant()
    with keyed.client(key=ADMIN_KEY, tenant=tenant) as c:
        me = c.get("/v1/tenants/me").json()
        assert me["tenant_id"] == tenant and me["admin"] is True
        assert me["limits"]["max_running"] == keyed.settings.tenant_max_running


def test_admin_routes_take_the_admin_key_only(keyed: ApiServer, open_server: ApiServer):
    with keyed.client() as c:
        assert c.delete("/v1/results").status_code == 401
    with keyed.client(key=ALPHA) as c:
        assert c.delete("/v1/results").status_code == 403
    with keyed.client(key=ADMIN_KEY) as c:
        r = c.delete("/v1/results", params={"tenant": new_tenant()})
        assert r.status_code == 200 and r.json()["removed"] == 0
    with open_server.client() as c:  # no admin key configured: admin routes are off
        assert c.delete("/v1/results").status_code == 403


def test_another_tenants_task_and_document_read_as_absent(keyed: ApiServer):
    with keyed.client(key=ALPHA) as a:
        r = a.post("/v1/documents", data={"kb": "secrets"}, files=[("files", ("s.txt", b"alpha only"))])
        assert r.status_code == 201, r.text
        doc = r.json()["documents"][0]
        task_id, doc_id = doc["task_ids"][0], doc["id"]
        assert a.get(f"/v1/tasks/{task_id}").status_code == 200
    with keyed.client(key=BETA) as b:
        for path in (
            f"/v1/tasks/{task_id}",
            f"/v1/documents/{doc_id}",
            f"/v1/tasks/{task_id}/result",
            f"/v1/tasks/{task_id}/watch",
            f"/v1/documents/{doc_id}/watch",
        ):
            assert b.get(path).status_code == 404, path
        for path in (f"/v1/tasks/{task_id}/cancel", f"/v1/documents/{doc_id}/retry"):
            assert b.post(path).status_code == 404, path
        assert b.get("/v1/search", params={"kb": "secrets", "q": "alpha"}).status_code == 404
        # nor can beta enqueue work on alpha's document, or take its task's id
        assert b.post("/v1/tasks", json={"tasks": [{"doc_id": doc_id}]}).status_code == 404
        assert b.post("/v1/tasks", json={"tasks": [{"id": task_id}]}).status_code == 409
    with keyed.client(key=ALPHA) as a:  # alpha may act on its own document (an executor of the
        # session may have run the task by now: then nothing is left to cancel, still a 200)
        r = a.post(f"/v1/documents/{doc_id}/cancel")
        assert r.status_code == 200 and r.json()["task_ids"] in ([task_id], []), r.text


def test_an_open_server_takes_the_tenant_header_or_the_default(open_server: ApiServer):
    with open_server.client() as c:
        assert c.get("/v1/tenants/me").json()["tenant_id"] == "default"
        assert c.get("/v1/tenants/me", headers={"X-Tenant-Id": "gamma"}).json()["tenant_id"] == "gamma"
        assert c.get("/healthz").json()["ok"] is True
