"""Parsers and probes that tests register to run inside parse worker processes.

Importable by name (``tests.ingest.worker_probes:hang``) because worker processes import a
registered parser by its spec; see ``ingest.parsers.register_parser``.
"""

from __future__ import annotations

import os
import signal
import sys

from ingest.parsers import Section


def hang(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Writes its pid to the path in ``data``, then spins forever (never yields, never returns)."""
    with open(data.decode(), "w") as fh:
        fh.write(str(os.getpid()))
    n = 0
    while True:
        n += 1


def crash(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Dies the way a native library's segfault would: killed by a signal, no exception."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def fail(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Raises what a buggy parser library might."""
    raise ZeroDivisionError("the parser divided by zero")


def heavy_modules(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Parses and chunks ``data`` as Markdown, then reports the heavy modules this worker holds."""
    from db.config import Settings
    from ingest.chunking import ChunkConfig, chunk_document
    from ingest.parsers import parse_document

    chunk_document(parse_document(data, "md"), ChunkConfig(), Settings().embedding_model)
    loaded = sorted(
        m for m in ("torch", "sentence_transformers", "transformers", "onnxruntime") if m in sys.modules
    )
    return [Section("loaded: " + ",".join(loaded))]
