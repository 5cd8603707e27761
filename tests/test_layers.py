"""The layering and the light import: executor → ingest → db, ingest's interfaces (cli, api) above
its domain, and ``import ingest`` stays cheap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "sentence_transformers", "transformers", "pypdfium2", "docx", "bs4", "lxml")


def test_imports_go_one_way():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_ingest_loads_no_model_or_parser_library():
    code = (
        "import sys, ingest, ingest.producer, ingest.cli;"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
