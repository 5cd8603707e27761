"""Embedding: the model loaded once per process, and one batching service per executor.

:func:`load_embedder` loads the SentenceTransformer named by ``INGEST_EMBEDDING_MODEL`` once
per process (offline, on the CPU, torch using every core this process may run on) and reads
its dimension once. Vectors are float32 and normalised, so a dot product is the cosine.

:class:`EmbeddingService` is shared by all tasks of an executor: each task submits its texts
with :meth:`~EmbeddingService.embed`; one consumer loop takes pending texts of the waiting
tasks (those with the fewest left first) and encodes them in a thread under the
``embed_limiter``, in forward batches of at most ``INGEST_EMBEDDING_BATCH`` texts and
``INGEST_EMBEDDING_BATCH_TOKENS`` tokens (:mod:`ingest.batches`), so chunks of tasks running
at the same time share batches instead of being encoded one task at a time; vectors are routed
back to their tasks. Each call takes a
window of up to :data:`WINDOW_BATCHES` times ``INGEST_EMBEDDING_BATCH`` texts (more forward
batches where the token cap cuts the widest), which :class:`Embedder` sorts by tokens before
batching: measured on the bench corpus (8,344 chunks), with a window of four batches sorted by
tokens the model computes 2.8 % fewer tokens (real ones and padding) than with one sort of all
of them by characters (what ``SentenceTransformer.encode`` does), with a window of sixteen 4.4 %
fewer, at four times the wait for a task that arrives during a call.

sentence-transformers (and torch) are imported only when a model is loaded: ``import ingest``
and parse worker processes never pay for them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import outcome
import trio

from ingest.batches import forward_batches
from ingest.errors import PermanentError
from ingest.ids import model_identity  # here since it moved to ingest.ids (kept for importers)

log = logging.getLogger(__name__)
T = TypeVar("T")
WINDOW_BATCHES = 4
STARVE_AFTER_S = 2.0  # a request not served this long goes first (one batch of its texts a window)


def cpu_threads() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class Embedder:
    """A loaded SentenceTransformer: ``encode`` → normalised float32 rows of ``dim`` columns.

    A call's texts are tokenized once, sorted by their number of tokens and run through the
    model in forward batches of ``batch_size`` texts and at most ``max_tokens`` tokens, each only
    as wide as its longest text (:meth:`_encode_token_sorted`). ``SentenceTransformer.encode``
    sorts by characters instead, a poor guess of tokens for the same chunk size: on
    ``bench/ingest.py``'s 8,344 chunks in windows of 128 texts, sorting by tokens makes the model
    compute 3.2 % fewer tokens (real ones and padding) than sorting by characters, and 2.8 %
    fewer than one character sort of all of them at once (3.4 % with the token cap: ``python -m
    bench.padding``). A model without that interface (a stand-in, a prompt it adds itself, left
    padding, not on the CPU) gets ``encode`` as it is, with no token cap.
    """

    def __init__(self, model: str, st_model: Any) -> None:
        self.model = model
        self.identity = model_identity(model)
        self._st = st_model
        get_dim = (
            getattr(st_model, "get_embedding_dimension", None) or st_model.get_sentence_embedding_dimension
        )
        self.dim = int(get_dim())
        self.max_seq_length = int(getattr(st_model, "max_seq_length", 0) or 0)
        self._features = _features_of(st_model)

    def encode(self, texts: Sequence[str], batch_size: int = 32, *, max_tokens: int = 0) -> np.ndarray:
        """Normalised float32 rows of ``texts``, in forward batches of at most ``batch_size``
        texts and, where the model can be batched by us, at most ``max_tokens`` tokens (its
        texts times its longest text's: :func:`ingest.batches.forward_batches`; 0 for no cap)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._features is not None:
            return self._encode_token_sorted(list(texts), max(1, batch_size), max_tokens, self._features)
        vectors = self._st.encode(
            list(texts),
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _encode_token_sorted(
        self,
        texts: list[str],
        batch_size: int,
        max_tokens: int,
        features_of: Callable[[list[str]], dict[str, Any]],
    ) -> np.ndarray:
        import torch

        features = features_of(texts)  # one tokenization, right-padded to the longest text
        count, seq = len(texts), int(features["attention_mask"].shape[1])
        lengths = [int(n) for n in features["attention_mask"].sum(dim=1).tolist()]
        out = np.empty((count, self.dim), dtype=np.float32)
        self._st.eval()  # as encode does on every call
        with torch.inference_mode():
            for indices in forward_batches(lengths, batch_size, max_tokens):
                rows = torch.tensor(indices)
                width = lengths[indices[0]]
                batch = {name: _rows(value, rows, width, count, seq) for name, value in features.items()}
                vectors = self._st(batch)["sentence_embedding"]
                vectors = torch.nn.functional.normalize(vectors.float(), p=2, dim=1)
                out[indices] = vectors.numpy()
        return out


PROBE = ["a probe", "a longer probe of several more word pieces"]  # two lengths: the padding shows


def _features_of(st_model: Any) -> Callable[[list[str]], dict[str, Any]] | None:
    """The model's tokenizer-to-features function, where texts can be sorted by their tokens and
    batched by us: a SentenceTransformer on the CPU (``preprocess`` from 6.0, ``tokenize``
    before) with no prompt of its own and no ``truncate_dim``, whose features for two texts of
    different lengths have an attention mask padded on the right and nothing else per text but
    tensors (a list per text, as some multimodal models give, could not be cut into batches)."""
    if not type(st_model).__module__.startswith("sentence_transformers"):
        return None
    features_of = getattr(st_model, "preprocess", None) or getattr(st_model, "tokenize", None)
    if (
        not callable(features_of)
        or getattr(st_model, "default_prompt_name", None)
        or getattr(st_model, "truncate_dim", None)
        or str(getattr(st_model, "device", "cpu")) != "cpu"
    ):
        return None
    try:
        probe = features_of(list(PROBE))
        mask = probe["attention_mask"]
        short, long_ = sorted(int(n) for n in mask.sum(dim=1))
        right_padded = (
            mask.ndim == 2 and short < long_ and bool(mask[:, 0].all()) and bool((mask[:, :short] == 1).all())
        )
        per_text_lists = any(
            isinstance(value, list | tuple) and len(value) == len(PROBE) for value in probe.values()
        )
    except Exception:  # noqa: BLE001 - any surprise: leave batching to the model's own encode
        return None
    return features_of if right_padded and not per_text_lists else None


def _rows(value: Any, rows: Any, width: int, count: int, seq: int) -> Any:
    """One forward batch's part of a call's features: its rows, and where the second axis is the
    sequence (``seq`` wide, as the attention mask), cut to its longest text's ``width``."""
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) == 0 or shape[0] != count:
        return value  # not per text (a modality name, a scalar)
    return value[rows, :width] if len(shape) >= 2 and shape[1] == seq else value[rows]


_embedders: dict[str, Embedder] = {}
_load_lock = threading.Lock()


def load_embedder(model: str) -> Embedder:
    """The process's one :class:`Embedder` for ``model`` (loaded on first use; blocking)."""
    with _load_lock:
        embedder = _embedders.get(model)
        if embedder is None:
            embedder = _embedders[model] = Embedder(model, _load_sentence_transformer(model))
        return embedder


def _load_sentence_transformer(model: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download at run time
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(cpu_threads())
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - a dependency of sentence-transformers
        pass
    try:
        st_model = SentenceTransformer(model, device="cpu")
    except Exception as exc:  # noqa: BLE001 - any loader failure means this model cannot be used
        raise PermanentError(f"cannot load embedding model {model!r}: {type(exc).__name__}: {exc}") from None
    st_model.eval()
    return st_model


@dataclass(frozen=True)
class EmbeddingStatistics:
    """What the service has done: encode calls, texts, and calls shared by several tasks."""

    encode_calls: int  # thread hops, each a window of up to WINDOW_BATCHES x batch_size texts
    texts_encoded: int
    shared_calls: int  # calls holding texts of more than one request
    largest_call: int
    requests_waiting: int
    busy_s: float = 0.0  # wall seconds inside encode calls: against the elapsed time, the encoder's use


@dataclass(eq=False)
class _Request:
    texts: Sequence[str]
    on_progress: Callable[[int, int], None] | None
    vectors: np.ndarray | None = None
    sent: int = 0  # texts handed to a batch
    done: int = 0  # texts with vectors
    error: BaseException | None = None
    abandoned: bool = False
    finished: trio.Event = field(default_factory=trio.Event)
    served_at: float = field(default_factory=time.monotonic)  # when it last got texts into a batch


class EncodeThread:
    """One long-lived thread that runs every encode call of this process, one after another.

    torch's OpenMP keeps a team of threads for each thread that calls into it, and trio's thread
    cache hands a call to whichever of its workers is idle: the encode calls of an executor
    wandered over half a dozen threads and as many OpenMP teams. A throwaway probe (1,024
    chunks, windows of 128, jemalloc as entrypoint.sh sets it) used 1.83-1.89 cores from six
    calling threads against 1.94-1.97 from one, and held 20-30 MiB more (bench/README.md).
    """

    def __init__(self, name: str = "embedding-encode") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the thread. Like ``trio.to_thread.run_sync``, a call that has started
        is waited for, not abandoned, when the caller is cancelled."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()

        def job() -> None:
            result = outcome.capture(fn, *args)
            with contextlib.suppress(trio.RunFinishedError):  # the run ended: nobody to tell
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self._jobs.put(job)
        value: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return value


_encode_thread = EncodeThread()  # one per process, as the model (``_embedders``) is


def _timed(
    encode: Callable[..., np.ndarray], texts: Sequence[str], batch: int, max_tokens: int
) -> tuple[np.ndarray, float]:
    """In the encode thread: the vectors and the wall seconds the call took."""
    started = time.perf_counter()
    vectors = encode(texts, batch, max_tokens=max_tokens)
    return vectors, time.perf_counter() - started


class EmbeddingService:
    """Batches texts of concurrent tasks through one model (one service per executor)."""

    def __init__(
        self,
        model: str,
        batch_size: int,
        limiter: trio.CapacityLimiter,
        *,
        max_tokens: int = 0,
        loader: Callable[[str], Embedder] = load_embedder,
        window_batches: int = WINDOW_BATCHES,
        on_encoded: Callable[[int, float], None] | None = None,
    ) -> None:
        self.model = model
        self.batch_size = max(1, batch_size)
        self.max_tokens = max(0, max_tokens)  # a forward batch's tokens (ingest.batches)
        self.window = self.batch_size * max(1, window_batches)
        self.starve_after_s = STARVE_AFTER_S
        self._limiter = limiter
        self._loader = loader
        self._on_encoded = on_encoded  # called with each encode call's texts and seconds
        self._embedder: Embedder | None = None
        self._pending: deque[_Request] = deque()
        self._wakeup = trio.Event()
        self._consumer_token: object | None = None
        self._encode_calls = self._texts = self._shared = self._largest = 0
        self._busy_s = 0.0

    async def embedder(self) -> Embedder:
        """The loaded model (loaded in a thread under the embed limiter the first time)."""
        if self._embedder is None:
            loaded = _embedders.get(self.model) if self._loader is load_embedder else None
            if loaded is None:
                loaded = await trio.to_thread.run_sync(self._loader, self.model, limiter=self._limiter)
            self._embedder = loaded
        return self._embedder

    async def dimension(self) -> int:
        return (await self.embedder()).dim

    async def embed(
        self, texts: Sequence[str], on_progress: Callable[[int, int], None] | None = None
    ) -> np.ndarray:
        """Vectors of ``texts`` (rows in order), batched with other tasks' texts."""
        if not texts:
            return np.zeros((0, await self.dimension()), dtype=np.float32)
        self._ensure_consumer()
        request = _Request(texts, on_progress)
        self._pending.append(request)
        self._wakeup.set()
        try:
            await request.finished.wait()
        except BaseException:
            request.abandoned = True  # cancelled: its texts not yet sent are dropped
            if request in self._pending:
                self._pending.remove(request)
            raise
        if request.error is not None:  # each task gets its own exception object
            raise type(request.error)(*request.error.args)
        assert request.vectors is not None
        return request.vectors

    def statistics(self) -> EmbeddingStatistics:
        return EmbeddingStatistics(
            encode_calls=self._encode_calls,
            texts_encoded=self._texts,
            shared_calls=self._shared,
            largest_call=self._largest,
            requests_waiting=len(self._pending),
            busy_s=self._busy_s,
        )

    def _ensure_consumer(self) -> None:
        token = trio.lowlevel.current_trio_token()
        if self._consumer_token is not token:
            self._consumer_token = token
            self._wakeup = trio.Event()
            trio.lowlevel.spawn_system_task(self._consume, name="embedding-service")

    async def _consume(self) -> None:
        try:
            while True:
                if not self._pending:
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                await trio.lowlevel.checkpoint()  # tasks submitting at this moment join the batch
                batch = self._take_batch()
                if batch:
                    await self._encode(batch)
        except Exception as exc:  # never crash the run from a system task: fail the waiters
            log.exception("embedding service stopped")
            self._fail_all(PermanentError(f"embedding service stopped: {type(exc).__name__}: {exc}"))
        finally:
            self._consumer_token = None
            self._fail_all(PermanentError("embedding service stopped"))

    def _take_batch(self) -> list[tuple[_Request, int, int]]:
        """Up to a window of texts, from the requests with the fewest texts left first.

        Shortest-remaining-first lets small documents pass large ones, and makes tasks finish
        one after another: each frees its executor slot while the others still have texts
        queued, so the next task is parsed while the model keeps working. (Taking from every
        request in turn made them all finish together, and the model idled while the
        next ones were parsed.)
        """
        batch: list[tuple[_Request, int, int]] = []
        room = self.window
        now = time.monotonic()
        # The wait is bounded: a request that got nothing for STARVE_AFTER_S (a large document
        # behind a steady stream of small ones) is served first, a batch of its texts a window.
        starved = [r for r in self._pending if now - r.served_at >= self.starve_after_s]
        for request in starved:
            room = self._take(batch, request, min(room, self.batch_size), room, now)
            if not room:
                return batch
        for request in sorted(self._pending, key=lambda r: len(r.texts) - r.sent):  # stable: FIFO ties
            room = self._take(batch, request, room, room, now)
            if not room:
                break
        return batch

    def _take(
        self, batch: list[tuple[_Request, int, int]], request: _Request, most: int, room: int, now: float
    ) -> int:
        """Up to ``most`` of ``request``'s texts into ``batch``; returns the room left."""
        take = min(most, len(request.texts) - request.sent)
        if take <= 0:
            return room
        batch.append((request, request.sent, request.sent + take))
        request.sent += take
        request.served_at = now
        if request.sent >= len(request.texts):
            self._pending.remove(request)
        return room - take

    async def _encode(self, batch: list[tuple[_Request, int, int]]) -> None:
        texts = [t for request, start, end in batch for t in request.texts[start:end]]
        try:
            embedder = await self.embedder()
            async with self._limiter:
                vectors, seconds = await _encode_thread.run_sync(
                    _timed, embedder.encode, texts, self.batch_size, self.max_tokens
                )
        except Exception as exc:  # noqa: BLE001 - routed to the tasks whose texts these were
            error = exc if isinstance(exc, PermanentError) else PermanentError(f"embedding failed: {exc}")
            for request, _, _ in batch:
                self._finish(request, error)
            return
        self._encode_calls += 1
        self._texts += len(texts)
        self._busy_s += seconds
        if self._on_encoded is not None:
            self._on_encoded(len(texts), seconds)
        self._largest = max(self._largest, len(texts))
        if len({id(request) for request, _, _ in batch}) > 1:
            self._shared += 1
        offset = 0
        for request, start, end in batch:
            count = end - start
            if not request.abandoned and request.error is None:
                if request.vectors is None:
                    request.vectors = np.empty((len(request.texts), vectors.shape[1]), dtype=np.float32)
                request.vectors[start:end] = vectors[offset : offset + count]
                request.done += count
                self._report(request)
                if request.done >= len(request.texts):
                    self._finish(request)
            offset += count

    @staticmethod
    def _report(request: _Request) -> None:
        if request.on_progress is not None:
            try:
                request.on_progress(request.done, len(request.texts))
            except Exception:  # a progress callback must not stop the service
                log.exception("embedding progress callback failed")

    def _finish(self, request: _Request, error: BaseException | None = None) -> None:
        if error is not None and request.error is None:
            request.error = error
            if request in self._pending:
                self._pending.remove(request)
        request.finished.set()

    def _fail_all(self, error: BaseException) -> None:
        while self._pending:
            self._finish(self._pending.popleft(), error)
