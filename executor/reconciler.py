"""Reconciler: rows that should have a stream entry and have none are published again.

Under a short fleet lock (``SET lock:reconcile NX PX``: one pass of the fleet per interval),
following ``LIFECYCLE.md`` ("Leases, reclaim, hand-back, reconcile"):

- a row ``queued`` whose ``update_time`` is older than ``INGEST_RECONCILE_GRACE_S`` and whose
  published key is missing (its XADD failed, or Redis lost it) is published again; queued rows
  are paged through in (update_time, id) order by the (status, update_time) index, up to
  ``QUEUED_PAGES_PER_PASS`` pages a pass, the next pass going on from where this one stopped,
  so a lost publish behind a large healthy backlog is found within a pass or a few;
- a row ``running`` as old, whose owner has no heartbeat and whose published key is missing,
  goes back to ``queued`` (fenced on its attempt) and is published, once the fleet's passes
  have seen it so for a heartbeat TTL (the first sightings are kept in Redis, on its clock,
  and go with its data): right after Redis lost its data every heartbeat is gone, and a live
  owner writes its own again only at its next tick;
- chunks of ``cancelled`` tasks that no live executor is running are removed (their vectors
  too; an engine that refuses leaves them to ``ingest reindex``);
- consumers with no pending entry and no heartbeat are removed from the group (one Lua script
  checks both, ``Streams.remove_consumers``);
- the tenants' limit overrides are copied into Redis wherever the copy there differs from the
  table (a lost Redis, a ``tenant limits`` whose copy failed), and the mirror marked complete
  (the fair gate reads the running cap there, and admits nothing without that mark); besides
  the pass, every executor looks for the mark at start, at once when one of its dispatches
  says the mark is missing (:meth:`Reconciler.limits_missing`), and every
  ``LIMITS_FALLBACK_S`` besides, and makes the complete copy itself when it is missing, so a
  fresh or emptied Redis does not hold the fleet's admissions up until a pass;
- once an hour per executor, with ``INGEST_TASK_RETENTION_S`` set, finished task rows past it
  are pruned (:func:`ingest.prune.prune_tasks`).

Every publish is the guarded one (``Streams.publish_many``), so a task never gets a second live
entry; the re-publishes are counted in the fleet's stats hash (``ingest status`` shows them).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import redis
import trio

from db.config import Settings
from db.database import RETRYABLE_DB_ERRORS, connection, lock_for_update
from db.models import CANCELLED, QUEUED, RUNNING, Chunk, Task, now_ms
from db.streams import RETRYABLE_REDIS_ERRORS, Streams
from executor.context import Limiters
from executor.outage import Outage
from executor.progress import append_line
from ingest import vectors
from ingest.documents import lock_documents, recompute_documents
from ingest.prune import prune_tasks
from ingest.publish import MESSAGE_COLUMNS, task_message
from ingest.tenants import copy_limits

T = TypeVar("T")
log = logging.getLogger("executor.reconciler")


async def _nothing() -> None:
    return None


BATCH = 1000  # rows looked at per kind and pass (queued rows: per page)
QUEUED_PAGES_PER_PASS = 20  # queued rows looked at per pass: up to 20 pages of BATCH
PRUNE_INTERVAL_S = 3600.0  # how often one executor prunes finished rows past their retention
# An executor looks for the limits mirror's mark (one EXISTS) when a dispatch of its own found it
# missing, at most every LIMITS_LOOK_GAP_S, and unasked every LIMITS_FALLBACK_S.
LIMITS_LOOK_GAP_S = 0.1
LIMITS_FALLBACK_S = 5.0
MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 60.0
STAT_REPUBLISHED = "republished"  # every re-publish (queued and re-queued rows)
STAT_REQUEUED = "requeued_running"  # running rows of dead owners set queued
SIGHTINGS_TTL_PASSES = 6  # the orphan sightings' hash expires after this many pass intervals

# The first sightings of running rows with no owner's heartbeat and no entry, shared by the
# fleet's passes (Keys.orphan_sightings: field "{task}:{attempt}", value the first sighting's
# time on Redis's clock), in one step: each candidate's first sighting is kept (HSETNX), those
# first seen at least the wait ago are returned, the fields of rows that are no longer candidates
# are removed, and the hash's expiry is renewed (none left: the hash is gone with its last field).
_SIGHTINGS = """
-- KEYS: the sightings hash; ARGV: its expiry (ms), the wait (ms), this pass's candidates
pcall(redis.replicate_commands)  -- Redis 6.2: TIME before writes needs effects replication
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stamp = string.format('%d', now)  -- an integer's digits (a number argument may not be)
local wait = tonumber(ARGV[2])
local candidate, due = {}, {}
for i = 3, #ARGV do
  local f = ARGV[i]
  candidate[f] = true
  redis.call('HSETNX', KEYS[1], f, stamp)
  local first = tonumber(redis.call('HGET', KEYS[1], f))
  if not first then  -- not a time (not ours): seen now
    first = now
    redis.call('HSET', KEYS[1], f, stamp)
  end
  if now - first >= wait then due[#due + 1] = f end
end
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not candidate[f] then redis.call('HDEL', KEYS[1], f) end
end
if #ARGV > 2 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return due
"""


def _sighting(row: dict[str, Any]) -> str:
    """A running row's field in the sightings' hash: its run (a new claim is a new run)."""
    return f"{row['id']}:{row['attempt']}"


@dataclass(frozen=True)
class ReconcileReport:
    republished: list[str] = field(default_factory=list)  # task ids published again
    requeued: list[str] = field(default_factory=list)  # running rows set queued (then published)
    chunks_removed: int = 0
    consumers_removed: list[str] = field(default_factory=list)
    limits_mirrored: int = 0  # tenants whose overrides were written to Redis again
    tasks_pruned: int = 0  # finished rows past INGEST_TASK_RETENTION_S removed

    @property
    def changed(self) -> bool:
        return bool(
            self.republished
            or self.requeued
            or self.chunks_removed
            or self.consumers_removed
            or self.limits_mirrored
            or self.tasks_pruned
        )


class Reconciler:
    """One pass every ``interval_s`` (jittered) when the fleet lock is free."""

    def __init__(
        self,
        settings: Settings,
        streams: Streams,
        limiters: Limiters,
        db_outage: Outage,
        redis_outage: Outage,
    ) -> None:
        self.streams = streams
        self.client: redis.Redis = streams.client
        self.keys = streams.keys
        self.limiters = limiters
        self.db_outage = db_outage
        self.redis_outage = redis_outage
        self.grace_ms = int(settings.reconcile_grace_s * 1000)
        self.interval_s = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, settings.reconcile_grace_s / 2))
        self.lease_ms = max(100, int(self.interval_s * 1000))
        self.passes = 0
        self.settings = settings
        self._next_prune = 0.0  # monotonic time of the next prune (0: at the first pass)
        self._queued_after: tuple[int, str] | None = None  # where the next page of queued rows starts
        self.heartbeat_ttl_s = settings.heartbeat_ttl_s
        # a running row with no owner's heartbeat and no entry is re-queued once first seen so
        # this long ago (by any executor's pass: the sightings are in Redis, _SIGHTINGS)
        self.orphan_wait_ms = int(settings.heartbeat_ttl_s * 1000)
        # the sightings outlive a few gaps between passes (each pass renews them), never their use
        self.sightings_ttl_ms = int(
            1000 * max(SIGHTINGS_TTL_PASSES * self.interval_s, 2 * self.heartbeat_ttl_s)
        )
        self._sightings = self.client.register_script(_SIGHTINGS)
        self._trio_token: trio.lowlevel.TrioToken | None = None  # the limits loop's run
        self._limits_asked = trio.Event()  # set by a dispatch that found the limits mark missing
        # Called before a copy of the limits when the mark is missing (the daemon: its lease
        # renewal, which takes the slots of its running tasks again if Redis lost them; a
        # copy lets the gate admit, and the caps would not count those tasks).
        self.before_limits_copy: Callable[[], Awaitable[object]] = _nothing

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_limits_mirrored)
            while True:
                await trio.sleep(self.interval_s * random.uniform(0.5, 1.5))
                await self.reconcile_once()

    async def _keep_limits_mirrored(self) -> None:
        """At start, then whenever a dispatch finds the mark missing (:meth:`limits_missing`),
        and every ``LIMITS_FALLBACK_S`` unasked: the complete copy of the tenants' limits when
        the mark of one is missing (a fresh Redis, one that lost its data, a failed copy): the
        gate admits nothing until some executor has made it. The gate says so in every dispatch
        (:attr:`db.gate.Dispatched.limits_missing`), and an executor with a free slot
        dispatches at once on a publish, at least every 2 s when idle: so a loss is repaired
        when it matters, without a look per executor every half second."""
        self._trio_token = trio.lowlevel.current_trio_token()
        while True:
            self._limits_asked = trio.Event()  # a dispatch's word from here on asks for a look
            await self.mirror_limits_if_missing()
            await trio.sleep(LIMITS_LOOK_GAP_S)  # dispatches in a burst (or in an outage): one look
            with trio.move_on_after(LIMITS_FALLBACK_S):
                await self._limits_asked.wait()

    def limits_missing(self) -> None:
        """A dispatch found the limits mirror's mark missing: look (and copy) now. Safe to call
        from any thread (the collector dispatches in one); a no-op until the loop runs, whose
        first look is made at start anyway."""
        token = self._trio_token
        if token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self._ask_for_a_limits_look)

    def _ask_for_a_limits_look(self) -> None:
        self._limits_asked.set()

    async def mirror_limits_if_missing(self) -> int | None:
        """The complete copy if the mark is missing: how many tenants it wrote; 0 when the mark
        was there, None when a service failed (the next look tries again). Before it copies,
        :attr:`before_limits_copy` (the lease renewal) runs."""
        ran, marked = await self._in_thread(self._limits_marked, "look for the limits mark")
        if not ran:
            return None
        if marked:
            return 0
        await self.before_limits_copy()

        def copy_unless_marked() -> int | None:  # None: the mark was there
            return None if self._limits_marked() else self._mirror_limits()

        ran, written = await self._in_thread(copy_unless_marked, "copy of the tenants' limits")
        if not ran:
            return None
        if written is None:
            return 0
        log.info("tenants' limits copied into Redis (its copy was not marked complete): %d written", written)
        return written

    def _limits_marked(self) -> bool:
        return bool(self.client.exists(self.keys.limits_mirrored))

    async def _in_thread(self, fn: Callable[[], T], what: str) -> tuple[bool, T | None]:
        """``fn`` in a thread under the database limiter: (True, its result), or (False, None)
        when a service failed (its outage counts it) or Redis refused (logged). Abandoned on a
        cancel: a stop does not wait out a stalled database's read timeout for work that is
        only ever repeated (a pass's lock lapses with its TTL)."""
        try:
            return True, await trio.to_thread.run_sync(
                fn, limiter=self.limiters.db_limiter, abandon_on_cancel=True
            )
        except RETRYABLE_DB_ERRORS as exc:
            self.db_outage.failed(exc)
        except RETRYABLE_REDIS_ERRORS as exc:
            self.redis_outage.failed(exc)
        except redis.ResponseError as exc:
            log.warning("%s refused by Redis: %s", what, exc)
        return False, None

    async def reconcile_once(self) -> ReconcileReport | None:
        """One pass in a thread; None when another executor holds the lock or a service failed.
        A pass that ran reached the database: a database outage that a failed pass began (an
        idle executor's only database calls may be its passes) is said to end by the next one."""
        began = time.monotonic()
        ran, marked = await self._in_thread(self._limits_marked, "look for the limits mark")
        if ran and not marked:  # the pass copies the limits: this executor's slots first
            await self.before_limits_copy()
        _, report = await self._in_thread(self.reconcile, "reconcile pass")
        if report is not None:
            self.db_outage.ok(since=began)
        if report is not None and report.changed:
            log.warning(
                "reconciled: %d task(s) published again (%d of them running under a dead owner), "
                "%d chunk(s) of cancelled tasks removed, %d consumer(s) removed from the group, "
                "%d tenant(s)' limits mirrored into Redis again, %d finished task row(s) pruned",
                len(report.republished),
                len(report.requeued),
                report.chunks_removed,
                len(report.consumers_removed),
                report.limits_mirrored,
                report.tasks_pruned,
                extra={"task_ids": report.republished[:50]},
            )
        return report

    # -- blocking (in a thread) -------------------------------------------------------------
    def reconcile(self, *, force: bool = False) -> ReconcileReport | None:
        """The pass itself; ``force`` skips the fleet lock (tests, one-off repairs)."""
        if not force and not self.client.set(
            self.keys.lock("reconcile"), uuid.uuid4().hex, nx=True, px=self.lease_ms
        ):
            return None
        self.passes += 1
        mirrored = self._mirror_limits()  # before publishing: the gate admits with the right caps
        cutoff = now_ms() - self.grace_ms
        queued = self._lost_queued(cutoff)
        requeued = self._lost_running(cutoff)
        published = self._publish(queued + requeued)
        return ReconcileReport(
            republished=published,
            requeued=[r["id"] for r in requeued],
            chunks_removed=self._cancelled_chunks(cutoff),
            consumers_removed=self._idle_consumers(),
            limits_mirrored=mirrored,
            tasks_pruned=self._prune(),
        )

    def _prune(self) -> int:
        retention_s = self.settings.task_retention_s
        if retention_s <= 0 or time.monotonic() < self._next_prune:
            return 0
        self._next_prune = time.monotonic() + PRUNE_INTERVAL_S
        return prune_tasks(self.settings, retention_s).tasks_removed

    def _mirror_limits(self) -> int:
        """The complete copy of the limit overrides: each tenant whose copy in Redis differs is
        written, then the mirror is marked complete; returns how many were written."""
        with connection():  # no transaction: the copy reads the table twice (copy_limits)
            return len(copy_limits(self.client, self.keys))

    def _without_entry(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` with no live stream entry: no published key, or one whose entry is
        gone without an ack (trimmed, lost in a failover); such a key is dropped in the same
        step (``Streams.live_entries``), so the published key lives as long as its entry."""
        return {tid for tid, live in zip(ids, self.streams.live_entries(list(ids)), strict=True) if not live}

    def _lost_queued(self, cutoff: int) -> list[dict[str, Any]]:
        """Queued rows as old as the grace without an entry: pages from the cursor on; past the
        last page the cursor goes back to the oldest row."""
        lost: list[dict[str, Any]] = []
        for _ in range(QUEUED_PAGES_PER_PASS):
            rows = self._queued_page(cutoff, self._queued_after)
            self._queued_after = (rows[-1]["update_time"], rows[-1]["id"]) if len(rows) == BATCH else None
            lost += self._still_lost(rows, cutoff)
            if self._queued_after is None:
                break
        return lost

    @staticmethod
    def _queued_page(cutoff: int, after: tuple[int, str] | None) -> list[dict[str, Any]]:
        """Up to BATCH queued rows older than ``cutoff``, after ``after`` in (update_time, id)
        order (a keyset page on the (status, update_time) index: InnoDB's secondary index
        carries the primary key, so the order needs no sort)."""
        where = (Task.status == QUEUED) & (Task.update_time < cutoff)
        if after is not None:
            at, tid = after
            where &= (Task.update_time > at) | ((Task.update_time == at) & (Task.id > tid))
        with connection():
            return list(
                Task.select(*MESSAGE_COLUMNS, Task.update_time)
                .where(where)
                .order_by(Task.update_time, Task.id)
                .limit(BATCH)
                .dicts()
            )

    def _still_lost(self, rows: list[dict[str, Any]], cutoff: int) -> list[dict[str, Any]]:
        missing = self._without_entry([r["id"] for r in rows])
        if not missing:
            return []
        # Still queued and as old: a row whose entry was claimed, run and acked since the first
        # look is done now. A queued row without an entry cannot change until it is published.
        with connection():
            still = {
                tid
                for (tid,) in Task.select(Task.id)
                .where(Task.id.in_(sorted(missing)) & (Task.status == QUEUED) & (Task.update_time < cutoff))
                .tuples()
            }
        return [r for r in rows if r["id"] in still]

    def _lost_running(self, cutoff: int) -> list[dict[str, Any]]:
        with connection():
            rows = list(
                Task.select(*MESSAGE_COLUMNS, Task.owner, Task.attempt, Task.progress_msg)
                .where((Task.status == RUNNING) & (Task.update_time < cutoff))
                .order_by(Task.update_time)
                .limit(BATCH)
                .dicts()
            )
        if not rows:
            self._orphaned_for_a_ttl([])  # no row is a candidate now: their sightings go
            return []
        owners = sorted({r["owner"] for r in rows if r["owner"]})
        beats = self._heartbeats(owners)
        orphaned = [r for r in rows if beats.get(r["owner"]) is None]
        missing = self._without_entry([r["id"] for r in orphaned])
        lost = self._orphaned_for_a_ttl([r for r in orphaned if r["id"] in missing])
        if not lost:
            return []
        with connection() as db, db.atomic():
            return self._requeue(lost)

    def _orphaned_for_a_ttl(self, orphans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Those of ``orphans`` first seen without their owner's heartbeat a heartbeat TTL ago.

        A missing heartbeat means a dead owner only on a Redis that kept its data for a TTL: a
        live owner rewrites its key at its next tick, so right after a restart without
        persistence or a FLUSHALL every owner looks dead (LIFECYCLE: an entry Redis lost runs on
        and finishes). A FLUSHALL leaves no trace, so the absence must be seen twice, a TTL
        apart. The first sightings live in Redis (:attr:`Keys.orphan_sightings`, one script:
        :data:`_SIGHTINGS`), so every executor's pass counts them, and a loss of Redis's data
        takes them along: the wait starts again, as it must."""
        fields = [_sighting(r) for r in orphans]
        args: list[int | str] = [self.sightings_ttl_ms, self.orphan_wait_ms, *fields]
        due = set(self._sightings(keys=[self.keys.orphan_sightings], args=args) or [])
        return [r for r, f in zip(orphans, fields, strict=True) if f in due]

    def _requeue(self, lost: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Running → queued, fenced on the attempt seen; returns the rows that moved."""
        lock_documents([r["doc_id"] for r in lost if r["doc_id"]])
        moved = []
        now = now_ms()
        for r in lost:
            why = (
                f"re-queued by the reconciler: owner {r['owner'] or '?'} has no heartbeat "
                f"(none seen for {self.heartbeat_ttl_s:g} s) and the task no stream entry"
            )
            matched = (
                Task.update(
                    status=QUEUED,
                    owner="",
                    progress_msg=append_line(r["progress_msg"] or "", why),
                    update_time=now,
                )
                .where((Task.id == r["id"]) & (Task.status == RUNNING) & (Task.attempt == r["attempt"]))
                .execute()
            )
            if matched:
                moved.append(r)
        recompute_documents([r["doc_id"] for r in moved if r["doc_id"]])
        return moved

    def _publish(self, rows: list[dict[str, Any]]) -> list[str]:
        if not rows:
            return []
        results = self.streams.publish_many([task_message(r) for r in rows])
        sent = [r["id"] for r, res in zip(rows, results, strict=True) if res is not None]
        requeued = sum(1 for r, res in zip(rows, results, strict=True) if res is not None and "attempt" in r)
        if sent:
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrby(self.keys.stats, STAT_REPUBLISHED, len(sent))
            if requeued:
                pipe.hincrby(self.keys.stats, STAT_REQUEUED, requeued)
            pipe.execute()
        return sent

    def _heartbeats(self, owners: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        if not owners:
            return {}
        values = self.client.mget([self.keys.executor(o) for o in owners])
        out: dict[str, dict[str, Any] | None] = {}
        for owner, raw in zip(owners, values, strict=True):
            try:
                beat = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                beat = {}  # unreadable, but there: alive
            out[owner] = beat if isinstance(beat, dict) or beat is None else {}
        return out

    def _cancelled_chunks(self, cutoff: int) -> int:
        """Chunks of cancelled tasks whose owner is not running them (any more)."""
        with connection():
            found = list(
                Task.select(Task.id, Task.owner, Task.doc_id)
                .where(
                    (Task.status == CANCELLED)
                    & (Task.update_time < cutoff)
                    & Task.id.in_(Chunk.select(Chunk.task_id).distinct())
                )
                .limit(BATCH)
                .tuples()
            )
        if not found:
            return 0
        beats = self._heartbeats(sorted({owner for _, owner, _ in found if owner}))
        idle = [
            (tid, doc)
            for tid, owner, doc in found
            if tid not in ((beats.get(owner) or {}).get("running") or [])
        ]
        if not idle:
            return 0
        with connection() as db, db.atomic():
            lock_documents([doc for _, doc in idle if doc])
            still = [
                tid
                for (tid,) in lock_for_update(
                    Task.select(Task.id).where(Task.id.in_([t for t, _ in idle]) & (Task.status == CANCELLED))
                ).tuples()
            ]
            removed = Chunk.delete().where(Chunk.task_id.in_(still)).execute() if still else 0
            recompute_documents([doc for tid, doc in idle if doc and tid in still])
        vectors.forget_or_log(task_ids=still, what="cancelled tasks'")  # rows first, then the engine
        return int(removed)

    def _idle_consumers(self) -> list[str]:
        removed: list[str] = []
        for stream in self.keys.queues:
            try:
                consumers = self.client.xinfo_consumers(stream, self.keys.group)
            except redis.ResponseError:  # no stream or group (yet)
                continue
            names = [c["name"] for c in consumers if int(c.get("pending") or 0) == 0]
            removed += self.streams.remove_consumers(stream, names)
        return sorted(set(removed))
