"""The knowledge-base page's retrieval box: its top k is held to what the search takes (1 to
``MAX_K``, and no more than ``INGEST_SEARCH_MAX_K``), and a search's refusal is a note on the
page. The box offered k up to 50 while the search refused more than ``INGEST_SEARCH_MAX_K``
with a ``ValueError`` the page did not catch, so the dashboard answered the API's JSON 422."""

from __future__ import annotations

import re

import httpx
import pytest

from db.database import init_database, unit
from db.models import KnowledgeBase
from ingest.api.dashboard.pages import MAX_K
from ingest.ids import kb_id
from tests.api.support import ADMIN_KEY, ApiServer

KB = kb_id("default", "kb")


def _knowledge_base(db_url: str) -> None:
    """A knowledge base with nothing embedded yet: its search answers no hits without a model."""
    init_database(db_url)
    with unit():
        KnowledgeBase.create(id=KB, name="kb", tenant_id="default")


def _box(html: str) -> tuple[int, int]:
    """The box's (max, value) of its top k input."""
    found = re.search(r'name="k" type="number" min="1" max="(\d+)" value="(\d+)"', html)
    assert found, html
    return int(found.group(1)), int(found.group(2))


def test_top_k_is_held_to_the_searchs_cap_and_the_page_answers(settings, tmp_path):
    s = settings.replace(search_max_k=10, api_admin_key=ADMIN_KEY)
    _knowledge_base(s.db_url)
    server = ApiServer(s, tmp_path / "server.log")
    try:
        server.wait_ready()
        with server.client(key=ADMIN_KEY) as c:
            for asked, held in ((20, 10), (MAX_K + 1, 10), (10**9, 10), (0, 1), (-3, 1), (7, 7)):
                r = c.get(f"/dashboard/kbs/{KB}", params={"q": "hello", "k": asked})
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
                assert _box(r.text) == (10, held), asked
                assert "no hits" in r.text and 'class="note"' not in r.text
    finally:
        server.stop()


async def test_a_refusal_of_the_search_is_a_note_on_the_page(settings, monkeypatch: pytest.MonkeyPatch):
    from ingest.api.app import create_app

    _knowledge_base(settings.db_url)

    def refuse(*args: object, **kwargs: object) -> list[object]:
        raise ValueError("this search is refused")

    monkeypatch.setattr("ingest.search.search", refuse)
    app = create_app(settings)  # no keys: the page reads as anyone
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dashboard.test") as c:
        r = await c.get(f"/dashboard/kbs/{KB}", params={"q": "hello", "k": 3})
    app.state.runtime.close()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
    assert '<p class="note">this search is refused</p>' in r.text
    assert _box(r.text) == (MAX_K, 3)
