"""PDF pages are counted in a child process, never in the submitting one: a PDF the child cannot
open, hangs on or dies on is still enqueued as one task, and its parser reports the real error."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from db.database import unit
from db.models import QUEUED, Task
from ingest.errors import BadDocument
from ingest.parsers import parse_document
from ingest.pdfpages import PageCounter
from ingest.producer import NO_PAGE_LIMIT
from tests.ingest.factories import make_pdf

ROOT = Path(__file__).resolve().parents[2]
CORRUPT = b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF"

SUBMIT = """
import json, sys
from db.config import Settings
from ingest.producer import submit_documents
settings = Settings.from_env({}, db_url=sys.argv[1], redis_url=sys.argv[2], key_prefix=sys.argv[3],
                             pages_per_task=4)
result = submit_documents(settings, sys.argv[4:], "kb1")
print(json.dumps({"documents": [[d.name, d.page_count, d.task_ids] for d in result.documents],
                  "pdfium_loaded": "pypdfium2" in sys.modules}))
"""


def _ranges(task_ids: list[str]) -> list[tuple[int, int, str]]:
    with unit():
        rows = Task.select().where(Task.id.in_(task_ids)).order_by(Task.from_page)
        return [(t.from_page, t.to_page, t.status) for t in rows]


def test_a_corrupt_and_a_valid_pdf_submitted_together(settings, db, tmp_path):
    (tmp_path / "broken.pdf").write_bytes(CORRUPT)
    (tmp_path / "manual.pdf").write_bytes(make_pdf(10))
    result = subprocess.run(
        [sys.executable, "-c", SUBMIT, settings.db_url, settings.redis_url, settings.key_prefix]
        + [str(tmp_path / "broken.pdf"), str(tmp_path / "manual.pdf")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["pdfium_loaded"] is False  # the submitting process never opened a PDF
    (broken, broken_pages, broken_tasks), (manual, manual_pages, manual_tasks) = out["documents"]
    assert (broken, broken_pages, manual, manual_pages) == ("broken.pdf", 0, "manual.pdf", 10)
    assert _ranges(broken_tasks) == [(0, NO_PAGE_LIMIT, QUEUED)]
    assert _ranges(manual_tasks) == [(0, 4, QUEUED), (4, 8, QUEUED), (8, 10, QUEUED)]
    with pytest.raises(BadDocument, match="PDF"):  # what the parse task will fail with
        parse_document(CORRUPT, "pdf", 0, NO_PAGE_LIMIT)


class _Scripted(PageCounter):
    """A counter whose child runs ``script`` instead of pdfium (to hang or die on demand)."""

    def __init__(self, script: str, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.script = script
        self.started = 0

    def argv(self) -> list[str]:
        self.started += 1
        return [sys.executable, "-c", self.script]


# Answers "7" to each document, hangs on one starting b"HANG", dies on one starting b"DIE".
SCRIPTED = """
import os, struct, sys, time
while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    data = sys.stdin.buffer.read(struct.unpack(">Q", head)[0])
    if data.startswith(b"HANG"):
        time.sleep(600)
    if data.startswith(b"DIE"):
        os._exit(3)
    sys.stdout.write("7\\n")
    sys.stdout.flush()
"""


def test_a_hung_child_is_killed_at_the_timeout_and_a_fresh_one_counts_the_next():
    with _Scripted(SCRIPTED, timeout_s=1.0) as counter:
        assert counter.count(b"a") == 7
        began = time.monotonic()
        assert counter.count(b"HANG") is None
        assert time.monotonic() - began < 5
        assert counter.count(b"b" * 300_000) == 7  # larger than a pipe's buffer
        assert counter.count(b"DIE") is None
        assert counter.count(b"c") == 7
    assert counter.started == 3  # one child for all, and one after each failure


def test_counting_stops_after_failures_in_a_row_or_when_the_budget_is_spent():
    with _Scripted(SCRIPTED, timeout_s=0.3, max_failures=2) as counter:
        assert [counter.count(b"DIE"), counter.count(b"HANG"), counter.count(b"a")] == [None, None, None]
    assert counter.started == 2
    with _Scripted(SCRIPTED, timeout_s=0.5, budget_s=0.5) as counter:
        assert counter.count(b"HANG") is None and counter.count(b"a") is None
    assert counter.started == 1


def test_a_child_that_cannot_start_counts_nothing_and_raises_nothing():
    with _Scripted("import sys; sys.exit(1)", timeout_s=2.0) as counter:
        assert counter.count(make_pdf(2)) is None
