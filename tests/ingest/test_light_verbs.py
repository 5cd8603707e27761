"""The read verbs stay light: `ingest status`, `fleet`, `search` (with the ONNX export present),
`memory search`, `dead list` and `strikes`, each run in a fresh interpreter, import neither torch
nor transformers nor sentence-transformers (the package import itself: test_light_import.py)."""

# ruff: noqa: F811 - fixtures imported from their modules are parameters of the tests
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_docs import embedder, onnx_export  # noqa: F401 - the session's model and export
from tests.ingest.factories import cli_args
from tests.ingest.test_search import index

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "sentence_transformers")
RUN = (
    "import sys; from ingest.cli import main; rc = main(sys.argv[1:]); "
    f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr); sys.exit(rc)"
)
VERBS = {
    "status": ["status"],
    "status --json": ["status", "--json"],
    "fleet": ["fleet"],
    "search": ["search", "--kb", "kb", "when do bees swarm?", "--json"],
    "memory search": ["memory", "search", "--memory", "m1", "anything", "--json"],
    "dead list": ["dead", "list"],
    "strikes": ["strikes"],
}


@pytest.fixture
def indexed(settings, embedder):
    index(settings, embedder, "bees.txt", b"Bees swarm in late spring, when the colony has grown too large.")
    return settings


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_read_verb_imports_no_torch(indexed, onnx_export, verb):
    result = subprocess.run(
        [sys.executable, "-c", RUN, *VERBS[verb], *cli_args(indexed)],
        cwd=ROOT,
        env={**os.environ, "INGEST_QUERY_ENCODER": "onnx"},  # the export or an error, never torch
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == "HEAVY=", result.stderr
    if verb == "search":
        assert json.loads(result.stdout)[0]["content"].startswith("Bees swarm")
