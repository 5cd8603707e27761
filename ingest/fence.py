"""The fence every write of a run passes (``LIFECYCLE.md``, "Fencing"): inside the write's own
transaction the task's row is locked first, by primary key, and must be ``running`` under the
run's attempt. A cancel, an ``rm`` or a take-over locks the same row: either it waits for the
write (and then removes what it wrote), or the write sees what it did and writes nothing."""

from __future__ import annotations

from db.database import lock_for_update
from db.models import RUNNING, Task
from ingest.errors import TaskLost


def fence(task_id: str, attempt: int | None, unwritten: str) -> None:
    """Lock ``task_id``'s row; :class:`TaskLost` (saying ``unwritten``, e.g. "chunks not
    written") unless it is running under ``attempt`` (any attempt when None)."""
    row = lock_for_update(Task.select(Task.status, Task.attempt).where(Task.id == task_id)).tuples().first()
    if row is None:
        raise TaskLost(f"task {task_id} no longer exists: {unwritten}")
    status, current = row
    if status != RUNNING or (attempt is not None and int(current) != int(attempt)):
        mine = "" if attempt is None else f" under attempt {attempt}"
        raise TaskLost(f"task {task_id} is {status} (attempt {current}), not running{mine}: {unwritten}")
