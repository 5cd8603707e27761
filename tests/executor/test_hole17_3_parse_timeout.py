"""Issue 17 #3: a per-parse time budget. Every parser, and every dataflow component that runs
in a worker, gets ``parse_timeout_s`` (well under the task timeout): a document that takes
longer fails its task with that reason, and its worker is killed, instead of holding a slot
until the 3 h task timeout."""

from __future__ import annotations

import psutil
import pytest
import trio

from db.models import DONE, FAILED
from ingest.dataflow.catalog import create_dataflow
from ingest.producer import submit_documents
from tests.budget_probes import register_probes
from tests.executor.support import row, running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.helpers import wait_until

BUDGET_S = 2.0
SLOW_FLOW = {
    "components": [
        {"id": "file", "type": "File"},
        {"id": "parse", "type": "Parser", "inputs": ["file"], "params": {"format": "slow"}},
        {"id": "split", "type": "Splitter", "inputs": ["parse"]},
        {"id": "embed", "type": "Embedder", "inputs": ["split"]},
        {"id": "index", "type": "Indexer", "inputs": ["embed"]},
    ]
}


@pytest.fixture(autouse=True)
def probes():
    register_probes()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _ended(*task_ids: str) -> None:
    with trio.fail_after(30):
        while any(row(t)["status"] not in (DONE, FAILED) for t in task_ids):
            await trio.sleep(0.1)


@pytest.mark.usefixtures("embedder")
async def test_a_parser_past_its_time_budget_fails_the_task_with_the_reason(settings, tmp_path):
    s = settings.replace(parse_timeout_s=BUDGET_S, task_timeout_s=600.0)
    pid_file = tmp_path / "slow.pid"
    tasks = submit_documents(
        s, [("endless.slow", str(pid_file).encode()), ("ok.txt", b"Fine.")], "kb"
    ).task_ids
    async with running_daemon(s):
        began = trio.current_time()
        await _ended(*tasks)
        elapsed = trio.current_time() - began
    slow = row(tasks[0])
    assert slow["status"] == FAILED
    assert f"took longer than {BUDGET_S:g} s (parse_timeout_s)" in slow["progress_msg"]
    assert slow["retry_count"] == 0 and row(tasks[1])["status"] == DONE
    assert elapsed < BUDGET_S + 10
    wait_until(lambda: _gone(int(pid_file.read_text())), 5)


@pytest.mark.usefixtures("embedder")
async def test_a_dataflow_component_past_its_time_budget_fails_the_task(settings, tmp_path):
    s = settings.replace(parse_timeout_s=BUDGET_S, task_timeout_s=600.0)
    flow = create_dataflow(s, "slow-flow", SLOW_FLOW)
    pid_file = tmp_path / "flow.pid"
    (task,) = submit_documents(s, [("doc.txt", str(pid_file).encode())], "kb", dataflow_id=flow.id).task_ids
    async with running_daemon(s):
        await _ended(task)
    ended = row(task)
    assert ended["status"] == FAILED
    assert "parse (Parser)" in ended["progress_msg"]
    assert f"took longer than {BUDGET_S:g} s (parse_timeout_s)" in ended["progress_msg"]
    wait_until(lambda: _gone(int(pid_file.read_text())), 5)
