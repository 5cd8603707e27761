"""Reads the task streams: own pending entries once at start, then new ones, high priority first."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
import trio

from db.config import Settings
from db.database import RETRYABLE_DB_ERRORS, connection, is_mysql
from db.gate import Gate
from db.keys import Keys
from db.redis_client import on_node_of
from db.streams import BLOCK_MS_MAX, RETRYABLE_REDIS_ERRORS, Entry, Streams, connect, decode_entry
from executor.book import STOP_LOST, Book, Claimed
from executor.claim import ClaimPlan, ClaimRules, OwnTransactionNeeded, validate_and_claim
from executor.context import Limiters
from executor.finisher import Finisher
from executor.metrics import NO_METRICS
from executor.outage import Outage

log = logging.getLogger("executor.collector")

MAX_CLAIMS_IN_FLIGHT = 4  # read-and-claim hops whose commit has not come back yet
ORPHAN_CHECK_S = 30.0  # also after every Redis outage: entries pending under us that we do not know
ORPHAN_SCAN_MAX = 1000
DEFER_RECHECK_S = 2.0  # how soon a deferred entry is looked at again
DISPATCH_ROUNDS_MAX = 8  # dispatch calls in a row while at-cap tenants are being parked
HOPS_STOP_WAIT_S = 5.0  # at a stop, for reads and claims still in I/O it cannot wake (a stalled database)

# For entries pending under this consumer: their fields, only while still pending and ours.
# XCLAIM to ourselves (no JUSTID) counts the re-read as a delivery, so the cap bounds it.
_OWN_ENTRIES = """
local out = {}
for i = 1, #ARGV - 2 do
  local id = ARGV[i + 2]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if p[1] and p[1][2] == ARGV[2] then
    local e = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id)
    local n = p[1][4] + 1
    if e[1] then out[i] = {id, n, e[1][2]} else out[i] = {id, n, false} end
  else
    out[i] = false
  end
