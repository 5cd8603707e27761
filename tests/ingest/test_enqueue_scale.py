"""Enqueuing 10,000 tasks in one call is a normal case: batched rows, pipelined publish."""

from __future__ import annotations

import time

from db.database import unit
from db.models import QUEUED, Task
from ingest.producer import enqueue_tasks, submit_documents
from tests.helpers import waiting
from tests.ingest.factories import make_pdf

N = 10_000


def test_ten_thousand_tasks_in_one_enqueue_call(settings, rclient, keys):
    start = time.perf_counter()
    task_ids = enqueue_tasks(settings, [{"task_type": "noop", "priority": i % 2} for i in range(N)])
    elapsed = time.perf_counter() - start
    print(f"\nenqueue_tasks: {N} tasks in {elapsed:.2f} s ({N / elapsed:.0f} tasks/s)")
    assert len(set(task_ids)) == N
    with unit():
        assert Task.select().where(Task.status == QUEUED).count() == N
    assert waiting(rclient, keys) == N
    assert rclient.xlen(keys.backlog(1, "default")) == N // 2


def test_ten_thousand_page_ranges_in_one_submit_call(settings, rclient, keys):
    data = make_pdf(N)
    start = time.perf_counter()
    s = settings.replace(pages_per_task=1, max_pages=N)  # over the default cap of 5000 pages
    result = submit_documents(s, [("big.pdf", data)], "kb1")
    elapsed = time.perf_counter() - start
    print(f"\nsubmit_documents: {N} tasks in {elapsed:.2f} s ({N / elapsed:.0f} tasks/s)")
    assert len(result.task_ids) == N and result.published == N
    with unit():
        assert Task.select().where(Task.status == QUEUED).count() == N
    assert rclient.xlen(keys.backlog(0, "default")) == N
