"""Finish tasks in batches: one transaction of fenced terminal writes, then one ack, then events."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
import trio

from db.database import RETRYABLE_DB_ERRORS, connection, database
from db.models import CANCELLED, DONE, FAILED, QUEUED, RUNNING, TERMINAL_STATES, Chunk, now_ms
from db.results import Announcement, Results, result_record
from db.streams import RETRYABLE_REDIS_ERRORS, AckItem, Streams
from executor import sql
from executor.book import Book, Claimed
from executor.context import Limiters
from executor.metrics import NO_METRICS
from executor.outage import Outage
from executor.progress import append_line
from ingest import vectors
from ingest.documents import lock_documents, recompute_documents
from ingest.errors import is_retryable
from ingest.memory import remove_cancelled_messages

log = logging.getLogger("executor.finisher")

CANCEL, HANDBACK, LOST = "cancel", "handback", "lost"  # outcome kinds besides DONE and FAILED
MAX_BATCH = 500
MAX_ERROR_CHARS = 2000
LINGER_S = 0.002  # after a wake-up, how long to let a batch's other outcomes arrive (fewer commits)


@dataclass
class Outcome:
    """How one run ended, and what its terminal write should say."""

    claimed: Claimed
    kind: str  # DONE | FAILED | CANCEL | HANDBACK | LOST
    progress_msg: str
    duration_s: float
    chunk_ids: list[str] = field(default_factory=list)
    retry_count: int = 0
    error: str = ""
    result: dict[str, Any] | None = None  # a handler's extra result (Task.result)

    @property
    def task_id(self) -> str:
        return self.claimed.task_id


def _update_final(outcomes: list[Outcome]) -> int:
    if not outcomes:
        return 0
    ids = [o.task_id for o in outcomes]
    status = {DONE: DONE, FAILED: FAILED, CANCEL: CANCELLED}
    return sql.update_tasks(
        [
            sql.assign("status", ids, [status[o.kind] for o in outcomes]),
            sql.assign("progress", ids, [1.0 if o.kind == DONE else -1.0 for o in outcomes]),
            sql.assign("progress_msg", ids, [o.progress_msg for o in outcomes]),
            sql.assign("process_duration", ids, [round(o.duration_s, 3) for o in outcomes]),
            sql.assign("chunk_ids", ids, [" ".join(o.chunk_ids) for o in outcomes]),
            sql.assign("retry_count", ids, [o.retry_count for o in outcomes]),
            sql.assign(
                "result", ids, [orjson.dumps(o.result).decode() if o.result else None for o in outcomes]
            ),
            sql.assign("update_time", ids, [now_ms()] * len(ids)),
        ],
        _fence(outcomes),
    )


def _update_handback(outcomes: list[Outcome]) -> int:
    if not outcomes:
        return 0
    ids = [o.task_id for o in outcomes]
    return sql.update_tasks(
        [
            sql.assign("status", ids, [QUEUED] * len(ids)),
            sql.assign("owner", ids, [""] * len(ids)),
            ("handback_count = handback_count + 1", []),
            sql.assign("progress_msg", ids, [o.progress_msg for o in outcomes]),
            sql.assign("update_time", ids, [now_ms()] * len(ids)),
        ],
        _fence(outcomes),
    )


def _fence(outcomes: Sequence[Outcome]) -> tuple[str, list[object]]:
    """``id = ? AND attempt = ? AND status = 'running'`` for a whole batch."""
    return sql.fence([o.task_id for o in outcomes], [o.claimed.attempt for o in outcomes], RUNNING)


def write_outcomes(outcomes: list[Outcome]) -> list[str | None]:
    """The terminal writes of a batch: the status each row now has under this run's attempt
    (QUEUED for a hand-back), or None where this run lost its task. Call on one connection;
    a batch that touches documents (or chunks) is one transaction of its own."""
    live = [o for o in outcomes if o.kind != LOST]
    if not live:
        return [None] * len(outcomes)
    doc_ids = sorted({o.claimed.doc_id for o in live if o.claimed.doc_id})
    if doc_ids or any(o.kind == CANCEL for o in live):
        with database.obj.atomic():
            state = _write(live, doc_ids)
    else:  # one fenced UPDATE: atomic by itself
        state = _write(live, doc_ids)
    # A cancelled run's vectors out of the engine, after the commit that removed its chunk rows
    # (a rolled-back cancel keeps both); an engine that refuses leaves them to ingest reindex.
    vectors.forget_or_log(
        task_ids=[tid for tid, st in state.items() if st == CANCELLED], what="cancelled runs'"
    )
    return [state.get(o.task_id) if o.kind != LOST else None for o in outcomes]


def _write(live: list[Outcome], doc_ids: list[str]) -> dict[str, str | None]:
    lock_documents(doc_ids)
    finals = [o for o in live if o.kind != HANDBACK]
    backs = [o for o in live if o.kind == HANDBACK]
    matched = _update_final(finals) + _update_handback(backs)
    target = {DONE: DONE, FAILED: FAILED, CANCEL: CANCELLED, HANDBACK: QUEUED}
    state: dict[str, str | None] = {o.task_id: target[o.kind] for o in live}
    if matched < len(live):  # a commit retried after a lost connection, or the run lost its task
        rows = sql.task_states(list(state))
        for o in live:
            status, attempt = rows.get(o.task_id, ("", -1))
            mine = attempt == o.claimed.attempt
            keep = mine and (status in TERMINAL_STATES or (o.kind == HANDBACK and status == QUEUED))
            state[o.task_id] = status if keep else None
    cancelled = [tid for tid, st in state.items() if st == CANCELLED]
    if cancelled:  # a cancelled run's chunks go with it
        Chunk.delete().where(Chunk.task_id.in_(cancelled)).execute()
        # and the message a memory run created (not one it overwrote: see the function)
        remove_cancelled_messages(
            [o.claimed.row for o in live if o.claimed.task_type == "memory" and state[o.task_id] == CANCELLED]
        )
    if doc_ids:
        recompute_documents(doc_ids)
    return state


def _retryable(exc: BaseException) -> bool:
    """A terminal write's error worth another try: the database's, or a retryable error of any
    service the write calls (a vector engine away for a moment). The batch then waits for a later
    flush; it is never written failed for it (LIFECYCLE, "Errors")."""
    return isinstance(exc, RETRYABLE_DB_ERRORS) or is_retryable(exc)


class _Retry(Exception):
    """Carries a retryable error out of the one-by-one writes: the whole batch waits."""


def _write_one_by_one(batch: list[Outcome]) -> tuple[list[str | None] | None, BaseException | None]:
    """Each outcome alone; one that fails for good is written as failed with the error.
    A retryable error leaves the whole batch for a later flush (rewriting a row is harmless)."""
    states: list[str | None] = []
    try:
        for o in batch:
            try:
                with connection():
                    states += write_outcomes([o])
            except Exception as exc:
                if _retryable(exc):
                    raise _Retry from exc
                states.append(_write_unwritable(o, exc))
    except _Retry as retry:
        return None, retry.__cause__
    return states, None


def _write_unwritable(o: Outcome, exc: Exception) -> str | None:
    """An outcome the database refused: a run that ended (done or failed) is written as failed
    with the error, a cancel or hand-back as such; no result, text made safe to store. If even
    that is refused the outcome is dropped: nothing acked, the entry is redelivered later."""
    error = _storable(f"could not write the outcome: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
    log.error("%s", error, extra=o.claimed.log_extra(), exc_info=exc)
    kind = FAILED if o.kind in (DONE, FAILED) else o.kind
    safe = Outcome(
        claimed=o.claimed,
        kind=kind,
        progress_msg=append_line(_storable(o.progress_msg), f"failed: {error}" if kind == FAILED else error),
        duration_s=o.duration_s,
        retry_count=o.retry_count,
        error=error,
    )
    try:
        with connection():
            return write_outcomes([safe])[0]
    except Exception as again:
        if _retryable(again):
            raise _Retry from again
        log.exception("could not write the outcome even as failed; left pending", extra=o.claimed.log_extra())
        return None


def _storable(text: str) -> str:
    """``text`` without what UTF-8 cannot encode (lone surrogates become ``?``)."""
    return text.encode("utf-8", "replace").decode("utf-8")


@dataclass
class _Settled:
    outcome: Outcome
    status: str


@dataclass
class _Flushed:
    """What one flush did, reported back to the trio side."""

    states: list[str | None] | None  # per outcome of the batch; None: the database write failed
    acked: bool  # the acks and hand-backs went out
    db_error: BaseException | None = None  # why the write failed: the database's or another service's
    redis_error: BaseException | None = None
    unannounced: list[Announcement] = field(default_factory=list)  # acked; their events still to send


class Finisher:
    """Collects outcomes and plain acks; one loop writes, acks and announces them in batches:
    per flush one thread hop does the terminal transaction, then one ack script call, then
    the events. What the database took but Redis did not is acked on a later flush; events
    that Redis refused after their acks went through (full: a script's first write, the ack,
    is let through, a plain write is not) are sent on a later flush, their entries settled."""

    metrics: Any = NO_METRICS  # the daemon sets its own

    def __init__(
        self,
        streams: Streams,
        consumer: str,
        limiters: Limiters,
        book: Book,
        db_outage: Outage,
        redis_outage: Outage,
        *,
        results_ttl_s: float = 14400.0,
    ) -> None:
        self.streams = streams
        self.results = Results(streams.client, streams.keys)
        self.results_ttl_s = results_ttl_s
        self.consumer = consumer
        self.limiters = limiters
        self.book = book
        self.db_outage = db_outage
        self.redis_outage = redis_outage
        self.services_outage = Outage("a service of the terminal writes")  # e.g. the vector engine
        self._outcomes: list[Outcome] = []  # to write
        self._unwritten: dict[str, int] = {}  # their task ids, with a count (holds)
        self._acks: list[AckItem] = []  # to ack (written, or never needed a write)
        self._settled: list[_Settled] = []  # written: to ack or hand back, then announce
        self._news: list[Announcement] = []  # acked: to announce
        self._busy = False
        self._wake = trio.Event()
        self.dead_lettered = 0
        # called when a run lost its task and left its entry pending here (the collector looks at
        # such entries again soon: the row may want a run, e.g. a retry re-queued it meanwhile)
        self.on_lost: Callable[[], None] = lambda: None

    def submit(self, outcome: Outcome) -> None:
        self._outcomes.append(outcome)
        self._unwritten[outcome.task_id] = self._unwritten.get(outcome.task_id, 0) + 1
        self._wake.set()

    def holds(self, task_id: str) -> bool:
        """Whether an outcome of ``task_id`` waits for its terminal write: its run has left the
        book, and its row is still running under this executor. Any thread (one dict read)."""
        return task_id in self._unwritten

    def submit_acks(self, items: Sequence[AckItem]) -> None:
        self._acks.extend(items)
        self._wake.set()

    @property
    def backlog(self) -> int:
        return len(self._outcomes) + len(self._acks) + len(self._settled) + len(self._news)

    async def drain(self) -> None:
        """Return once everything submitted so far is written and acked."""
        while self.backlog or self._busy:
            await trio.sleep(0.01)

    async def run(self) -> None:
        while True:
            if not self.backlog:
                await self._wake.wait()
                self._wake = trio.Event()
                if len(self._outcomes) < self.book.capacity:
                    await trio.sleep(LINGER_S)
            self._busy = True
            try:
                delay = await self.flush()
            finally:
                self._busy = False
            if delay:
                await trio.sleep(delay)

    async def flush(self) -> float:
        """One batch: write, ack, announce; returns how long to back off (0 when all went)."""
        batch, acks, settled = self._outcomes[:MAX_BATCH], list(self._acks), list(self._settled)
        news = list(self._news)
        # Abandoned on a cancel, which comes only at the end of a stop, after the drain's
        # FINISH_WAIT_S: a stalled database does not hold the process for its read timeout. A
        # batch whose fate is then unknown is as after a SIGKILL: its entries stay pending, a
        # reclaim finds each row finished (acked) or still running under a dead owner (run again).
        began = time.monotonic()
        done = await trio.to_thread.run_sync(
            self._flush, batch, acks, settled, news, limiter=self.limiters.db_limiter, abandon_on_cancel=True
        )
        delay = 0.0
        fresh: list[_Settled] = []
        if done.db_error is not None:  # the batch stays, written on a later flush
            of_db = isinstance(done.db_error, RETRYABLE_DB_ERRORS)
            delay = (self.db_outage if of_db else self.services_outage).failed(done.db_error)
        elif batch and done.states is not None:
            self.db_outage.ok(since=began)
            self.services_outage.ok(since=began)
            del self._outcomes[: len(batch)]
            for o in batch:
                left = self._unwritten.pop(o.task_id, 1) - 1
                if left:
                    self._unwritten[o.task_id] = left
            fresh = self._sort(batch, done.states)
        if done.acked:
            if done.redis_error is None:
                self.redis_outage.ok()
            else:  # acked, but the events were refused: they go on a later flush
                delay = max(delay, self.redis_outage.failed(done.redis_error))
            del self._acks[: len(acks)]
            del self._settled[: len(settled)]
            del self._news[: len(news)]
            self._news.extend(done.unannounced)
            for a in acks:
                if a.dead_reason:
                    self.dead_lettered += 1
                    self.metrics.dead_lettered(_task_type_of(a.raw))
            keys = [(a.stream, a.entry_id) for a in acks] + [
                s.outcome.claimed.entry.key for s in settled + fresh
            ]
            self.book.settle(keys)
        else:
            self._settled.extend(fresh)  # written: acked on a later flush
            if done.redis_error is not None:
                delay = max(delay, self.redis_outage.failed(done.redis_error))
        return delay

    def _sort(self, batch: list[Outcome], states: list[str | None]) -> list[_Settled]:
        fresh = []
        for outcome, status in zip(batch, states, strict=True):
            if outcome.kind == DONE:  # counted once written: a done run may be written as failed
                written = {DONE: DONE, FAILED: FAILED}.get(status or "", LOST)
                self.metrics.task_ended(outcome.claimed.task_type, written, outcome.duration_s)
            if status is None:
                log.info(
                    "run lost its task: nothing written, nothing acked", extra=outcome.claimed.log_extra()
                )
                self.book.settle([outcome.claimed.entry.key])
                self.on_lost()
            else:
                fresh.append(_Settled(outcome, status))
        return fresh

    def _flush(
        self, batch: list[Outcome], acks: list[AckItem], settled: list[_Settled], news: list[Announcement]
    ) -> _Flushed:
        """In one thread: the terminal writes, then the acks and events of everything written
        (and the events of earlier acks that Redis refused to announce)."""
        states: list[str | None] | None = []
        db_error: BaseException | None = None
        if batch:
            try:
                with connection():
                    states = write_outcomes(batch)
            except Exception as exc:
                if _retryable(exc):  # the database, or a service the write calls, is away
                    states, db_error = None, exc
                else:  # one bad outcome (a result that is not JSON) fails them all
                    log.warning(
                        "a batch of %d outcome(s) failed (%s); writing them one at a time", len(batch), exc
                    )
                    states, db_error = _write_one_by_one(batch)
        items = settled + [
            _Settled(o, st) for o, st in zip(batch, states or [], strict=False) if st is not None
        ]
        if not (acks or items or news):
            return _Flushed(states, True, db_error)
        try:
            self._ack(acks, items)
        except RETRYABLE_REDIS_ERRORS as exc:
            return _Flushed(states, False, db_error, exc)
        except redis.RedisError as exc:
            log.error("ack failed, entries left pending for reclaim: %s", exc)
        news = news + [_announcement(s, self.consumer) for s in items]
        news += [Announcement(_buried_event(a, self.consumer), a.outcome) for a in acks if a.outcome]
        try:
            self.results.announce(news, ttl_s=self.results_ttl_s)
        except RETRYABLE_REDIS_ERRORS as exc:
            return _Flushed(states, True, db_error, exc, news)
        except redis.RedisError as exc:
            log.error("events of %d finished task(s) not sent: %s", len(news), exc)
        return _Flushed(states, True, db_error)

    def _ack(self, acks: list[AckItem], settled: list[_Settled]) -> None:
        """One ack script call, then the hand-backs."""
        items = list(acks)
        backs: list[_Settled] = []
        for s in settled:
            entry = s.outcome.claimed.entry
            if s.status == QUEUED:
                backs.append(s)
            else:
                items.append(
                    AckItem(entry.stream, entry.entry_id, s.outcome.task_id, tenant=entry.tenant or "")
                )
        if items:
            self.streams.ack(self.consumer, items)
        for s in backs:
            entry = s.outcome.claimed.entry
            new_id = self.streams.hand_back(
                self.consumer, entry.stream, entry.entry_id, s.outcome.claimed.message, entry.tenant or ""
            )
            extra = {**s.outcome.claimed.log_extra(), "entry": new_id or ""}
            if new_id:
                log.info("handed back: row queued, entry re-published", extra=extra)
            else:
                log.warning("handed back: row queued, but the entry was no longer ours", extra=extra)


def _task_type_of(raw: str) -> str:
    """A dead letter's task type for its counter: the message's, or "unknown" if it has none."""
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "unknown"
    task_type = msg.get("task_type", "parse") if isinstance(msg, dict) else None
    return task_type if isinstance(task_type, str) and 0 < len(task_type) <= 32 else "unknown"


def _announcement(s: _Settled, consumer: str) -> Announcement:
    """A run's event; a terminal one carries the task's result (written once, with its event)."""
    progress = {DONE: 1.0, QUEUED: None}.get(s.status, -1.0)
    claimed = s.outcome.claimed
    event = {
        "task_id": claimed.task_id,
        "doc_id": claimed.doc_id,
        "tenant_id": str(claimed.row.get("tenant_id") or ""),
        "status": s.status,
        "progress": progress,
        "executor": consumer,
    }
    if s.status not in TERMINAL_STATES:
        return Announcement(event)
    error = s.outcome.error or ("cancelled" if s.status == CANCELLED else "")
    result = result_record(
        claimed.row,
        s.status,
        chunk_count=len(s.outcome.chunk_ids),
        error=error[:MAX_ERROR_CHARS],
        finished_at=now_ms(),
    )
    return Announcement(event, result)


def _buried_event(a: AckItem, consumer: str) -> dict[str, object]:
    """The event of a task the claim made ``dead`` (its result rides on the ack item)."""
    outcome = a.outcome or {}
    return {
        "task_id": a.task_id,
        "doc_id": outcome.get("doc_id", ""),
        "tenant_id": outcome.get("tenant_id", ""),
        "status": outcome.get("status", "dead"),
        "progress": -1.0,
        "executor": consumer,
    }
