"""Forward batches: longest texts first, at most ``batch_size`` texts and ``max_tokens`` tokens."""

from __future__ import annotations

from ingest.batches import forward_batches


def test_longest_first_in_batches_of_at_most_batch_size_texts_ties_in_call_order():
    lengths = [5, 9, 5, 12, 9, 1, 5]
    assert forward_batches(lengths, 3) == [[3, 1, 4], [0, 2, 6], [5]]


def test_a_token_cap_cuts_batches_by_their_longest_text():
    lengths = [100, 40, 100, 40, 40, 40, 40, 10, 10]
    batches = forward_batches(lengths, 4, max_tokens=200)
    # two texts of 100 make 200 tokens; four of 40 are 160 (a fifth would be 200, but the cap
    # on texts comes first); the rest, shorter, fill a batch of texts
    assert batches == [[0, 2], [1, 3, 4, 5], [6, 7, 8]]
    for batch in batches:
        assert len(batch) * lengths[batch[0]] <= 200 and len(batch) <= 4
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))


def test_a_text_longer_than_the_cap_goes_alone_and_no_cap_is_texts_only():
    lengths = [300, 10, 10, 250]
    assert forward_batches(lengths, 8, max_tokens=128) == [[0], [3], [1, 2]]
    assert forward_batches(lengths, 8, max_tokens=0) == [[0, 3, 1, 2]]
    assert forward_batches([], 8, max_tokens=128) == []
    assert forward_batches([0, 0, 3], 0, max_tokens=5) == [[2], [0], [1]]  # at least one text, never 0 wide
