"""ingest.api sits on the domain: it imports ``ingest`` and ``db`` (never ``executor`` or the
CLI), no domain module imports it (the CLI, an entry point above it, may), and importing the
app loads no model."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "sentence_transformers", "transformers")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_api_imports_neither_the_executor_nor_the_cli():
    for path in (ROOT / "ingest" / "api").glob("*.py"):
        bad = {n for n in _imports(path) if n.split(".")[0] == "executor" or n.startswith("ingest.cli")}
        assert not bad, f"{path.name} imports {bad}"


def test_no_domain_module_imports_the_api():
    for path in (ROOT / "ingest").rglob("*.py"):
        top = path.relative_to(ROOT / "ingest").parts[0]
        if top == "api" or top.startswith("cli"):
            continue
        bad = {n for n in _imports(path) if n.startswith("ingest.api")}
        assert not bad, f"{path} imports {bad}"


def test_importing_the_app_loads_no_model():
    code = f"import sys, ingest.api.app, ingest.api.server; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
