"""A blank search query is a 422 over HTTP (the domain's ``ValueError("empty query")``), not a
list of arbitrary hits: the route's ``min_length=1`` refuses only the empty string."""

from __future__ import annotations

import pytest

from tests.api.support import ADMIN_KEY, ApiServer, new_tenant


@pytest.mark.parametrize("query", ["   ", "\t\n"])
def test_a_blank_query_is_refused_with_422(keyed: ApiServer, query: str):
    with keyed.client(key=ADMIN_KEY, tenant=new_tenant()) as c:
        r = c.post("/v1/documents", data={"kb": "books"}, files=[("files", ("a.txt", b"first document"))])
        assert r.status_code == 201, r.text  # the knowledge base exists
        r = c.get("/v1/search", params={"kb": "books", "q": query})
        assert (r.status_code, r.json()) == (422, {"error": "ValueError", "detail": "empty query"})
        r = c.post("/v1/search", json={"kb": "books", "q": query})
        assert (r.status_code, r.json()) == (422, {"error": "ValueError", "detail": "empty query"})
        assert c.get("/v1/search", params={"kb": "books", "q": ""}).status_code == 422  # as before
