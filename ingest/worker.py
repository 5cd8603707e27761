"""Parsing and chunking in worker processes that a timeout or a cancel can kill.

A parser is third-party code on untrusted bytes: it may loop, hang or crash. Each job runs in a
``trio_parallel`` worker process with ``kill_on_cancel=True``, so when the task's
``trio.fail_after`` fires or its cancel scope is cancelled, the worker is killed at once and the
task ends; a crashed worker (a segfault in a native library) ends the task, not the executor.

Every failure comes back as :class:`~ingest.errors.BadDocument` with the reason. Workers are
spawned processes that import only this module's dependencies (the parser libraries and
``tokenizers``); never torch or sentence-transformers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ingest.chunking import Chunk, ChunkConfig, chunk_document
from ingest.errors import BadDocument, PermanentError
from ingest.parsers import Section, extra_parsers, parse_document

T = TypeVar("T")


@dataclass(frozen=True)
class ParsedDocument:
    """What a parse-and-chunk job returns: how many sections, the chunks, and how long the
    worker spent parsing and chunking (for the task's trace)."""

    sections: int
    chunks: list[Chunk]
    parse_s: float = 0.0
    chunk_s: float = 0.0


def _guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs in the worker: any failure becomes a picklable BadDocument carrying the reason."""
    try:
        return fn(*args, **kwargs)
    except PermanentError:
        raise
    except RecursionError:
        raise BadDocument("the document is nested too deeply to parse") from None
    except MemoryError:
        raise BadDocument("the parser ran out of memory on this document") from None
    except Exception as exc:  # noqa: BLE001 - a parser library's own error, reported as is
        raise BadDocument(f"parser failed: {type(exc).__name__}: {exc}") from None


def _parse_job(
    data: bytes, doc_type: str, from_page: int, to_page: int, extra: dict[str, str]
) -> list[Section]:
    return _guarded(parse_document, data, doc_type, from_page, to_page, extra=extra)


def _chunk_job(sections: list[Section], config: ChunkConfig, model: str) -> list[Chunk]:
    return _guarded(chunk_document, sections, config, model)


def _parse_and_chunk_job(
    data: bytes,
    doc_type: str,
    from_page: int,
    to_page: int,
    config: ChunkConfig,
    model: str,
    extra: dict[str, str],
) -> ParsedDocument:
    began = time.perf_counter()
    sections = _parse_job(data, doc_type, from_page, to_page, extra)
    parsed = time.perf_counter()
    chunks = _chunk_job(sections, config, model)
    return ParsedDocument(len(sections), chunks, parsed - began, time.perf_counter() - parsed)


async def run_in_worker(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a killable worker process; a dead worker is a BadDocument."""
    import trio_parallel

    try:
        return await trio_parallel.run_sync(fn, *args, kill_on_cancel=True)
    except trio_parallel.BrokenWorkerError as exc:
        raise BadDocument(f"the parser process died ({_describe_broken(exc)})") from None


def _describe_broken(exc: BaseException) -> str:
    for arg in getattr(exc, "args", ()):
        code = getattr(arg, "exitcode", None)
        if code is not None:
            return f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
    return str(exc) or type(exc).__name__


async def parse_in_worker(
    data: bytes, doc_type: str, from_page: int = 0, to_page: int = 100_000_000
) -> list[Section]:
    """:func:`ingest.parsers.parse_document` in a killable worker process."""
    return await run_in_worker(_parse_job, data, doc_type, from_page, to_page, extra_parsers())


async def chunk_in_worker(sections: list[Section], config: ChunkConfig, model: str) -> list[Chunk]:
    """:func:`ingest.chunking.chunk_document` in a killable worker process."""
    return await run_in_worker(_chunk_job, sections, config, model)


async def parse_and_chunk_in_worker(
    data: bytes, doc_type: str, from_page: int, to_page: int, config: ChunkConfig, model: str
) -> ParsedDocument:
    """Parse then chunk in one worker job (the bytes cross the process boundary once)."""
    return await run_in_worker(
        _parse_and_chunk_job, data, doc_type, from_page, to_page, config, model, extra_parsers()
    )
