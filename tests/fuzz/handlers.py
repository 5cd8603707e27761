"""The parse handler of the fuzz corpus's CI run: the real one (bytes from storage, parse and
chunk in budgeted worker processes, the executor's batching embedding service, chunk rows
written to MySQL), with the model's forward pass replaced by a hashing stand-in, so that
2,000 documents fit in CI's minutes on two cores. The big variant (``FUZZ_BIG=1``) runs the
real model. Loaded by ``INGEST_EXTRA_HANDLERS=parse=tests.fuzz.handlers:parse_with_hash_model``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xxhash

from executor.handlers import EMBEDDING_SERVICE
from ingest.embedding import Embedder, EmbeddingService

DIM = 384


class HashModel:
    """What ``Embedder`` needs of a SentenceTransformer: a unit vector per text from its hash."""

    max_seq_length = 256

    def get_embedding_dimension(self) -> int:
        return DIM

    def encode(self, texts: list[str], **_: Any) -> np.ndarray:
        rows = [
            np.random.default_rng(xxhash.xxh64_intdigest(t.encode("utf-8", "replace"))).standard_normal(DIM)
            for t in texts
        ]
        vectors = np.asarray(rows, dtype=np.float32).reshape(len(texts), DIM)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def parse_with_hash_model(env: Any) -> Any:
    from executor.handlers.parse import make_handler

    env.resources[EMBEDDING_SERVICE] = EmbeddingService(
        env.settings.embedding_model,
        env.settings.embedding_batch,
        env.limiters.embed_limiter,
        loader=lambda model: Embedder(model, HashModel()),
    )
    return make_handler(env)
