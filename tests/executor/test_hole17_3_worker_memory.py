"""Issue 17 #3: a parse worker has a memory cap. A document that needs more than
``worker_max_memory_mb`` fails its task at once, permanently ("needs more than N MB to
parse"), never retried and never a crash loop; the worker is not reused and the next task
parses in a fresh one. Shown at a small scale: a 256 MB cap, a parser that asks for 1 GB."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
import trio

from db.models import DONE, FAILED
from ingest.producer import submit_documents
from tests.budget_probes import register_probes
from tests.executor.support import row, running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.helpers import wait_until

CAP_MB = 256


@pytest.fixture(autouse=True)
def probes():
    register_probes()


@pytest.mark.usefixtures("embedder")
async def test_a_document_that_needs_more_than_the_cap_fails_permanently(settings, tmp_path):
    s = dataclasses.replace(settings, worker_max_memory_mb=CAP_MB)
    pid_file = tmp_path / "hog.pid"
    result = submit_documents(
        s, [("big.hog", f"{pid_file}\n1024".encode()), ("fine.txt", b"Small and fine.")], "kb"
    )
    hog_task, fine_task = result.task_ids
    async with running_daemon(s):
        with trio.fail_after(60):
            while row(hog_task)["status"] not in (DONE, FAILED) or row(fine_task)["status"] != DONE:
                await trio.sleep(0.1)
    hog = row(hog_task)
    assert hog["status"] == FAILED, hog["progress_msg"]
    assert f"needs more than {CAP_MB} MB to parse" in hog["progress_msg"]
    assert hog["attempt"] == 1 and hog["retry_count"] == 0
    assert "try 1/" not in hog["progress_msg"]  # never retried in place
    assert row(fine_task)["status"] == DONE
    pid = int(pid_file.read_text())
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10)


async def test_the_cap_holds_in_a_worker_and_the_next_job_gets_a_fresh_one(tmp_path):
    from ingest.errors import BadDocument
    from ingest.worker import WorkerBudget, parse_in_worker

    budget = WorkerBudget(max_memory_mb=CAP_MB)
    with pytest.raises(BadDocument, match=f"needs more than {CAP_MB} MB to parse"):
        await parse_in_worker(f"{tmp_path / 'a'}\n1024".encode(), "hog", budget=budget)
    first = int((tmp_path / "a").read_text())
    sections = await parse_in_worker(f"{tmp_path / 'b'}\n64".encode(), "hog", budget=budget)
    assert [s.text for s in sections] == ["held 64 MB"]  # under the cap: fine
    assert int((tmp_path / "b").read_text()) != first  # a worker that hit its cap is retired
