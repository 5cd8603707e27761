"""A slow search (a large knowledge base, a big k) does not hold up another tenant's search in
the same server process: searches overlap, and only their query encodes take turns."""

from __future__ import annotations

import threading

import trio

from ingest import search as search_module
from ingest.api.query import run_search
from ingest.api.runtime import Runtime
from tests.conftest import make_settings


async def test_a_search_runs_while_a_slow_one_of_another_tenant_is_still_reading(monkeypatch):
    runtime = Runtime.create(make_settings("it_search_unused"))
    slow_may_end = threading.Event()

    def fake_search(settings, kb, q, k, *, tenant_id, mode):
        if tenant_id == "slow":
            assert slow_may_end.wait(10), "the other search never ran beside this one"
        return []

    monkeypatch.setattr(search_module, "search", fake_search)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_search, runtime, "big", "q", 1000, "slow")
            await trio.sleep(0.1)
            with trio.fail_after(5):
                assert await run_search(runtime, "small", "q", 5, "quick") == []
            slow_may_end.set()
    finally:
        slow_may_end.set()
        runtime.close()
