"""The watchers' hub: one Redis subscriber and one row poller per server process, fanning out
wake-ups to each watcher's bounded memory channel.

Executors write progress into the task rows and publish only completion events on the updates
channel (``Keys.updates``). A watcher registers here *before* it reads its row (no event is
missed between the read and the subscription), and is woken when a completion event names its
task or document (at once) or when the poller sees the rows change (every ``POLL_S``). A wake-up
carries nothing: the watcher reads its row again. The subscriber is a thread running redis-py's
pubsub loop: it reconnects with a 1 to 30 s backoff and PINGs every ``PING_S``; while it is away,
the poller still wakes every watcher whose row changes. A watcher may name many ids (a dashboard
page, ``ids=``); listeners (``add_listener``) see each event itself (the dashboard's history). The reaper drops registrations whose
watcher went away without closing and the poller's memory of ids nobody watches any more.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import orjson
import peewee
import redis
import trio

from db.database import RETRYABLE_DB_ERRORS, connection
from db.models import Task
from db.streams import RETRYABLE_REDIS_ERRORS, connect
from ingest.api.runtime import Runtime

log = logging.getLogger(__name__)

POLL_S = 0.5
PING_S = 15.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 30.0
REAP_S = 60.0
WAKE_BUFFER = 4  # a wake-up that finds the channel full is dropped: one pending is enough
POLL_BATCH = 1000


class TooManyWatchers(Exception):
    """The process already keeps ``api_max_watchers`` watchers."""


@dataclass(eq=False)
class Watcher:
    """One registration: what it watches and where its wake-ups go."""

    number: int
    task_id: str | None
    doc_id: str | None
    send: trio.MemorySendChannel[None]
    receive: trio.MemoryReceiveChannel[None]
    since: float = field(default_factory=time.monotonic)
    ids: tuple[str, ...] = ()

    def wake(self) -> None:
        with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.send.send_nowait(None)


@dataclass(frozen=True)
class HubStatistics:
    watchers: int
    events: int
    wakeups: int
    subscribed: bool
    reconnects: int


class Hub:
    """Registrations by task and document id; the subscriber thread, poller and reaper."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.max_watchers = runtime.settings.api_max_watchers
        self._watchers: dict[int, Watcher] = {}
        self._by_id: defaultdict[str, set[Watcher]] = defaultdict(set)
        self._numbers = itertools.count(1)
        self._seen: dict[str, tuple[Any, ...]] = {}  # id → last polled fingerprint
        self._stop = threading.Event()
        self._subscribed = False
        self._events = self._wakeups = self._reconnects = 0
        self._listeners: list[Callable[[dict[str, Any]], None]] = []

    # -- registrations -----------------------------------------------------------------

    @contextmanager
    def watch(
        self, *, task_id: str | None = None, doc_id: str | None = None, ids: Sequence[str] = ()
    ) -> Iterator[Watcher]:
        """Register a watcher for the block (of a task, a document, or any task and document
        ids); raises :class:`TooManyWatchers` when full."""
        if len(self._watchers) >= self.max_watchers:
            raise TooManyWatchers(f"this server keeps {self.max_watchers} watchers at most")
        send, receive = trio.open_memory_channel[None](WAKE_BUFFER)
        watcher = Watcher(next(self._numbers), task_id, doc_id, send, receive, ids=tuple(ids))
        self._watchers[watcher.number] = watcher
        for key in self._ids_of(watcher):
            self._by_id[key].add(watcher)
        try:
            yield watcher
        finally:
            self._drop(watcher)

    @staticmethod
    def _ids_of(watcher: Watcher) -> list[str]:
        return list(dict.fromkeys(i for i in (watcher.task_id, watcher.doc_id, *watcher.ids) if i))

    def _drop(self, watcher: Watcher) -> None:
        self._watchers.pop(watcher.number, None)
        for key in self._ids_of(watcher):
            group = self._by_id.get(key)
            if group is not None:
                group.discard(watcher)
                if not group:
                    del self._by_id[key]
        watcher.send.close()
        watcher.receive.close()

    def _wake_ids(self, ids: Sequence[str]) -> None:
        for key in ids:
            for watcher in list(self._by_id.get(key, ())):
                watcher.wake()
                self._wakeups += 1

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener(event)`` on the loop for each event of the updates channel."""
        self._listeners.append(listener)

    def statistics(self) -> HubStatistics:
        return HubStatistics(
            len(self._watchers), self._events, self._wakeups, self._subscribed, self._reconnects
        )

    # -- the tasks ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscriber, poller and reaper until cancelled."""
        token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._subscribe, token)
                nursery.start_soon(self._poll_forever)
                nursery.start_soon(self._reap_forever)
                task_status.started()
        finally:
            self._stop.set()

    async def _subscribe(self, token: trio.lowlevel.TrioToken) -> None:
        # its own limiter: the thread lives as long as the server, outside the request limits
        limiter = trio.CapacityLimiter(1)
        await trio.to_thread.run_sync(self._listen, token, limiter=limiter, abandon_on_cancel=True)

    def _listen(self, token: trio.lowlevel.TrioToken) -> None:
        """The subscriber thread: one connection of its own, reconnecting with backoff."""
        backoff = BACKOFF_MIN_S
        while not self._stop.is_set():
            client = connect(self.runtime.settings)
            started = time.monotonic()
            try:
                self._listen_once(client, token)
                return
            except (*RETRYABLE_REDIS_ERRORS, redis.RedisError, OSError) as exc:  # type: ignore[misc]  # mypy reads no starred tuple in except
                self._subscribed = False
                self._reconnects += 1
                if time.monotonic() - started > BACKOFF_MAX_S:
                    backoff = BACKOFF_MIN_S  # it had been up a while: start the backoff over
                log.warning("updates subscriber lost Redis (%r); again in %.0f s", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
            except trio.RunFinishedError:
                return
            finally:
                self._subscribed = False
                client.close()

    def _listen_once(self, client: redis.Redis, token: trio.lowlevel.TrioToken) -> None:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(self.runtime.keys.updates)
            self._subscribed = True
            last_ping = time.monotonic()
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    event = _event(message.get("data"))
                    if event is not None:
                        ids = _ids_in(event)
                        trio.from_thread.run_sync(self._on_event, ids, event, trio_token=token)
                if time.monotonic() - last_ping >= PING_S:
                    pubsub.ping()
                    last_ping = time.monotonic()
        finally:
            pubsub.close()

    def _on_event(self, ids: list[str], event: dict[str, Any] | None = None) -> None:
        self._events += 1
        for listener in self._listeners:
            if event is None:
                break
            try:
                listener(event)
            except Exception:  # a listener's bug must not stop the subscriber
                log.exception("updates listener failed")
        self._wake_ids(ids)

    async def _poll_forever(self) -> None:
        while True:
            await trio.sleep(POLL_S)
            ids = list(self._by_id)
            if not ids:
                continue
            try:
                now = await self.runtime.in_db(_fingerprints, ids)
            except (*RETRYABLE_DB_ERRORS, peewee.DatabaseError) as exc:
                log.warning("watch poller: the database did not answer (%r)", exc)
                continue
            changed = [i for i, fp in now.items() if self._seen.get(i) != fp]
            self._seen.update(now)
            self._wake_ids(changed)

    async def _reap_forever(self) -> None:
        while True:
            await trio.sleep(REAP_S)
            self.reap()

    def reap(self) -> int:
        """Drop registrations nobody reads any more and fingerprints of unwatched ids."""
        gone = [w for w in self._watchers.values() if _closed(w)]
        for watcher in gone:
            self._drop(watcher)
        for key in [k for k in self._seen if k not in self._by_id]:
            del self._seen[key]
        return len(gone)


def _closed(watcher: Watcher) -> bool:
    return bool(watcher.receive.statistics().open_receive_channels == 0)


def _event(data: Any) -> dict[str, Any] | None:
    """An event of the updates channel as a dict (None when it is not a JSON object)."""
    try:
        event = orjson.loads(data)
    except (orjson.JSONDecodeError, TypeError):
        return None
    return event if isinstance(event, dict) else None


def _event_ids(data: Any) -> list[str]:
    """The task and document ids a completion event names (an unreadable one names none)."""
    event = _event(data)
    return [] if event is None else _ids_in(event)


def _ids_in(event: dict[str, Any]) -> list[str]:
    return [str(event[k]) for k in ("task_id", "doc_id") if isinstance(event.get(k), str) and event[k]]


def _fingerprints(ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """Blocking: for each id, what changes when its task (or a task of its document) moves."""
    out: dict[str, tuple[Any, ...]] = {}
    with connection():
        for start in range(0, len(ids), POLL_BATCH):
            batch = list(ids[start : start + POLL_BATCH])
            rows = Task.select(Task.id, Task.status, Task.progress, Task.update_time).where(
                Task.id.in_(batch)
            )
            for tid, status, progress, updated in rows.tuples():
                out[tid] = (status, progress, updated)
            by_doc = (
                Task.select(
                    Task.doc_id,
                    peewee.fn.COUNT(Task.id),
                    peewee.fn.MAX(Task.update_time),
                    peewee.fn.SUM(Task.progress),
                )
                .where(Task.doc_id.in_(batch))
                .group_by(Task.doc_id)
            )
            for doc, count, updated, progress in by_doc.tuples():
                out[doc] = (int(count), updated, float(progress or 0))
    return out
