"""Dataflow components as plain functions: Parser (by type, forced, HTML headings marked),
Splitter (tokens, delimiter, headings; overlap), Extractor (keywords, regex onto chunk metadata),
and the worker stage that runs them in order and names a failing component."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from db.config import Settings
from ingest.chunking import ChunkConfig, chunk_sections
from ingest.dataflow.components import (
    REGISTRY,
    ChunkSet,
    FileInput,
    keywords,
    merge_chunk_sets,
    run_worker_stage,
)
from ingest.errors import BadDocument
from ingest.parsers import Section, parse_document
from ingest.tokens import load_tokenizer

MODEL = Settings().embedding_model
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL)


def params(type_name: str, **given: object) -> dict[str, object]:
    return {**{name: p.default for name, p in REGISTRY[type_name].params.items()}, **given}


def run(type_name: str, value: object, **given: object) -> object:
    steps = [("c", type_name, params(type_name, **given), ("in",))]
    return run_worker_stage(steps, {"in": value}, MODEL, {})["c"]


def test_the_parser_gives_the_parse_pipelines_sections_by_type_or_forced_format():
    data = (EXAMPLES / "beekeeping.md").read_bytes()
    file = FileInput("beekeeping.md", "md", data)
    assert run("Parser", file) == parse_document(data, "md")
    forced = run("Parser", FileInput("notes.bin", "bin", b"# Title\n\nplain words"), format="markdown")
    assert [s.text for s in forced] == ["# Title", "plain words"]


def test_html_headings_can_be_marked_as_markdown_headings():
    file = FileInput("coffee.html", "html", (EXAMPLES / "coffee.html").read_bytes())
    plain = [s.text for s in run("Parser", file)]
    marked = [s.text for s in run("Parser", file, mark_headings=True)]
    assert "Processing" in plain and "## Processing" in marked and "# From Green Bean to Espresso" in marked
    titles = {t.lstrip("# ") for t in marked if t.startswith("#")}
    body = [t for t in plain if t not in titles]
    assert body and body == [t for t in marked if not t.startswith("#") and t not in titles]


def test_the_token_splitter_is_the_parse_pipelines_chunker(tokenizer):
    sections = parse_document((EXAMPLES / "sourdough.txt").read_bytes(), "txt")
    out = run("Splitter", sections, chunk_token_num=64, overlap_percent=20)
    expected = chunk_sections(sections, ChunkConfig(chunk_token_num=64, overlap_percent=20), tokenizer)
    assert out.chunks == expected and out.meta == [{}] * len(expected) and out.vectors is None


def test_the_delimiter_splitter_ends_a_chunk_at_every_delimiter():
    sections = [Section("alpha one; beta two; gamma three", 1), Section("delta four", 2)]
    out = run("Splitter", sections, method="delimiter", delimiter=";", overlap_percent=0)
    assert [c.content for c in out.chunks] == ["alpha one;", "beta two;", "gamma three", "delta four"]
    assert [c.position for c in out.chunks] == [0, 1, 2, 3] and [c.page for c in out.chunks] == [1, 1, 1, 2]
    overlapping = run(
        "Splitter", sections, method="delimiter", delimiter=";", chunk_token_num=16, overlap_percent=25
    )
    assert [c.content for c in overlapping.chunks] == [
        "alpha one;",
        "alpha one; beta two;",
        "beta two; gamma three",
        "gamma three delta four",
    ]


def test_a_long_piece_is_cut_by_tokens_with_overlap(tokenizer):
    long = " ".join(f"word{i}" for i in range(200))
    out = run("Splitter", [Section(long)], method="delimiter", chunk_token_num=32, overlap_percent=25)
    assert len(out.chunks) > 3 and all(c.token_num <= 32 for c in out.chunks)
    for before, after in itertools.pairwise(out.chunks):
        words_before, words_after = before.content.split(), after.content.split()
        assert words_after[0] in words_before and words_before[-1] in words_after  # they overlap


def test_the_heading_splitter_keeps_each_chunk_under_one_heading():
    text = "# Bees\n\nIntro on bees.\n\n## Hives\nHives hold comb.\n\n## Mites\n\nVarroa mites.\n\n### Treatment\n\nOxalic acid."
    sections = parse_document(text.encode(), "md")
    out = run("Splitter", sections, method="headings", chunk_token_num=64, max_heading_level=2)
    assert [c.content for c in out.chunks] == [
        "# Bees\nIntro on bees.",
        "## Hives\nHives hold comb.",
        "## Mites\nVarroa mites.\n### Treatment\nOxalic acid.",
    ]
    assert [m["headings"] for m in out.meta] == [["Bees"], ["Bees", "Hives"], ["Bees", "Mites"]]


def test_keywords_are_the_most_frequent_words_that_are_not_stop_words():
    assert keywords("The hive, the hive and the queen of the hive; bees and a queen.", 2) == ["hive", "queen"]


def test_regex_fields_go_onto_chunk_metadata():
    chunks = ChunkSet(
        [c for c in run("Splitter", [Section("Order 12 costs 5 EUR; order 13 costs 7 EUR")]).chunks],
        [{"kept": True}],
    )
    named = run(
        "Extractor",
        chunks,
        method="regex",
        pattern=r"order (?P<order>\d+) costs (?P<price>\d+)",
        ignore_case=True,
    )
    assert named.meta == [{"kept": True, "order": "12", "price": "5"}]
    every = run("Extractor", chunks, method="regex", pattern=r"(\d+) EUR", field="prices", all=True)
    assert every.meta == [{"kept": True, "prices": ["5", "7"]}]
    none = run("Extractor", chunks, method="regex", pattern=r"USD")
    assert none.meta == [{"kept": True}]


def test_chunk_sets_merge_with_positions_renumbered():
    a = run("Splitter", [Section("one; two")], method="delimiter", delimiter=";")
    merged = merge_chunk_sets([a, a])
    assert [c.position for c in merged.chunks] == [0, 1, 2, 3] and len(merged.meta) == 4


def test_a_failing_component_is_named():
    with pytest.raises(BadDocument, match=r"component 'c' \(Parser\): not a PDF"):
        run("Parser", FileInput("x.pdf", "pdf", b"not a pdf at all"))
