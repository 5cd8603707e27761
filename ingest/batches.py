"""How one encode call's texts are cut into forward batches: longest first, by texts and by tokens.

A forward batch is a tensor of its texts times its longest text's tokens (the rest is padding),
and the encoder's activations grow with it: the hidden states and the feed-forward layers hold
``rows x width`` vectors, attention ``rows x heads x width x width`` scores. Capping a batch at
``batch_size`` texts alone lets all of them follow the chunk length (32 texts of 512 tokens are
four times the tokens of 32 of 128, and sixteen times the attention). Capping its tokens as well
bounds the first at ``max_tokens`` vectors whatever the chunk size, and the attention at
``max_tokens x heads x width`` scores: linear in the width, no longer quadratic. The cap cuts
only batches wider than ``max_tokens / batch_size`` tokens (128 at the defaults). Measured on
``bench/ingest.py``'s chunks (up to 194 tokens; bench/README.md, "forward batches capped by
tokens"): 4,096 tokens held about 90 MiB less than 32 texts alone, at the same speed.

No torch here: the ONNX encoder of ``ingest.query_encoder`` batches the same way.
"""

from __future__ import annotations

from collections.abc import Sequence


def forward_batches(lengths: Sequence[int], batch_size: int, max_tokens: int = 0) -> list[list[int]]:
    """The indices of texts of these token ``lengths``, longest first (ties in their order),
    cut into batches of at most ``batch_size`` texts and, with ``max_tokens``, at most that many
    tokens counted as a batch's texts times its first (longest) text's length. A text longer than
    ``max_tokens`` is a batch of its own."""
    size = max(1, batch_size)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    start = 0
    while start < len(order):
        rows = size
        if max_tokens > 0:
            rows = max(1, min(size, max_tokens // max(1, lengths[order[start]])))
        batches.append(order[start : start + rows])
        start += rows
    return batches
