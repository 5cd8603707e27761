"""Errors named by cause, and how the executor treats each.

    IngestError
    ├── RetryableError   retried in place with backoff and jitter, the slot kept
    │   │                (a lost database or Redis connection, a deadlock, a service timeout)
    │   ├── PublishError rows committed, their messages (or cancel requests) not sent to Redis
    │   └── SubmitBusy   a submit that kept losing lock waits (deadlocks) to concurrent
    │                    submits; nothing of it was kept (no rows, no bytes): submit again
    ├── PermanentError   the task row fails at once with the reason (not a dead letter)
    │   ├── BadDocument  content the parser cannot read (corrupt PDF, random bytes, …)
    │   └── TaskLost     a run's write fenced out: its task is no longer running under it
    │                    (removed, cancelled, taken over); nothing was written
    ├── BadMessage       a stream message outside the contract: dead-lettered with the reason
    ├── SubmitRefused    a file refused at submit (unreadable, empty, too large)
    ├── LimitExceeded    a submit a tenant's limit refuses, before anything is written
    │   ├── TenantQueueFull     more unfinished tasks than ``max_queued``
    │   └── SubmissionTooLarge  more documents in one submission than ``max_docs``
    ├── NotFound         an id or knowledge base that does not exist (also a LookupError)
    └── InvalidInput     an argument outside the contract (also a ValueError): a bad name,
        │                priority, tenant or task field; raised by :class:`ingest.Client`
        └── IdInUse      a task id given that another tenant's task has

``is_retryable`` also recognises the database's and Redis's own connection errors.
"""

from __future__ import annotations

import peewee

from db.database import RETRYABLE_DB_ERRORS
from db.streams import RETRYABLE_REDIS_ERRORS

# MySQL error codes that are worth another try: deadlock, lock wait timeout, server gone/lost,
# too many connections, shutdown in progress, connection killed, idle connection closed.
_RETRYABLE_MYSQL_CODES = frozenset({1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055, 4031})


class IngestError(Exception):
    """Base of the project's own errors."""


class RetryableError(IngestError):
    """A transient failure: try again after a delay."""


class PermanentError(IngestError):
    """A failure that another try cannot fix: fail the task with this reason."""


class BadDocument(PermanentError):
    """The document's content cannot be read by its parser."""


class TaskLost(PermanentError):
    """A run tried to write (its chunks) for a task it no longer holds: the row is gone (its
    document was removed), no longer ``running``, or running under another attempt. Nothing
    was written; the run's terminal write is fenced out the same way."""


class BadMessage(IngestError):
    """A stream message that is not a message of the contract."""


class PublishError(RetryableError):
    """Rows are committed but Redis refused their messages; the rows stay as written.

    ``task_ids`` are the tasks whose message (or cancel request) was not sent; the reconciler
    re-publishes queued rows that have no stream entry.
    """

    def __init__(self, message: str, task_ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.task_ids = list(task_ids or [])
        self.result: object = None  # the caller's result so far (e.g. a SubmitResult), if any


class SubmitBusy(RetryableError):
    """A submit whose transaction kept losing deadlocks or lock waits to concurrent writers,
    through every retry with backoff; it was rolled back and the bytes it had stored that no
    row names were removed. Submitting again is safe."""

    retry_after_s = 1  # what an HTTP front end tells the client (Retry-After)


class SubmitRefused(IngestError):
    """A file the producer would not enqueue; the message names the file and why."""


class LimitExceeded(IngestError):
    """A tenant's limit refused a submission; nothing was written (no row, no bytes, no entry).

    ``limit`` names the limit, ``maximum`` its value, ``count`` what the tenant has (or asked
    for), ``adding`` what this submission would add."""

    retry_after_s = 30  # what an HTTP front end tells the client (Retry-After)

    def __init__(self, limit: str, maximum: int, count: int, tenant_id: str, adding: int = 0) -> None:
        self.limit, self.maximum, self.count, self.tenant_id, self.adding = (
            limit,
            maximum,
            count,
            tenant_id,
            adding,
        )
        self.orphan_locations: list[str] = []  # bytes the refused call had stored (the producer removes them)
        super().__init__(self.describe())

    def describe(self) -> str:
        return f"tenant {self.tenant_id!r}: {self.limit} is {self.maximum}"

    def to_dict(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "limit": self.limit,
            "maximum": self.maximum,
            "count": self.count,
            "adding": self.adding,
            "tenant_id": self.tenant_id,
            "message": str(self),
        }


class TenantQueueFull(LimitExceeded):
    """The tenant has ``count`` unfinished tasks; ``adding`` more would pass ``max_queued``."""

    def describe(self) -> str:
        return (
            f"tenant {self.tenant_id!r} has {self.count} unfinished task(s); {self.adding} more would "
            f"pass its {self.limit} of {self.maximum}"
        )


class SubmissionTooLarge(LimitExceeded):
    """One submission of ``count`` documents, over ``max_docs``."""

    def describe(self) -> str:
        return (
            f"a submission of {self.count} documents is over tenant {self.tenant_id!r}'s "
            f"{self.limit} of {self.maximum}"
        )


class InUse(IngestError):
    """A removal refused because unfinished tasks still need what it would remove (their count
    and ids in the message); nothing was removed."""

    def __init__(self, what: str, task_ids: list[str]) -> None:
        self.task_ids = task_ids
        shown = ", ".join(task_ids[:5]) + (", …" if len(task_ids) > 5 else "")
        super().__init__(
            f"{what} is used by {len(task_ids)} unfinished task(s) ({shown}); "
            "cancel them first, or remove it anyway with --force (they then fail)"
        )


class NotFound(IngestError, LookupError):
    """A task, document or knowledge base that does not exist."""


class InvalidInput(IngestError, ValueError):
    """An argument outside the contract (a bad knowledge-base name, priority, tenant id, task
    field): nothing was written. The domain raises ``ValueError``; :class:`ingest.Client`
    raises this (a ``ValueError`` too, so either catch holds)."""


class IdInUse(InvalidInput):
    """A task id given that another tenant's task already has: nothing was written (leave the
    id out to get a fresh one)."""


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, RetryableError):
        return True
    if isinstance(exc, PermanentError):
        return False
    if isinstance(exc, RETRYABLE_REDIS_ERRORS):
        return True
    if isinstance(exc, peewee.InterfaceError):
        # The connection is closed or broken, e.g. (0, '') from the ROLLBACK that peewee tries
        # after a COMMIT lost its connection: whatever the statement was, it may be tried again.
        return True
    if isinstance(exc, RETRYABLE_DB_ERRORS):
        args = getattr(exc, "args", ())
        code = args[0] if args and isinstance(args[0], int) else None
        orig = getattr(exc, "__cause__", None) or getattr(exc, "__context__", None)
        if code is None and orig is not None and getattr(orig, "args", None):
            first = orig.args[0]
            code = first if isinstance(first, int) else None
        return code is None or code in _RETRYABLE_MYSQL_CODES
    if isinstance(exc, peewee.IntegrityError):
        return False
    return isinstance(exc, (ConnectionError, TimeoutError))
