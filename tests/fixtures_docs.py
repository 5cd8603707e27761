"""Test documents (PDF, DOCX, …) and rows for the parse pipeline's tests.

PDFs and DOCX files are made by ``scripts/make_samples.py`` (a real PDF text layer written by
pypdfium2, a real DOCX written by python-docx). ``add_document`` stores a knowledge base, a
document with its bytes and one task, as the producer would; ``task_context`` builds the
context the executor hands a handler, with a progress callback that records each call (a test
double of the executor's progress writer, not of the database or Redis).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import xxhash

from db.config import Settings
from db.database import init_database, is_mysql, unit
from db.models import Document, KnowledgeBase, Task
from db.streams import Entry
from executor.context import Limiters, TaskContext
from ingest import ids
from ingest.embedding import Embedder, load_embedder
from ingest.storage import location_for, open_storage
from scripts.make_samples import docx_bytes, pdf_bytes

__all__ = ["docx_bytes", "pdf_bytes", "add_document", "task_context", "Progress", "embedder", "onnx_export"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The default model, loaded once per test process (``load_embedder`` caches it)."""
    return load_embedder(Settings().embedding_model)


@pytest.fixture(scope="session")
def onnx_export() -> dict[str, Any]:
    """The model's ONNX export, made once per test session by the real verb (``ingest model
    export --json``, real model, real agreement check) in the session's INGEST_HOME."""
    result = subprocess.run(
        [sys.executable, "-m", "ingest", "model", "export", "--json"],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    made: dict[str, Any] = json.loads(result.stdout)
    if made["state"] == "present":  # an earlier test's `ingest init` made it: its recorded check
        recorded = json.loads((Path(made["export_dir"]) / "export.json").read_text())
        made.update(cosines=recorded["cosines"], min_cosine=recorded["min_cosine"])
    return made


@pytest.fixture(scope="session")
def onnx_int8_export(onnx_export: dict[str, Any]) -> dict[str, Any]:
    """The export's int8 quantization, made once per test session by the real verb (``ingest
    model export --int8 --json``: real quantization, real agreement check against torch)."""
    result = subprocess.run(
        [sys.executable, "-m", "ingest", "model", "export", "--int8", "--json"],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    made: dict[str, Any] = json.loads(result.stdout)
    recorded = json.loads((Path(made["export_dir"]) / "int8.json").read_text())
    made.update(cosines=recorded["cosines"], min_cosine=recorded["min_cosine"], record=recorded)
    return made


def ensure_kb(settings: Settings, name: str = "kb", **fields: Any) -> dict[str, Any]:
    init_database(settings.db_url)
    with unit():
        kb = KnowledgeBase.get_or_none(KnowledgeBase.name == name)
        if kb is None:
            kb = KnowledgeBase.create(id=ids.kb_id("default", name), name=name, **fields)
        return kb.to_dict()


def add_document(
    settings: Settings,
    name: str,
    data: bytes,
    *,
    kb_name: str = "kb",
    from_page: int = 0,
    to_page: int = 100_000_000,
    generation: int = 1,
    doc_parser_config: dict[str, Any] | None = None,
    task_id: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A knowledge base (made once by name), a document with stored bytes, and one task: rows."""
    kb = ensure_kb(settings, kb_name)
    doc_id = ids.doc_id(kb["id"], name)
    content_hash = xxhash.xxh128_hexdigest(data)
    location = location_for(kb["id"], doc_id, content_hash)
    open_storage(settings.storage_url).put(location, data)
    doc_type = name.rsplit(".", 1)[1].lower() if "." in name else ""
    with unit():
        Document.insert(
            id=doc_id,
            kb_id=kb["id"],
            name=name,
            doc_type=doc_type,
            size=len(data),
            content_hash=content_hash,
            location=location,
            parser_config=doc_parser_config or {},
            generation=generation,
        ).on_conflict(
            preserve=[Document.generation, Document.location, Document.parser_config, Document.content_hash],
            conflict_target=None if is_mysql() else [Document.id],  # SQLite needs it, MySQL refuses it
        ).execute()
        task_id = task_id or ids.task_id(doc_id, from_page, to_page, generation)
        Task.insert(
            id=task_id,
            doc_id=doc_id,
            kb_id=kb["id"],
            from_page=from_page,
            to_page=to_page,
            generation=generation,
            status="running",
            attempt=1,
        ).on_conflict_ignore().execute()
        return Task.get_by_id(task_id).to_dict(), Document.get_by_id(doc_id).to_dict(), kb


@dataclass
class Progress:
    """Records ``ctx.report`` calls: ``(fraction, message)``."""

    calls: list[tuple[float | None, str]] = field(default_factory=list)

    def __call__(self, fraction: float | None, msg: str) -> None:
        self.calls.append((fraction, msg))

    @property
    def lines(self) -> list[str]:
        return [m for _, m in self.calls if m]


def task_context(
    settings: Settings,
    rows: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
    limiters: Limiters | None = None,
    progress: Progress | None = None,
) -> TaskContext:
    """The context the executor would build for ``rows`` (task, document, knowledge base)."""
    task, doc, kb = rows
    with unit():  # the knowledge base as it is now (an earlier task may have recorded its model)
        kb = KnowledgeBase.get_by_id(kb["id"]).to_dict()
    return TaskContext(
        task_id=task["id"],
        task_type="parse",
        attempt=task["attempt"],
        consumer="test_0",
        row=task,
        doc=doc,
        kb=kb,
        message={"id": task["id"], "doc_id": doc["id"], "task_type": "parse"},
        entry=Entry(stream=f"{settings.key_prefix}:queue:0", entry_id="0-1", raw=None),
        settings=settings,
        limiters=limiters or Limiters.for_settings(settings),
        progress=progress or Progress(),
    )
