"""The watchers' hub in-process: wake-ups reach the watchers of the ids an event names, the cap
holds, and the reaper drops a registration nobody reads and what was polled for it."""

from __future__ import annotations

import pytest
import trio

from ingest.api.hub import Hub, TooManyWatchers, _event_ids
from ingest.api.runtime import Runtime
from ingest.api.watch import sse
from tests.conftest import make_settings


def _hub(max_watchers: int = 3) -> Hub:
    return Hub(Runtime.create(make_settings("it_hub_unused", api_max_watchers=max_watchers)))


async def test_an_event_wakes_the_watchers_of_its_task_and_document_only():
    hub = _hub()
    with hub.watch(task_id="t1") as a, hub.watch(doc_id="d1") as b, hub.watch(task_id="t2") as c:
        hub._on_event(_event_ids(b'{"task_id": "t1", "doc_id": "d1", "status": "done"}'))
        a.receive.receive_nowait()
        b.receive.receive_nowait()
        with pytest.raises(trio.WouldBlock):
            c.receive.receive_nowait()
        for _ in range(10):  # a burst never blocks the hub: extra wake-ups are dropped
            hub._on_event(["t2"])
        assert hub.statistics().watchers == 3
    assert hub.statistics().watchers == 0 and not hub._by_id


async def test_the_cap_refuses_one_watcher_too_many():
    hub = _hub(max_watchers=1)
    with hub.watch(task_id="t1"), pytest.raises(TooManyWatchers), hub.watch(task_id="t2"):
        pass
    with hub.watch(task_id="t2"):
        pass


async def test_the_reaper_drops_what_nobody_reads():
    hub = _hub()
    with hub.watch(task_id="t1") as watcher:
        hub._seen.update({"t1": ("running",), "gone": ("done",)})
        watcher.receive.close()  # its reader went away without closing the registration
        assert hub.reap() == 1
        assert hub.statistics().watchers == 0 and hub._seen == {}


def test_unreadable_events_name_no_ids_and_events_are_one_line_json():
    for data in (b"not json", b"[1]", b'{"task_id": 5}', None, b"\xff"):
        assert _event_ids(data) == []
    assert sse("end", {"a": "b\nc"}) == b'event: end\ndata: {"a":"b\\nc"}\n\n'
