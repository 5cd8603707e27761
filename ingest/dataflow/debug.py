"""``ingest dataflow run``: a debug run of a dataflow on one file, through the queue and the fleet.

The file's bytes are stored (under ``debug/{task}/…``, where every executor can read them) and a
``dataflow`` task is enqueued like any other, flagged ``debug`` in its payload and naming no
knowledge base and no document row. The handler runs every component but the Indexer writes
nothing; it returns each component's output, truncated, which the executor keeps in the task's
``result``. This waits for the task (reading its row) and then removes the stored bytes; when the wait times
out or is interrupted it cancels the task first, so no stored bytes are left behind either way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from db.config import Settings
from ingest import ids
from ingest.dataflow.catalog import get_dataflow, graph_of
from ingest.errors import SubmitRefused
from ingest.sources import Refusal, Source, read_sources
from ingest.storage import open_storage
from ingest.task_wait import last_line, wait_for_task

DEBUG_LOCATION = "debug"


@dataclass(frozen=True)
class DebugRun:
    task_id: str
    dataflow_id: str
    status: str  # the task's status when the wait ended
    ended: bool
    message: str  # the last line of the task's progress
    outputs: dict[str, Any] = field(default_factory=dict)  # component id → its output, truncated

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _give_up(settings: Settings, task_id: str, final: dict[str, Any] | None) -> dict[str, Any]:
    """Cancel a debug task the caller stopped waiting for (rows first: a run still going stops
    within 2 s, one not started never reads the bytes); its row as it is after."""
    from ingest.control import cancel
    from ingest.errors import NotFound
    from ingest.task_wait import read_task

    try:
        cancel(settings, task_id)
    except NotFound:
        return final or {}
    return read_task(task_id) or final or {}


def debug_location(task_id: str, content_hash: str) -> str:
    return f"{DEBUG_LOCATION}/{task_id}/{content_hash}"


def debug_task(
    dataflow_id: str, tenant_id: str, name: str, location: str, size: int, priority: int = 1
) -> dict[str, Any]:
    """The task of a debug run (for :func:`ingest.producer.enqueue_tasks`)."""
    doc_type = os.path.splitext(name)[1].lower().lstrip(".")[:16]
    return {
        "task_type": "dataflow",
        "tenant_id": tenant_id,
        "priority": priority,
        "dataflow_id": dataflow_id,
        "debug": True,
        "document": {"name": name, "doc_type": doc_type, "location": location, "size": size},
    }


def run_debug(
    settings: Settings,
    name: str,
    source: Source,
    *,
    tenant_id: str = "default",
    timeout_s: float | None = None,
    on_queued: Callable[[str], None] | None = None,
) -> DebugRun:
    """Run dataflow ``name`` on ``source`` (a path or a ``(name, bytes)`` pair) without indexing
    anything; wait up to ``timeout_s`` for the fleet (``on_queued`` is told the task id first).
    Debug runs go at high priority."""
    from ingest.producer import enqueue_tasks

    row = get_dataflow(settings, name, tenant_id=tenant_id)
    graph_of(row)  # still valid?
    (item,) = list(read_sources([source], settings.max_doc_bytes))
    if isinstance(item, Refusal):
        raise SubmitRefused(f"refused {item.origin}: {item.reason}")
    task_id = ids.new_id()
    location = debug_location(task_id, ids.content_hash(item.data))
    storage = open_storage(settings.storage_url)
    storage.put(location, item.data)
    task = {"id": task_id, **debug_task(row["id"], tenant_id, item.name, location, len(item.data))}
    ended = False
    try:
        enqueue_tasks(settings, [task])
        if on_queued is not None:
            on_queued(task_id)
        final, ended = wait_for_task(settings, task_id, timeout_s=timeout_s)
        if not ended:  # nobody waits for it any more: stop it, so its bytes may go
            final = _give_up(settings, task_id, final)
    except BaseException:  # interrupted (or the enqueue failed): stop the task, remove the bytes
        with contextlib.suppress(Exception):
            _give_up(settings, task_id, None)
        raise
    finally:
        with contextlib.suppress(Exception):  # best effort: the task is over or cancelled
            storage.delete(location)
    result = final.get("result") or {}
    return DebugRun(
        task_id=task_id,
        dataflow_id=row["id"],
        status=final["status"],
        ended=ended,
        message=last_line(final.get("progress_msg") or ""),
        outputs=dict(result.get("outputs") or {}),
    )
