"""``ingest.Client`` against real MariaDB and Redis, with a real executor (in this process) running
the tests' cheap task types: submit (paths and bytes), submit_tasks, status, watch, wait, result,
cancel, retry, and its typed errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from db.models import CANCELLED, DONE, FAILED
from ingest import AsyncClient, Client
from ingest.errors import InvalidInput, LimitExceeded, NotFound, SubmissionTooLarge
from tests.executor.support import running_daemon
from tests.handlers import EXTRA_HANDLERS
from tests.ingest.test_light_import import HEAVY, ROOT


def _fleet_settings(settings):
    return settings.replace(extra_handlers=EXTRA_HANDLERS, shutdown_grace_s=0.3)


def test_import_ingest_client_loads_no_heavy_library():
    code = (
        "import sys, ingest; c = ingest.Client; a = ingest.AsyncClient; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_submit_paths_and_bytes_then_status(settings, tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    client = Client(settings)
    result = client.submit(tmp_path / "a.txt", ("b.md", b"# beta"), kb="Manuals")
    assert sorted(d.name for d in result.documents) == ["a.txt", "b.md"] and result.refused == []
    described = client.status(result.documents[1].id)
    assert described["kind"] == "document" and described["document"]["name"] == "b.md"
    assert [t["id"] for t in described["tasks"]] == result.documents[1].task_ids
    task = client.status(result.documents[1].task_ids[0])
    assert task["kind"] == "task" and task["task"]["status"] == "queued"
    client.close()


def test_typed_errors(settings):
    client = Client(settings.replace(tenant_max_docs=1))
    with pytest.raises(NotFound):
        client.status("no-such-id")
    with pytest.raises(NotFound):
        client.result("no-such-task")
    with pytest.raises(InvalidInput, match="knowledge base name"):
        client.submit(("a.txt", b"x"), kb="   ")
    with pytest.raises(InvalidInput):
        client.submit(("a.txt", b"x"), kb="kb", priority=7)
    with pytest.raises(InvalidInput):
        client.submit(kb="kb")
    with pytest.raises(InvalidInput, match="tenant"):
        client.submit_tasks([{"task_type": "noop", "tenant_id": "other"}])
    with pytest.raises(InvalidInput):
        Client(settings, tenant="bad tenant!")
    with pytest.raises(SubmissionTooLarge) as refused:
        client.submit(("a.txt", b"x"), ("b.txt", b"y"), kb="kb")
    assert isinstance(refused.value, LimitExceeded) and refused.value.maximum == 1
    with pytest.raises(NotFound):
        client.search("no-such-kb", "anything")
    with pytest.raises(InvalidInput):
        client.search("kb", "anything", k=0)
    assert isinstance(InvalidInput("x"), ValueError)  # a caller catching ValueError still does


def test_another_tenants_ids_read_as_not_found(settings):
    mine, theirs = Client(settings, tenant="acme"), Client(settings, tenant="globex")
    doc = mine.submit(("a.txt", b"alpha"), kb="kb").documents[0]
    (task_id,) = mine.submit_tasks([{"task_type": "noop"}])
    for id_ in (doc.id, task_id):
        with pytest.raises(NotFound):
            theirs.status(id_)
        with pytest.raises(NotFound):
            theirs.cancel(id_)
        with pytest.raises(NotFound):
            theirs.retry(id_)
    assert mine.status(task_id)["task"]["tenant_id"] == "acme"


async def test_watch_sees_every_step_then_the_end_and_result(settings):
    client = Client(settings)
    steps = [0.2, 0.4, 0.6, 0.8]
    (task_id,) = client.submit_tasks([{"task_type": "progress", "steps": steps, "pause": 0.6}])
    async with running_daemon(_fleet_settings(settings)):
        events = await trio.to_thread.run_sync(lambda: list(client.watch(task_id, timeout_s=30)))
        result = await trio.to_thread.run_sync(client.result, task_id)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "state" and kinds[-1] == "end" and set(kinds[1:-1]) == {"progress"}
    assert events[-1]["status"] == DONE
    seen = [e["state"]["task"]["progress"] for e in events if e["event"] == "progress"]
    # progress rows are written at most every progress_interval_s (0.2 s); steps 0.6 s apart all show
    assert [p for p in steps if p in seen] == steps
    assert seen == sorted(seen)  # monotonic, as the rows are
    assert result["status"] == DONE and result["kind"] == "success" and result["task_id"] == task_id
    client.close()


async def test_wait_cancel_and_retry(settings):
    client = Client(settings)
    (failing, hanging) = client.submit_tasks([{"task_type": "fail"}, {"task_type": "hang"}])
    async with running_daemon(_fleet_settings(settings)):
        end = await trio.to_thread.run_sync(lambda: client.wait(failing, timeout_s=30))
        assert end["status"] == FAILED
        with pytest.raises(TimeoutError):
            await trio.to_thread.run_sync(lambda: client.wait(hanging, timeout_s=0.5))
        cancelled = await trio.to_thread.run_sync(client.cancel, hanging)
        assert cancelled.task_ids == [hanging]
        end = await trio.to_thread.run_sync(lambda: client.wait(hanging, timeout_s=30))
        assert end["status"] == CANCELLED
        retried = await trio.to_thread.run_sync(client.retry, failing)
        assert retried.task_ids == [failing] and retried.published == 1
        end = await trio.to_thread.run_sync(lambda: client.wait(failing, timeout_s=30))
        assert end["status"] == FAILED and end["state"]["task"]["attempt"] >= 2
    client.close()


async def test_async_client_watch_and_result(settings):
    async with AsyncClient(settings) as client:
        (task_id,) = await client.submit_tasks([{"task_type": "progress", "steps": [0.5], "pause": 0.1}])
        async with running_daemon(_fleet_settings(settings)):
            kinds = [event["event"] async for event in client.watch(task_id, timeout_s=30)]
            result = await client.result(task_id)
    assert kinds[0] == "state" and kinds[-1] == "end"
    assert result["status"] == DONE


def test_a_removed_document_ends_the_watch(settings):
    from ingest.control import remove_document

    client = Client(settings)
    doc = client.submit(("a.txt", b"alpha"), kb="kb").documents[0]
    events = client.watch(doc.id, timeout_s=30, poll_s=0.1)
    assert next(events)["event"] == "state"
    remove_document(settings, doc.id)
    assert next(events) == {"event": "end", "id": doc.id, "status": "removed", "state": None}
    with pytest.raises(StopIteration):
        next(events)
