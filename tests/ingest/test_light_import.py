"""`import ingest` (what application services do to enqueue) loads no model or parser library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "sentence_transformers", "transformers", "pypdfium2", "docx", "bs4", "lxml")
MODULES = (
    "ingest",
    "ingest.producer",
    "ingest.control",
    "ingest.status",
    "ingest.ids",
    "ingest.cli",
    "ingest.cli.dataflow",
    "ingest.cli.dead",
    "ingest.cli.memory",
    "ingest.cli.render",
    "ingest.cli.strikes",
    "ingest.cli.wait",
    "ingest.cli.model",
    "ingest.search",
    "ingest.memory",
    "ingest.query_encoder",
    "ingest.api.app",
)


def test_the_producer_side_imports_no_heavy_library():
    code = f"import sys, {', '.join(MODULES)}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
