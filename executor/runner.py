"""Run one claimed task: a slot, a timeout, retries in place, a stop scope, then the finisher."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from db.models import DONE, FAILED
from executor.book import STOP_CANCELLED, STOP_HANDBACK, STOP_LOST, Book, Running
from executor.context import ExecutorEnv, TaskContext, TaskResult
from executor.finisher import CANCEL, HANDBACK, LOST, Finisher, Outcome
from executor.metrics import NO_METRICS
from executor.progress import ProgressBook
from executor.router import Router
from executor.tracing import NO_TRACING
from ingest.errors import IngestError, is_retryable

log = logging.getLogger("executor.runner")

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class RetryPolicy:
    """Retryable errors are tried again in place: exponential backoff with jitter, capped.
    Eight tries wait 31 to 62 s in all: a database or Redis restart fits in that."""

    max_tries: int = 8
    base_s: float = 0.5
    cap_s: float = 30.0

    def delay_s(self, retry: int) -> float:
        backoff: float = min(self.cap_s, self.base_s * 2 ** (retry - 1))  # int ** int reads as Any
        return backoff * random.uniform(0.5, 1.0)


@dataclass
class Counters:
    """What this executor did since it started (heartbeat and, later, metrics read these)."""

    started: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    timed_out: int = 0
    cancelled: int = 0
    handed_back: int = 0
    lost: int = 0


def describe(exc: BaseException) -> str:
    """``Type: message`` of the innermost single exception, bounded."""
    exc = unwrap(exc)
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


# MySQL errors that another try cannot fix, even when what surfaces is the lost connection
# that follows them (the server closes the connection after refusing an oversized packet, and
# peewee's ROLLBACK then fails as "server has gone away"): looked for along the whole chain.
PERMANENT_DB_CODES = frozenset({1153})  # ER_NET_PACKET_TOO_LARGE: a row over max_allowed_packet


def retryable(exc: BaseException) -> bool:
    """``ingest.errors.is_retryable``, plus trio's own timeout: a handler's ``fail_after``
    around a call to a service (the task's deadline is a cancel, never this error); never when
    the chain holds an error that another try cannot fix."""
    if _permanent_cause(exc):
        return False
    return isinstance(exc, trio.TooSlowError) or is_retryable(exc)


def _permanent_cause(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 8:
        args = getattr(exc, "args", ())
        if args and isinstance(args[0], int) and args[0] in PERMANENT_DB_CODES:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class Runner:
    """Runs claimed tasks through the router; every outcome goes to the finisher."""

    metrics: Any = NO_METRICS  # the daemon sets its own
    tracing: Any = NO_TRACING

    def __init__(
        self,
        env: ExecutorEnv,
        router: Router,
        book: Book,
        progress: ProgressBook,
        finisher: Finisher,
        policy: RetryPolicy,
        counters: Counters,
    ) -> None:
        self.env = env
        self.router = router
        self.book = book
        self.progress = progress
        self.finisher = finisher
        self.policy = policy
        self.counters = counters
        self.timeout_s = env.settings.task_timeout_s

    async def run(self, run: Running) -> None:
        claimed = run.claimed
        tid = claimed.task_id
        self.progress.open(
            tid, claimed.attempt, claimed.row.get("progress") or 0.0, claimed.row.get("progress_msg") or ""
        )
        try:
            outcome: Outcome | None = None
            with run.scope:
                outcome = await self._run_in_slot(run)
            if outcome is None:  # our own scope was cancelled: a stop request, or the deadline
                outcome = self._stopped(run) if run.stop_reason else self._timed_out(run)
            self.finisher.submit(outcome)
        finally:
            self.progress.close(tid)
            self.book.finish(tid)

    async def _run_in_slot(self, run: Running) -> Outcome | None:
        """The handler under the task limiter and the timeout. The timeout is the deadline of
        the run's own cancel scope (``fail_after`` without a second scope per task): set once
        the slot is ours, so waiting for a slot does not count. None when that scope was
        cancelled, whatever the handler made of it."""
        claimed = run.claimed
        async with self.env.limiters.task_limiter:
            run.scope.deadline = trio.current_time() + self.timeout_s
            self.counters.started += 1
            entry = claimed.entry
            self.metrics.task_started(claimed.task_type, entry.published or entry.entry_id)
            run.since = began = time.monotonic()
            self.progress.report(
                claimed.task_id, None, f"started on {self.env.consumer} (attempt {claimed.attempt})"
            )
            if log.isEnabledFor(logging.INFO):
                log.info("task start", extra=claimed.log_extra())
            try:
                with self.tracing.task(run, self.env.consumer):
                    result = await self._attempts(run)
            except Exception as exc:
                if run.scope.cancel_called:
                    self._raised_when_stopped(run, exc)
                    return None  # run() reads why the scope was cancelled
                return self._failed(run, describe(exc), began, exc)
            except BaseExceptionGroup as group:
                # A handler's own nursery: an error raised beside a cancellation (a child whose
                # clean-up failed). Not an Exception, so it would leave the run's scope and end
                # the daemon: the errors are logged and the cancellation decides, as above.
                cancelled, errors = group.split(trio.Cancelled)
                if cancelled is None or errors is None:
                    raise
                if run.scope.cancel_called:
                    self._raised_when_stopped(run, errors)
                    return None
                log.warning(
                    "task raised while an outer scope cancelled it: %s",
                    describe(errors),
                    extra=claimed.log_extra(),
                )
                raise cancelled from None  # an outer cancellation (a hard stop) goes on
            finally:
                self.metrics.task_left_slot(claimed.task_type)
            if run.stop_reason in (STOP_CANCELLED, STOP_LOST):
                self._returned_when_stopped(run)
                return None
            return self._done(run, result, began)

    async def _attempts(self, run: Running) -> TaskResult | None:
        ctx = self._context(run)
        while True:
            try:
                return await self.router.route(ctx)
            except Exception as exc:
                if (
                    run.scope.cancel_called
                    or not retryable(unwrap(exc))
                    or run.retries + 1 >= self.policy.max_tries
                ):
                    raise  # a stopped run is not tried again (its error is not what ended it)
                run.retries += 1
                self.counters.retried += 1
                self.metrics.task_retried(run.claimed.task_type)
                delay = self.policy.delay_s(run.retries)
                tries = f"{run.retries}/{self.policy.max_tries}"
                line = f"try {tries} failed: {describe(exc)}; retrying in {delay:.2f} s"
                self.progress.report(ctx.task_id, None, line)
                log.warning("task retry: %s", line, extra=run.claimed.log_extra())
                await trio.sleep(delay)

    def _raised_when_stopped(self, run: Running, exc: BaseException) -> None:
        """The run's scope was cancelled (a stop, a cancel, the deadline) and the handler turned
        that into an error of its own (a clean-up that failed): the stop decides the outcome, as
        if the cancellation had come out, so a hand-back is not written as a failure for good."""
        log.warning(
            "task raised while being stopped (%s): %s",
            run.stop_reason or "timed out",
            describe(exc),
            extra=run.claimed.log_extra(),
        )

    def _returned_when_stopped(self, run: Running) -> None:
        """The handler returned after its run was cancelled by the user or lost its task: that
        stop decides, whatever the handler made of it (its row is cancelled, or no longer this
        run's). After a hand-back request or the deadline, a return stands: the handler's last
        step may not be cancellable (the parse handler's chunk store in a thread), and its work
        is done; a handler must not swallow ``trio.Cancelled`` (trio's rule), or what it
        returns is written done."""
        log.info(
            "task returned after being stopped (%s): the stop decides its outcome",
            run.stop_reason,
            extra=run.claimed.log_extra(),
        )

    def _context(self, run: Running) -> TaskContext:
        c = run.claimed
        return TaskContext(
            task_id=c.task_id,
            task_type=c.task_type,
            attempt=c.attempt,
            consumer=self.env.consumer,
            row=c.row,
            doc=c.doc,
            kb=c.kb,
            message=c.message,
            entry=c.entry,
            settings=self.env.settings,
            limiters=self.env.limiters,
            progress=partial(self.progress.report, c.task_id),
            resources=self.env.resources,
        )

    def _done(self, run: Running, result: TaskResult | None, began: float) -> Outcome:
        result = result or TaskResult()
        duration = time.monotonic() - began
        line = result.message or "done"
        self.progress.report(run.claimed.task_id, None, f"{line} ({duration:.2f} s)")
        self.counters.done += 1  # the metrics count it once the finisher has written it
        if log.isEnabledFor(logging.INFO):
            log.info("task end: done", extra={**run.claimed.log_extra(), "duration_s": round(duration, 3)})
        outcome = self._outcome(run, DONE, duration, result.chunk_ids)
        outcome.result = dict(result.extra) or None
        return outcome

    def _failed(self, run: Running, error: str, began: float, exc: BaseException | None = None) -> Outcome:
        duration = time.monotonic() - began
        self.progress.report(run.claimed.task_id, None, f"failed: {error}")
        self.counters.failed += 1
        self.metrics.task_ended(run.claimed.task_type, FAILED, duration)
        # an error of our own kinds says enough; anything else (a bug) comes with its traceback
        bug = exc if exc is not None and not isinstance(unwrap(exc), IngestError) else None
        log.warning(
            "task end: failed: %s",
            error,
            extra={**run.claimed.log_extra(), "duration_s": round(duration, 3)},
            exc_info=bug,
        )
        return self._outcome(run, FAILED, duration, [], error=error)

    def _timed_out(self, run: Running) -> Outcome:
        self.counters.timed_out += 1
        self.metrics.task_timed_out(run.claimed.task_type)
        return self._failed(run, f"timed out after {self.timeout_s:g} s", run.since)

    def _stopped(self, run: Running) -> Outcome:
        duration = time.monotonic() - run.since
        reason = run.stop_reason
        kind = {STOP_CANCELLED: CANCEL, STOP_HANDBACK: HANDBACK}.get(reason, LOST)
        if kind == CANCEL:
            self.counters.cancelled += 1
            self.progress.report(run.claimed.task_id, None, "cancelled")
        elif kind == HANDBACK:
            self.counters.handed_back += 1
        else:
            self.counters.lost += 1
        self.metrics.task_ended(run.claimed.task_type, kind, duration)
        log.info(
            "task end: %s",
            reason or "stopped",
            extra={**run.claimed.log_extra(), "duration_s": round(duration, 3)},
        )
        return self._outcome(run, kind, duration, [])

    def _outcome(
        self, run: Running, kind: str, duration: float, chunk_ids: list[str], error: str = ""
    ) -> Outcome:
        c = run.claimed
        return Outcome(
            claimed=c,
            kind=kind,
            progress_msg=self.progress.text(c.task_id),
            duration_s=duration,
            chunk_ids=list(chunk_ids),
            retry_count=int(c.row.get("retry_count") or 0) + run.retries,
            error=error,
        )