end
return out
"""

# The start-up takeover: the next own pending entry after ARGV[3] with its delivery count, read
# (and counted) in one step, so no delivery is missed between the two.
_NEXT_OWN = """
local low = '-'
if ARGV[3] ~= '0' then low = '(' .. ARGV[3] end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], low, '+', 1, ARGV[2])
if not p[1] then return false end
local id = p[1][1]
local e = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id)
local fields = false
if e[1] then fields = e[1][2] end
return {id, p[1][4] + 1, fields}
"""


def read_client(settings: Settings) -> redis.Redis:
    """One connection of its own for the blocking reads, without hidden retries (a retried read
    could take entries whose first reply was lost; the orphan check finds those instead)."""
    return connect(settings, socket_timeout=BLOCK_MS_MAX / 1000 + 8, single_connection=True, retries=False)


def _pairs(flat: list[str] | None) -> dict[str, str] | None:
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else None


def _entries(resp: Any) -> list[Entry]:
    """Entries of a Lua reply ``[[stream, [[id, [field, value, ...]], ...]], ...]``."""
    return [
        decode_entry(stream, eid, _pairs(fields)) for stream, items in resp or [] for eid, fields in items
    ]


def _open_early() -> contextlib.ExitStack | None:
    """On MySQL, a pooled connection with a transaction begun, to be used after a read that may
    block; None elsewhere (SQLite's BEGIN IMMEDIATE would hold the write lock through the read)
    or when the checkout or the BEGIN failed (the hop connects after its read, as before)."""
    if not is_mysql():
        return None
    stack = contextlib.ExitStack()
    try:
        db = stack.enter_context(connection())
        stack.enter_context(db.atomic())
    except BaseException as exc:
        _end_unused(stack)
        if isinstance(exc, RETRYABLE_DB_ERRORS):
            return None
        raise
    return stack


def _end_unused(stack: contextlib.ExitStack) -> None:
    """End an early transaction nothing used (the read found nothing, or failed): commit its
    nothing and give the connection back; a broken connection is the next user's concern."""
    with contextlib.suppress(*RETRYABLE_DB_ERRORS):
        stack.close()


@contextlib.contextmanager
def _transaction() -> Iterator[None]:
    with connection() as db, db.atomic():
        yield


class HopGivenUp(Exception):
    """Raised into a hop's thread that comes back after the stop gave up on it: its claim rolls
    back, and nothing of it starts."""


class Collector:
    """The read loop; every batch it reads is validated, claimed and handed to runners."""

    metrics: Any = NO_METRICS  # the daemon sets its own

    def __init__(
        self,
        settings: Settings,
        consumer: str,
        streams: Streams,
        limiters: Limiters,
        book: Book,
        finisher: Finisher,
        rules: Callable[[], ClaimRules],
        spawn: Callable[[Claimed, bool], None],
        background: Callable[..., None],
        outages: tuple[Outage, Outage],
    ) -> None:
        self.settings = settings
        self.consumer = consumer
        self.streams = streams
        self.keys: Keys = streams.keys
        self.limiters = limiters
        self.book = book
        self.finisher = finisher
        self.rules = rules
        self.spawn = spawn  # (claimed, committed): start a runner
        self.background = background  # start_soon in the daemon's nursery
        self._in_flight = trio.Semaphore(MAX_CLAIMS_IN_FLIGHT)
        self.redis_outage, self.db_outage = outages
        self.reader = read_client(settings)
        self._own = streams.client.register_script(_OWN_ENTRIES)
        self._next_own = self.reader.register_script(_NEXT_OWN)
        self.gate = Gate(self.reader, self.keys)
        self._last_wake = "0-0"  # the newest wake-up seen by the last dispatch
        self._reader_id: int | None = None
        self.stopping = False
        self._givable_scopes: set[trio.CancelScope] = set()  # what a stop gives up (_give_up_after)
        self._given_up = False
        self._closed = False  # run() has returned: nothing of this collector starts a run now
        self.taken_over = trio.Event()  # set once the start-up takeover is done (the sweeper waits)
        # a dispatch found the limits mirror incomplete: called in the read's thread (the daemon
        # sets the reconciler's limits_missing, which copies them at once)
        self.on_limits_missing: Callable[[], None] = lambda: None
        self.reads = 0
        self._last_orphan_check = time.monotonic()

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Take over own pending entries, then read new ones until asked to stop."""
        await self._redis(self.ensure_group)
        try:
            with self._givable():
                await self.take_over()
        finally:
            self.taken_over.set()
        while not self.stopping:
            free = await self.book.wait_free()
            if not free:
                break
            if self._orphan_check_due():
                with self._givable():
                    await self.recover_orphans()
                continue
            await self._in_flight.acquire()
            handed = trio.Event()
            self.background(self._hop, free, handed)
            await handed.wait()
        for _ in range(MAX_CLAIMS_IN_FLIGHT):  # every hop has settled, or was given up
            await self._in_flight.acquire()
        self._closed = True

    @contextlib.contextmanager
    def _givable(self) -> Iterator[None]:
        """A read-and-claim hop, the take-over or an orphan check: given up by a stop that has
        waited ``HOPS_STOP_WAIT_S`` for it (:meth:`_give_up_after`)."""
        with trio.CancelScope() as scope:
            self._givable_scopes.add(scope)
            try:
                yield
            finally:
                self._givable_scopes.discard(scope)

    async def _give_up_after(self, delay_s: float) -> None:
        """A stop's bound on the reads and claims in flight: those whose thread is still blocked
        after ``delay_s`` are given up. A stalled database answers no statement until the read
        timeout (60 s by default), and a stop cannot wake that as it wakes the Redis read. Their
        threads run on unwatched. What they read stays pending under this consumer (taken over
        at the next start, or reclaimed once its lease lapses); a claim that comes back later
        rolls back (:class:`HopGivenUp`); a run a hop started before its claim committed is
        stopped as lost. As a SIGKILL at that moment would, and the kill tests show that loses
        nothing."""
        await trio.sleep(delay_s)
        if not self._givable_scopes:
            return
        self._given_up = True
        log.warning(
            "stopping without %d read-and-claim step(s) still waiting on the database or Redis after %g s;"
            " what they read stays pending",
            len(self._givable_scopes),
            delay_s,
        )
        for scope in self._givable_scopes:
            scope.cancel()
        for task_id, run in list(self.book.running.items()):
            if not run.committed:  # its claim's commit is among what was given up
                self.book.stop(task_id, STOP_LOST, run.claimed.attempt)

    async def _hop(self, free: int, handed: trio.Event) -> None:
        try:
            with self._givable():
                began = time.monotonic()
                read = await self._redis(self.read_and_claim, free, handed, abandon_on_cancel=True)
                if read:
                    await self._settle(*read, began=began)
        finally:
            handed.set()
            self._in_flight.release()

    def stop(self) -> None:
        """Stop reading; a blocked read is woken at once (CLIENT UNBLOCK, in a thread: while
        Redis hangs, the call would block the trio thread for its socket timeout)."""
        self.stopping = True
        self.book.stop_reading()
        if self._reader_id is not None:
            self.background(self._unblock, self._reader_id)
        self.background(self._give_up_after, HOPS_STOP_WAIT_S)

    async def _unblock(self, reader_id: int) -> None:
        client = self.streams.client
        with contextlib.suppress(redis.RedisError):
            # on a Cluster, to the node the read blocks on (an id means nothing on another)
            await self.limiters.redis(
                functools.partial(client.client_unblock, reader_id, **on_node_of(client, self.keys.notify))
            )

    def close(self) -> None:
        self.reader.close()

    async def _redis(self, fn: Callable[..., Any], *args: Any, abandon_on_cancel: bool = False) -> Any:
        """A Redis call in a thread, through outages (Redis away, or refusing writes): back off,
        reconnect, and report once. A group Redis lost is created again, through outages too."""
        regroup = False
        while True:
            try:
                if regroup:
                    await self.limiters.redis(self.ensure_group)
                    regroup = False
                result = await self.limiters.redis(fn, *args, abandon_on_cancel=abandon_on_cancel)
            except RETRYABLE_REDIS_ERRORS as exc:
                self._reader_id = None
                self._last_orphan_check = 0.0  # after an outage: compare XPENDING with what we hold
                await self.redis_outage.backoff(exc)
                if self.stopping:
                    return []
                continue
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("consumer group missing; creating it again")
                regroup = True
                continue
            self.redis_outage.ok()
            return result

    def ensure_group(self) -> None:
        self.streams.ensure_group()

    # -- reads (blocking; in a thread) ----------------------------------------------------
    def read_and_claim(
        self, free: int, handed: trio.Event
    ) -> tuple[list[Entry], ClaimPlan | None, str, BaseException | None] | None:
        """The hot path, in one thread hop: read up to ``free`` new entries; in one transaction
        validate and claim them; start their runners once the claim UPDATE holds the rows, then
        COMMIT, so the next read overlaps this commit. Every write of a run is fenced by its
        claim's attempt: nothing of it lands before that commit (the row locks make it wait),
        nor at all if the commit fails (the run is then stopped as lost).

        On MySQL the transaction is begun before the read, which may block on an idle
        executor: the pool's ping and the BEGIN are then not between a task's arrival and its
        start. The empty transaction holds no lock and no snapshot until its first statement,
        but the server sees it open: a MariaDB ``idle_transaction_timeout`` shorter than the
        read's block (2 s) ends it, and the batch then takes the path below. A first statement
        that finds the connection broken (killed, timed out, the server restarted) brings the
        batch back "unstarted", and the trio side validates it again on a fresh connection, as
        after any validation that failed; a batch that needed no statement (every message
        malformed) does not care that its empty transaction could not commit. While a database
        outage is known, or the collector stops, the hop connects after its read, as before.

        Returns (entries, plan, state, error); state "committed", "unstarted" (validation
        failed: the trio side validates again) or "failed" (the commit failed after the start).
        """
        early = None if self.db_outage.active or self.stopping else _open_early()
        try:
            entries = self.read_new(free)
        except BaseException:
            if early is not None:
                _end_unused(early)
            raise
        if not entries:
            if early is not None:
                _end_unused(early)
            return None
        return self._claim(entries, handed, early)

    def _claim(
        self, entries: list[Entry], handed: trio.Event, early: contextlib.ExitStack | None
    ) -> tuple[list[Entry], ClaimPlan | None, str, BaseException | None]:
        plan, started = None, False
        try:
            with early or _transaction():
                # the rules after the read, which may have blocked: what runs here now
                plan = validate_and_claim(entries, self.rules(), nested=True)
                trio.from_thread.run_sync(self._start, entries, plan, handed)
                started = True
        except OwnTransactionNeeded:  # rolled back: the trio side validates the batch again
            return entries, None, "unstarted", None
        except (*RETRYABLE_DB_ERRORS, *RETRYABLE_REDIS_ERRORS) as exc:
            if started and plan is not None and not plan.read_rows:
                return entries, plan, "committed", None  # nothing was in the transaction
            return entries, plan, "failed" if started else "unstarted", exc
        return entries, plan, "committed", None

    def _start(self, entries: list[Entry], plan: ClaimPlan, handed: trio.Event) -> None:
        """In the trio thread, while the claim commits: hold the entries, start the runners."""
        if self._given_up:  # the stop went on without this hop: nothing starts after it
            log.warning(
                "a claim came back after the stop gave its hop up: rolled back, %d entr%s left pending",
                len(entries),
                "y" if len(entries) == 1 else "ies",
            )
            raise HopGivenUp
        self.book.hold(entries)
        self.book.release(len(entries) - len(plan.claimed))
        self._defer(plan)
        for claimed in plan.claimed:
            self.spawn(claimed, False)
        handed.set()

    async def _settle(
        self,
        entries: list[Entry],
        plan: ClaimPlan | None,
        state: str,
        error: BaseException | None,
        *,
        began: float | None = None,
    ) -> None:
        if state == "unstarted":
            await self.dispatch(entries)
            return
        assert plan is not None and (state == "committed" or error is not None)
        if state == "failed":
            self.db_outage.failed(error)  # type: ignore[arg-type]  # "failed" comes with its error (assert above)
            log.warning("claim commit failed after its runs started; stopping %d run(s)", len(plan.claimed))
            for claimed in plan.claimed:  # each lost run gives its entry up when it ends
                self.book.stop(claimed.task_id, STOP_LOST, claimed.attempt)
            running = {c.entry.key for c in plan.claimed}
            self.book.settle([e.key for e in entries if e.key not in running])
            self._last_orphan_check = 0.0  # the entries are still ours: pick them up again
            return
        self.db_outage.ok(since=began)
        self.book.committed(plan.claimed)
        self._follow_up(plan)

    def read_new(self, free: int) -> list[Entry]:
        """New entries through the fair gate (:mod:`db.gate`), high priority first, never more
        than ``free``; when nothing is admitted, block ≤ 2 s on the wake-up stream, then try once more.
        Nothing once stopping (a stop may come while the early transaction's BEGIN waits)."""
        if self.stopping:
            return []
        if self._reader_id is None:
            self._reader_id = int(self.reader.client_id(**on_node_of(self.reader, self.keys.notify)))
        out = self._dispatch(free)
        if not out and not self.stopping:
            self.reader.xread({self.keys.notify: self._last_wake}, count=1, block=BLOCK_MS_MAX)
            # A sweep or an orphan check may have taken slots while this read waited (an idle
            # executor always waits here): the slots free now, not when the hop began. (One
            # int read from the book, which the trio thread writes: a GIL-atomic read.)
            free = min(free, self.book.free)
            if free > 0 and not self.stopping:
                out = self._dispatch(free)
        self.reads += 1
        return out

    def _dispatch(self, free: int) -> list[Entry]:
        for _ in range(DISPATCH_ROUNDS_MAX):
            got = self.gate.dispatch(
                self.keys.group,
                self.consumer,
                free,
                default_max_running=self.settings.tenant_max_running,
                slot_ms=self.streams.slot_ms,
            )
            self._last_wake = got.last_wake
            if got.limits_missing:  # nothing admitted until some executor copies the limits
                self.on_limits_missing()
            out = _entries(got.reply)
            if out or not got.more:
                return out
        return []

    def read_own(self, stream: str, after: str, count: int = 1) -> list[Entry]:
        """The next own pending entry after ``after`` (``count`` is 1: the takeover reads them one
        at a time), with its delivery count, this read included (one script: nothing between).
        It passes the live-owner check like a new entry: a row running under this name is this
        name's previous life's and is taken over; one running under another live executor was
        claimed through another entry, and this one is a duplicate."""
        found = self._next_own(keys=[stream], args=[self.keys.group, self.consumer, after])
        if not found:
            return []
        eid, deliveries, fields = found
        return [decode_entry(stream, eid, _pairs(fields), deliveries=int(deliveries))]

    def find_orphans(self, limit: int = ORPHAN_SCAN_MAX) -> list[Entry]:
        """Entries pending under this consumer that this process does not hold, no more than
        ``limit`` (the free slots). Each re-read counts as a delivery, and an orphan passes the
        same live-owner check as a new entry (``reclaimed`` False): a task with two live entries
        (its published key lost while an entry lived) can no longer flip between owners."""
        out: list[Entry] = []
        for stream in self.keys.queues:
            if len(out) >= limit:
                break
            pend = self.reader.xpending_range(
                stream, self.keys.group, "-", "+", ORPHAN_SCAN_MAX, consumername=self.consumer
            )
            ids = [p["message_id"] for p in pend if (stream, p["message_id"]) not in self.book.entries]
            ids = ids[: limit - len(out)]
            if not ids:
                continue
            for found in self._own(keys=[stream], args=[self.keys.group, self.consumer, *ids]):
                if found:
                    eid, count, fields = found
                    out.append(decode_entry(stream, eid, _pairs(fields), deliveries=int(count)))
        return out

    # -- take-over, orphans, dispatch --------------------------------------------------------
    async def take_over(self) -> None:
        """Once, at start: own pending entries, high priority first, each one alone.

        They were in flight when this consumer's previous process died, and any of them may
        be what killed it; so each is read (and counted as a delivery) only when nothing else
        runs here, and runs alone: a task that kills its process takes no other task's
        delivery with it, and is dead-lettered after the cap while the others finish."""
        taken = 0
        for stream in self.keys.queues:
            after = "0"
            while not self.stopping:
                await self._idle_or_stopped()
                if self.stopping:
                    break
                entries = await self._redis(self.read_own, stream, after, 1)
                if not entries:
                    break
                after = entries[-1].entry_id
                taken += len(entries)
                await self.dispatch(entries)
        await self._idle_or_stopped()
        if taken:
            log.info(
                "took over %d pending entr%s of this consumer, one at a time",
                taken,
                "y" if taken == 1 else "ies",
            )

    async def _idle_or_stopped(self) -> None:
        """Until nothing runs here, or reading stopped: a drain does not wait for a taken-over
        task (hours, maybe); the grace period and the hand-back apply to it as to any other."""
        while (self.book.reserved > 0 or self.book.running) and self.book.reading:
            await self.book.wait_changed()

    def _orphan_check_due(self) -> bool:
        return time.monotonic() - self._last_orphan_check >= ORPHAN_CHECK_S

    async def recover_orphans(self) -> None:
        self._last_orphan_check = time.monotonic()
        free = self.book.free
        if free <= 0:
            return
        entries = await self._redis(self.find_orphans, free)
        if entries:
            log.warning("found %d entries pending under this consumer that it did not hold", len(entries))
            await self.dispatch(entries)

    async def dispatch(self, entries: list[Entry]) -> None:
        """Validate and claim a batch (one statement each), then ack the rest, start the runners.
        Entries this executor holds already (found twice, by a sweep and an orphan check) are
        left to the run that holds them."""
        entries = [e for e in entries if e.key not in self.book.entries]
        if not entries:
            return
        self.book.hold(entries)
        try:
            plan = await self._validate(entries)
        except BaseException:  # given up by a stop (cancelled): the entries stay pending
            self.book.release(len(entries))
            self.book.settle([e.key for e in entries])
            raise
        if plan is None or self._closed:
            # stopping during a database outage, or a sweep's claim that came back after the
            # read loop ended (the hand-back may be under way): nothing starts; the entries stay
            # pending, and a row claimed here is taken over at the next start, or reclaimed
            if plan is not None:
                log.info(
                    "stopping: %d task(s) claimed after the read loop ended left pending", len(plan.claimed)
                )
            self.book.release(len(entries))
            self.book.settle([e.key for e in entries])
            return
        self.book.release(len(entries) - len(plan.claimed))
        self._defer(plan)
        for claimed in plan.claimed:
            self.spawn(claimed, True)
        self._follow_up(plan)

    def recheck_soon(self) -> None:
        """An orphan check within ``DEFER_RECHECK_S``: an entry left pending here (a deferred
        one, or a lost run's) is validated again, so a row re-queued meanwhile gets its run."""
        soon = time.monotonic() - ORPHAN_CHECK_S + DEFER_RECHECK_S
        self._last_orphan_check = min(self._last_orphan_check, soon)

    def _defer(self, plan: ClaimPlan) -> None:
        """Entries of a task re-queued while a run of it here ends: neither run nor acked now;
        left pending (not held), an orphan check soon picks them up once that run is over."""
        if plan.deferred:
            self.book.settle([e.key for e in plan.deferred])
            self.recheck_soon()

    def _follow_up(self, plan: ClaimPlan) -> None:
        """Once a batch's claim is committed: its log lines, acks and dead letters."""
        for note in plan.notes:
            getattr(log, note.level)(note.text, extra=note.extra)
        if plan.held:
            self.metrics.tasks_stricken(plan.held)
        if plan.acks:
            self.finisher.submit_acks(plan.acks)

    async def _validate(self, entries: list[Entry]) -> ClaimPlan | None:
        while True:
            began = time.monotonic()
            try:
                # abandoned on a cancel (a stop that gave it up): see _give_up_after
                plan = await self.limiters.db_connection(
                    validate_and_claim, entries, self.rules(), abandon_on_cancel=True
                )
            except RETRYABLE_DB_ERRORS as exc:
                await self.db_outage.backoff(exc)
                if self.stopping:
                    return None
                continue
            except RETRYABLE_REDIS_ERRORS as exc:  # the heartbeat look-up inside the claim
                await self.redis_outage.backoff(exc)
                if self.stopping:
                    return None
                continue
            self.db_outage.ok(since=began)
            return plan
