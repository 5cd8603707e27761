"""A memory run's write is fenced like a parse run's: a run whose task was cancelled or taken
over stores nothing, and a cancel that lands after the message was stored takes with it the
message the run created, never one an earlier save of the same source id stored."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from db.database import connection, unit
from db.models import CANCELLED, QUEUED, RUNNING, MemoryMessage, Task, now_ms
from db.streams import Entry
from executor.book import Claimed
from executor.context import Limiters, TaskContext
from executor.finisher import CANCEL, DONE, Outcome, write_outcomes
from executor.handlers.memory import memory_task
from ingest import ids
from ingest.embedding import EmbeddingService
from ingest.errors import TaskLost
from ingest.memory import check_message, save_message
from ingest.memory import memory_task as memory_task_fields
from tests.fixtures_docs import Progress, embedder  # noqa: F401 - the session's one model


def enqueue(content: str, source_id: str = "s1") -> str:
    """A queued memory task (as ``save_message`` writes it); a second save re-queues the same id."""
    item = check_message(
        {"memory_id": "m", "source_id": source_id, "message_dict": {"role": "user", "content": content}}
    )
    fields = memory_task_fields(item)
    payload = {k: fields[k] for k in ("memory_id", "source_id", "message_dict")}
    with unit():
        Task.insert(id=fields["id"], task_type="memory", status=QUEUED, payload=payload).on_conflict(
            preserve=[Task.status, Task.payload]
        ).execute()
    return str(fields["id"])


def claim(task_id: str) -> dict[str, Any]:
    """What a claim writes (attempt + 1, ``begin_at``); the row the run reads."""
    with unit():
        Task.update(status=RUNNING, owner="t_0", attempt=Task.attempt + 1, begin_at=now_ms()).where(
            Task.id == task_id
        ).execute()
        return Task.get_by_id(task_id).to_dict()


def cancel(task_id: str) -> None:
    """The user's cancel: the row first (``ingest.control.cancel``)."""
    with unit():
        Task.update(status=CANCELLED, progress=-1.0).where(Task.id == task_id).execute()


def context(settings, row: dict[str, Any], attempt: int | None = None) -> TaskContext:
    return TaskContext(
        task_id=row["id"],
        task_type="memory",
        attempt=row["attempt"] if attempt is None else attempt,
        consumer="t_0",
        row=row,
        doc=None,
        kb=None,
        message={},
        entry=Entry(stream=f"{settings.key_prefix}:queue:0", entry_id="0-1", raw=None),
        settings=settings,
        limiters=Limiters.for_settings(settings),
        progress=Progress(),
    )


async def run(settings, row: dict[str, Any], attempt: int | None = None) -> None:
    service = EmbeddingService(settings.embedding_model, 32, trio.CapacityLimiter(1))
    await memory_task(context(settings, row, attempt), service)


def finish(row: dict[str, Any], kind: str) -> list[str | None]:
    claimed = Claimed(Entry("x", "0-1", None), {}, "memory", row, None, None, int(row["attempt"]))
    with connection():
        return write_outcomes([Outcome(claimed=claimed, kind=kind, progress_msg="", duration_s=0.1)])


def messages() -> list[str]:
    with unit():
        return [m.content for m in MemoryMessage.select().where(MemoryMessage.memory_id == "m")]


@pytest.mark.usefixtures("embedder", "db")
async def test_a_run_whose_task_was_cancelled_stores_nothing(settings):
    row = claim(enqueue("hello there"))
    cancel(row["id"])
    with pytest.raises(TaskLost, match="cancelled"):
        await run(settings, row)
    assert messages() == []
    assert finish(row, CANCEL) == [CANCELLED]


@pytest.mark.usefixtures("embedder", "db")
async def test_a_run_whose_task_was_taken_over_stores_nothing(settings):
    row = claim(enqueue("hello there"))
    newer = claim(row["id"])  # another executor reclaimed it: attempt 2
    with pytest.raises(TaskLost, match="not running under attempt 1"):
        await run(settings, row)
    assert messages() == []
    await run(settings, newer)
    assert messages() == ["hello there"]


@pytest.mark.usefixtures("embedder", "db")
@pytest.mark.parametrize("kind", [CANCEL, DONE])  # stopped by the cancel, or finished just after it
async def test_a_cancel_after_the_commit_removes_the_message_the_run_created(settings, kind):
    row = claim(enqueue("hello there"))
    await run(settings, row)
    assert messages() == ["hello there"]
    cancel(row["id"])
    assert finish(row, kind) == [CANCELLED]
    assert messages() == []


@pytest.mark.usefixtures("embedder", "db")
async def test_a_cancelled_resave_keeps_the_message_an_earlier_save_stored(settings):
    first = claim(enqueue("first words"))
    await run(settings, first)
    assert finish(first, DONE) == [DONE]
    await trio.sleep(0.01)  # the next claim comes later than this store, as it must in real life
    again = claim(enqueue("second words"))  # the same source id: the same task id, attempt 2
    assert (again["id"], again["attempt"]) == (first["id"], 2)
    await run(settings, again)
    cancel(again["id"])
    assert finish(again, CANCEL) == [CANCELLED]
    # the message stays (the first save stored it); with the content the cancelled run wrote
    assert messages() == ["second words"]
    with unit():
        assert MemoryMessage.get_by_id(ids.memory_message_id("m", "s1")).task_id == first["id"]


@pytest.mark.usefixtures("embedder", "db")
async def test_a_cancelled_run_leaves_other_messages_of_the_memory_alone(settings):
    other = claim(enqueue("kept words", source_id="s0"))
    await run(settings, other)
    assert finish(other, DONE) == [DONE]
    row = claim(enqueue("hello there"))
    await run(settings, row)
    cancel(row["id"])
    assert finish(row, CANCEL) == [CANCELLED]
    assert messages() == ["kept words"]


@pytest.mark.parametrize("position", [2**63, -(2**63) - 1])
def test_a_position_past_the_column_s_range_is_refused_at_the_save(settings, position):
    """It would overflow the BIGINT column on the executor, after the task was queued."""
    with pytest.raises(ValueError, match="out of range"):
        save_message(settings, "m1", "user", "hello", source_id="s1", position=position)
    assert (
        check_message(
            {
                "memory_id": "m1",
                "source_id": "s1",
                "message_dict": {"role": "user", "content": "x", "position": 2**63 - 1},
            }
        ).position
        == 2**63 - 1
    )
