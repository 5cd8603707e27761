"""Bad input to the memory and dataflow handlers fails the task at once with a clear reason (a
permanent error: no retry, no dead letter) while the executor goes on with other tasks."""

from __future__ import annotations

import pytest
import trio

from db.database import unit
from db.models import Document, Task
from ingest.memory import save_message
from ingest.producer import enqueue_tasks, submit_documents
from tests.executor.support import all_in, running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.helpers import await_until


def memory_task(**fields: object) -> dict[str, object]:
    return {"task_type": "memory", "memory_id": "chat", "source_id": "s1", **fields}


@pytest.mark.usefixtures("embedder")
async def test_bad_memory_and_dataflow_tasks_fail_with_their_reason_and_the_executor_goes_on(settings):
    bad = enqueue_tasks(
        settings,
        [
            memory_task(message_dict={"role": "user"}),
            memory_task(message_dict={"role": "wizard", "content": "abracadabra"}, source_id="s2"),
            memory_task(message_dict="just text", source_id="s3"),
            memory_task(message_dict={"role": "user", "content": "no memory"}, memory_id=""),
        ],
    )
    submitted = submit_documents(settings, [("notes.txt", b"Some notes.")], "kb", dataflow_id="no-such-flow")
    bad += submitted.task_ids
    async with running_daemon(settings) as daemon:
        await await_until(lambda: all_in(bad, "failed"), 60)
        good = await trio.to_thread.run_sync(lambda: save_message(settings, "chat", "user", "Still working?"))
        await await_until(lambda: all_in([good], "done"), 60)
        assert daemon.statistics().failed == len(bad) and daemon.statistics().retried == 0

    with unit():
        rows = {t.id: t for t in Task.select().where(Task.id.in_(bad))}
        document = Document.get_by_id(submitted.documents[0].id)
    reasons = [rows[t].progress_msg.strip().splitlines()[-1] for t in bad]
    assert "failed: PermanentError: message_dict has no content" in reasons[0]
    assert "invalid role 'wizard' in message_dict (one of user, assistant, system, tool)" in reasons[1]
    assert "message_dict must be an object with role and content, not 'just text'" in reasons[2]
    assert "memory_id must be a non-empty string, not ''" in reasons[3]
    assert "unknown dataflow id 'no-such-flow': no such dataflow" in reasons[4]
    assert all(rows[t].progress == -1 and rows[t].status == "failed" for t in bad)
    assert document.run == "failed"
