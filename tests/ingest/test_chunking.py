"""Chunking: deterministic, never over the token limit, overlapping, configured per knowledge
base, and with a default that the model reads whole."""

from __future__ import annotations

import random
import re

import pytest

from db.config import Settings
from ingest.chunking import (
    DEFAULT_PARSER_CONFIG,
    ChunkConfig,
    chunk_document,
    chunk_sections,
    delimiter_pattern,
    oversize_note,
)
from ingest.errors import PermanentError
from ingest.parsers import Section
from ingest.tokens import load_tokenizer, model_max_tokens, model_text_tokens

MODEL = Settings().embedding_model
WORDS = ["tide", "lunar", "bee", "hive", "roast", "espresso", "orbit", "kepler", "compost"]
WORDS += ["worm", "knot", "bowline", "supercalifragilistic"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL)


def random_text(seed: int, paragraphs: int = 20) -> list[Section]:
    rng = random.Random(seed)
    sections = []
    for p in range(paragraphs):
        sentences = []
        for _ in range(rng.randint(1, 12)):
            words = rng.choices(WORDS, k=rng.randint(3, 40))
            sentences.append(" ".join(words) + rng.choice([".", "!", "?", ";", ""]))
        joiner = rng.choice([" ", "\n", "  "])
        sections.append(Section(joiner.join(sentences), page=p // 5 + 1))
    return sections


def test_the_default_is_what_the_model_reads_whole():
    assert model_max_tokens(MODEL) == 256
    assert (
        ChunkConfig().chunk_token_num == DEFAULT_PARSER_CONFIG["chunk_token_num"] <= model_text_tokens(MODEL)
    )
    assert oversize_note(ChunkConfig(), MODEL) == ""


def test_a_size_longer_than_the_model_reads_gets_a_note():
    note = oversize_note(ChunkConfig(chunk_token_num=512), MODEL)
    assert "512" in note and "254" in note and "not embedded" in note


def test_same_input_same_chunks():
    config = ChunkConfig(chunk_token_num=64, overlap_percent=20)
    assert chunk_document(random_text(1), config, MODEL) == chunk_document(random_text(1), config, MODEL)


@pytest.mark.parametrize("size", [16, 64, 128, 254])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_chunk_exceeds_the_limit_and_counts_are_exact(tokenizer, size, seed):
    chunks = chunk_sections(random_text(seed), ChunkConfig(chunk_token_num=size), tokenizer)
    assert chunks
    assert [c.position for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert 0 < chunk.token_num <= size
        assert chunk.token_num == tokenizer.count(chunk.content)


def test_a_text_without_delimiters_or_spaces_is_still_cut(tokenizer):
    text = "漢字" * 500  # each character is a word piece; no space, no delimiter
    chunks = chunk_sections([Section(text)], ChunkConfig(chunk_token_num=32, overlap_percent=0), tokenizer)
    assert [c.token_num for c in chunks] == [32] * 31 + [8]
    assert "".join(c.content for c in chunks) == text


def test_no_word_is_lost(tokenizer):
    sections = random_text(4)
    chunks = chunk_sections(sections, ChunkConfig(chunk_token_num=48), tokenizer)
    source = [w for s in sections for w in re.findall(r"\w+", s.text)]
    chunked = " ".join(c.content for c in chunks)
    assert all(w in chunked for w in set(source))
    assert len(re.findall(r"\w+", chunked)) >= len(source)


def test_each_chunk_starts_with_the_end_of_the_one_before(tokenizer):
    text = " ".join(f"Sentence number {i} is here." for i in range(200))
    chunks = chunk_sections([Section(text)], ChunkConfig(chunk_token_num=64, overlap_percent=25), tokenizer)
    for before, after in zip(chunks, chunks[1:], strict=False):
        head = after.content.split(" ")[:3]
        assert " ".join(head) in before.content[-120:]
        overlap = before.content[before.content.rindex(" ".join(head)) :]
        assert tokenizer.count(overlap) <= 16


def test_without_overlap_chunks_partition_the_text(tokenizer):
    text = "\n".join(f"Line {i} of the file." for i in range(300))
    chunks = chunk_sections([Section(text)], ChunkConfig(chunk_token_num=50, overlap_percent=0), tokenizer)
    assert "\n".join(c.content for c in chunks) == text


def test_chunks_are_cut_at_delimiters(tokenizer):
    text = "Alpha beta gamma. Delta epsilon! Zeta eta theta? Iota kappa."
    chunks = chunk_sections(
        [Section(text)], ChunkConfig(chunk_token_num=7, delimiter="!?", overlap_percent=0), tokenizer
    )
    assert [c.content for c in chunks] == [
        "Alpha beta gamma. Delta epsilon!",
        "Zeta eta theta?",
        "Iota kappa.",
    ]


def test_backticks_name_a_delimiter_of_several_characters():
    pattern = delimiter_pattern("\n`##`!")
    assert pattern.findall("a##b!c\nd#e") == ["##", "!", "\n"]


def test_a_chunk_takes_the_page_of_its_first_new_text(tokenizer):
    sections = [Section("one " * 30, 1), Section("two " * 30, 2), Section("three " * 30, 3)]
    chunks = chunk_sections(sections, ChunkConfig(chunk_token_num=32, overlap_percent=0), tokenizer)
    assert [(c.page, c.content.split()[0]) for c in chunks] == [(1, "one"), (2, "two"), (3, "three")]


def test_knowledge_base_then_document_config_over_the_defaults():
    config = ChunkConfig.from_parser_configs(
        {"chunk_token_num": 200}, {"overlap_percent": 0, "delimiter": "\\n"}
    )
    assert (config.chunk_token_num, config.overlap_percent, config.delimiter) == (200, 0, "\n")
    assert ChunkConfig.from_parser_configs(None, {}) == ChunkConfig()


@pytest.mark.parametrize(
    "bad",
    [{"chunk_token_num": "big"}, {"chunk_token_num": 0}, {"overlap_percent": 95}, {"delimiter": 5}],
)
def test_a_bad_parser_config_is_a_permanent_error(bad):
    with pytest.raises(PermanentError, match="parser_config"):
        ChunkConfig.from_parser_configs(bad)


def test_a_chunk_records_the_pages_it_spans(tokenizer):
    sections = [Section("Page one ends here.", 1), Section("Page two goes on.", 2), Section("Three.", 3)]
    chunks = chunk_sections(sections, ChunkConfig(), tokenizer)
    assert [(c.page, c.last_page) for c in chunks] == [(1, 3)]
    alone = chunk_sections(sections[1:2], ChunkConfig(), tokenizer)
    assert [(c.page, c.last_page) for c in alone] == [(2, 2)]
    unpaged = chunk_sections([Section("No pages in a text file.")], ChunkConfig(), tokenizer)
    assert [(c.page, c.last_page) for c in unpaged] == [(0, 0)]


def test_token_counts_are_encoded_in_bounded_batches_and_agree_with_one_batch(tokenizer):
    """An encoding holds ~150 bytes a token: a whole document in one batch made ``tokenizers``
    (Rust) abort the parse worker under its memory cap ("killed by signal 6", 24 MB of text
    under 700 MB), where the task should have been chunked or told it needs more memory."""
    from ingest import tokens

    texts = [f"piece {i} of a long document, with words enough to count. " * 40 for i in range(2_000)]
    whole = [len(e.ids) for e in tokenizer._tok.encode_batch(texts, add_special_tokens=False)]
    sizes: list[int] = []

    class Recording:
        def __init__(self, inner):
            self.inner = inner

        def encode_batch(self, batch, **kw):
            sizes.append(sum(len(t) for t in batch))
            return self.inner.encode_batch(batch, **kw)

    inner, tokenizer._tok = tokenizer._tok, Recording(tokenizer._tok)
    try:
        assert tokenizer.count_many(texts) == whole
    finally:
        tokenizer._tok = inner
    assert len(sizes) > 1 and max(sizes) <= tokens.COUNT_BATCH_CHARS + len(texts[0])
