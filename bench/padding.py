"""Padding: how many tokens the encoder computes for the same chunks, by how a call's texts are
sorted into forward batches.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.padding [--docs 240] [--batch 32] [--max-tokens 4096]

The chunks are ``bench/ingest.py``'s (its documents, parsed and chunked as the parse workers do,
the default parser config), counted by the model's own tokenizer with its two markers and its
truncation. A forward batch costs about its rows times its longest row: the rest is padding.
For windows of 1 to 32 forward batches of consecutive chunks (an executor's encode call takes a
window of ``WINDOW_BATCHES`` from the tasks waiting, document after document), it prints the
tokens computed when each window is sorted

- by characters, as ``SentenceTransformer.encode`` sorts (the executor before 2026-12-07),
- by tokens, as :class:`ingest.embedding.Embedder` sorts them,
- by tokens and cut by ``--max-tokens`` as well (``INGEST_EMBEDDING_BATCH_TOKENS``,
  :func:`ingest.batches.forward_batches`): what the Embedder computes with the settings,

each against one sort of all chunks by characters: what ``bench/ingest.py``'s raw phase computes
when it encodes them in one call. It counts tokens, it times nothing: no model is loaded.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.ingest import real_documents  # noqa: E402
from db.config import Settings  # noqa: E402
from ingest.batches import forward_batches  # noqa: E402
from ingest.chunking import ChunkConfig, chunk_document  # noqa: E402
from ingest.embedding import WINDOW_BATCHES  # noqa: E402
from ingest.parsers import parse_document  # noqa: E402
from ingest.tokens import load_tokenizer, model_max_tokens  # noqa: E402

Item = tuple[int, int]  # (characters, tokens) of one chunk


def computed(items: Sequence[Item], window: int, batch: int, key: Callable[[Item], int]) -> int:
    """Tokens computed: each window sorted by ``key`` (longest first), cut into batches, each
    batch as wide as its longest text in tokens."""
    total = 0
    for start in range(0, len(items), window):
        ordered = sorted(items[start : start + window], key=key, reverse=True)
        for first in range(0, len(ordered), batch):
            rows = ordered[first : first + batch]
            total += len(rows) * max(tokens for _, tokens in rows)
    return total


def computed_capped(items: Sequence[Item], window: int, batch: int, max_tokens: int) -> int:
    """Tokens computed as the Embedder batches each window: :func:`forward_batches`."""
    total = 0
    for start in range(0, len(items), window):
        lengths = [tokens for _, tokens in items[start : start + window]]
        total += sum(len(rows) * lengths[rows[0]] for rows in forward_batches(lengths, batch, max_tokens))
    return total


def main(argv: list[str] | None = None) -> int:
    settings = Settings.from_env(os.environ)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=240, help="bench/ingest.py's documents")
    parser.add_argument("--batch", type=int, default=settings.embedding_batch, help="texts a forward batch")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=settings.embedding_batch_tokens,
        help="tokens a forward batch (0: no cap)",
    )
    args = parser.parse_args(argv)
    model = settings.embedding_model
    tokenizer = load_tokenizer(model)
    most = model_max_tokens(model) or 512
    texts = [
        chunk.content
        for _, data in real_documents(args.docs)
        for chunk in chunk_document(parse_document(data, "txt"), ChunkConfig(), model)
    ]
    items = [(len(t), min(n + 2, most)) for t, n in zip(texts, tokenizer.count_many(texts), strict=True)]
    real = sum(tokens for _, tokens in items)
    by_chars: Callable[[Item], int] = lambda item: item[0]  # noqa: E731
    by_tokens: Callable[[Item], int] = lambda item: item[1]  # noqa: E731
    whole = computed(items, len(items), args.batch, by_chars)
    print(
        f"{len(texts)} chunks, {real:,} tokens (markers included, at most {most}); batch {args.batch}; "
        f"one sort of all by characters (the raw encode) computes {whole:,} ({whole / real - 1:+.1%} padding)"
    )
    print(
        "window (batches) | sorted by characters | sorted by tokens | tokens against characters | "
        f"by tokens, at most {args.max_tokens} a batch"
    )
    for batches in (1, 2, 4, 8, 16, 32):
        chars = computed(items, batches * args.batch, args.batch, by_chars)
        tokens = computed(items, batches * args.batch, args.batch, by_tokens)
        capped = computed_capped(items, batches * args.batch, args.batch, args.max_tokens)
        mark = " (WINDOW_BATCHES)" if batches == WINDOW_BATCHES else ""
        print(
            f"{batches:2d}{mark} | {chars / whole - 1:+.2%} | {tokens / whole - 1:+.2%} | "
            f"{tokens / chars - 1:+.2%} | {capped / whole - 1:+.2%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
