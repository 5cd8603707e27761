"""Parsing runs in killable worker processes: a hanging parser is stopped by the task timeout,
a crashing or failing one becomes a BadDocument, and workers never load torch."""

from __future__ import annotations

import time

import psutil
import pytest
import trio

from ingest.chunking import ChunkConfig
from ingest.errors import BadDocument
from ingest.parsers import register_parser, unregister_parser
from ingest.worker import parse_and_chunk_in_worker, parse_in_worker
from tests.helpers import wait_until

PROBES = {
    "hang": "tests.ingest.worker_probes:hang",
    "crash": "tests.ingest.worker_probes:crash",
    "fail": "tests.ingest.worker_probes:fail",
    "probe": "tests.ingest.worker_probes:heavy_modules",
}


@pytest.fixture(autouse=True)
def probes():
    for doc_type, spec in PROBES.items():
        register_parser(doc_type, spec)
    yield
    for doc_type in PROBES:
        unregister_parser(doc_type)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_hanging_parser_is_stopped_by_fail_after_and_its_worker_killed(tmp_path):
    pid_file = tmp_path / "worker.pid"
    started = time.monotonic()
    with pytest.raises(trio.TooSlowError), trio.fail_after(6):
        await parse_in_worker(str(pid_file).encode(), "hang")
    assert time.monotonic() - started < 8
    pid = int(pid_file.read_text())  # the parser really ran in another process …
    wait_until(lambda: _gone(pid), timeout_s=5)  # … and that process is gone


async def test_the_next_job_after_a_kill_gets_a_fresh_worker(tmp_path):
    with trio.move_on_after(4):
        await parse_in_worker(str(tmp_path / "pid").encode(), "hang")
    sections = await parse_in_worker(b"still working", "txt")
    assert [s.text for s in sections] == ["still working"]


async def test_a_crashing_parser_is_a_bad_document_not_a_crash():
    with pytest.raises(BadDocument, match=r"parser process died \(killed by signal 9\)"):
        await parse_in_worker(b"x", "crash")


async def test_a_parser_exception_comes_back_as_a_bad_document_with_its_reason():
    with pytest.raises(BadDocument, match="parser failed: ZeroDivisionError: the parser divided by zero"):
        await parse_in_worker(b"x", "fail")


async def test_content_errors_keep_their_message_across_the_process_boundary():
    with pytest.raises(BadDocument, match="not a PDF: the %PDF- header is missing"):
        await parse_and_chunk_in_worker(b"GIF89a....", "pdf", 0, 12, ChunkConfig(), "unused")


async def test_workers_never_import_torch_sentence_transformers_or_onnxruntime():
    sections = await parse_in_worker(b"# Title\n\nSome text to chunk.", "probe")
    assert [s.text for s in sections] == ["loaded: "]


async def test_parse_workers_run_at_the_budgets_niceness_so_the_encoder_keeps_its_cores():
    import os

    from ingest.worker import WorkerBudget, run_in_worker

    base = os.nice(0)
    assert await run_in_worker(os.nice, 0, budget=WorkerBudget(nice=7)) == min(19, base + 7)
    assert await run_in_worker(os.nice, 0, budget=WorkerBudget(nice=0)) == base
    assert os.nice(0) == base  # the executor itself is never lowered


async def test_waiting_for_a_free_worker_does_not_count_against_the_parse_timeout():
    """More parses than workers (5 tasks a 2-core host by default): one that waited behind
    others is given its whole time budget once it has a worker, not failed for good by time
    it spent waiting."""
    import trio_parallel

    from ingest.worker import KILL_GRACE_S, WorkerBudget, run_in_worker

    limiter = trio_parallel.current_default_worker_limiter()
    total, limiter.total_tokens = limiter.total_tokens, 1
    budget = WorkerBudget(timeout_s=1.0, max_memory_mb=0)
    jobs = int((budget.timeout_s + KILL_GRACE_S) / 0.9) + 2  # the last waits past the old limit
    done: list[float] = []
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(jobs):
                nursery.start_soon(lambda: _sleep_in_worker(run_in_worker, budget, done))
    finally:
        limiter.total_tokens = total
    assert len(done) == jobs


async def _sleep_in_worker(run_in_worker, budget, done) -> None:
    await run_in_worker(time.sleep, 0.9, budget=budget)
    done.append(trio.current_time())
