"""Chunking: a document's sections → chunks of at most ``chunk_token_num`` word pieces.

Configured by the knowledge base's and the document's ``parser_config`` over
:data:`DEFAULT_PARSER_CONFIG`:

- ``chunk_token_num``: the most word pieces of a chunk, counted by the embedding model's own
  tokenizer (:mod:`ingest.tokens`), so the model sees what was counted.
- ``delimiter``: where a text may be cut, each character a delimiter, or a longer one between
  backticks (``"\\n!?`##`"``), as RAGFlow writes it. A piece still longer than a chunk is cut at
  sentence ends, then between words.
- ``overlap_percent``: each chunk after the first starts with up to this share of
  ``chunk_token_num`` taken from the end of the one before (cut between words).

- a character cap (``max_chars``, from ``Settings.max_chunk_chars``): text is cut into windows
  of at most that many characters (at a space where there is one) before it is tokenized, and
  no chunk is longer. A token cap alone does not bound a chunk: the model's tokenizer counts a
  word of more than 100 characters as one unknown token, so one 20 MB "word" was one chunk, and
  tokenizing one 20 MB line at once held a span per token (3 GB).

Pieces are merged greedily in order across sections; a chunk's page is the page of its first
new piece. The same sections and config always give the same chunks (the chunk ids of
``ingest.store`` follow from the positions).

Why 192 (measured, ``bench/chunk_size.py``): the default model, all-MiniLM-L6-v2, reads 256 word
pieces, 254 of them text. Corpus: the 13 demo documents of ``examples/`` and the 14 licence texts
of /usr/share/common-licenses (27 documents); 105 questions whose answer passage is known, 52 on
the demo documents and 53 harder ones on the long, similar licences. A returned chunk is a hit
when it holds the answer's key phrase; overlap 10 %; "hit@640t" caps the context at 640 tokens
(k = 640 // size), what a reader with a fixed prompt budget gets. All 105 questions:

    ====  ======  =====  =====  =====  ======  ========
    size  chunks  R@1    R@3    R@5    MRR@10  hit@640t
    ====  ======  =====  =====  =====  ======  ========
    64    1043    0.524  0.695  0.762  0.620   0.819
    96    669     0.495  0.724  0.762  0.621   0.771
    128   492     0.533  0.705  0.771  0.641   0.771
    160   396     0.571  0.752  0.810  0.677   0.771
    192   330     0.610  0.762  0.781  0.697   0.762
    254   249     0.610  0.752  0.810  0.693   0.695
    512   125     0.638  0.743  0.771  0.699   0.638
    ====  ======  =====  =====  =====  ======  ========

Top-1 and MRR rise with the size up to ~192 and then level off, while the hit rate within a
fixed context budget falls, steeply past 192 (at 512 the model embeds only the first half of
each chunk). 192 has the best mean of R@1, R@5, MRR and hit@640t (0.713; 160: 0.707, 254:
0.702, 128: 0.679) and stays well inside what the model reads. (One question is ~1 %: 160 and
192 are within noise of each other; 64–128 lose on top-1, 254–512 on budget.)

A size over what the model reads is allowed but noted on the knowledge base
(:func:`oversize_note`): the model embeds only the first 254 word pieces of such a chunk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.errors import PermanentError
from ingest.ids import DEFAULT_MAX_CHUNK_CHARS
from ingest.parsers import Section
from ingest.tokens import TextTokenizer, load_tokenizer, model_text_tokens

DEFAULT_PARSER_CONFIG: dict[str, Any] = {
    "chunk_token_num": 192,
    "delimiter": "\n!?。；！？",
    "overlap_percent": 10,
}
MAX_CHUNK_TOKEN_NUM = 8192
DEFAULT_MAX_CHARS = DEFAULT_MAX_CHUNK_CHARS  # Settings.max_chunk_chars
MAX_OVERLAP_PERCENT = 90
_SENTENCE_END = re.compile(r"(?<=[.!?;:。！？；])(?=\s)")


@dataclass(frozen=True)
class ChunkConfig:
    """The validated chunking part of a parser config."""

    chunk_token_num: int = DEFAULT_PARSER_CONFIG["chunk_token_num"]
    delimiter: str = DEFAULT_PARSER_CONFIG["delimiter"]
    overlap_percent: int = DEFAULT_PARSER_CONFIG["overlap_percent"]
    max_chars: int = DEFAULT_MAX_CHARS  # a setting, not a parser_config key (0: no cap)

    @classmethod
    def from_parser_configs(cls, *configs: Mapping[str, Any] | None) -> ChunkConfig:
        """Defaults, then each config in turn (the knowledge base's, then the document's)."""
        merged: dict[str, Any] = dict(DEFAULT_PARSER_CONFIG)
        for config in configs:
            merged.update({k: v for k, v in (config or {}).items() if v is not None})
        try:
            size = int(merged["chunk_token_num"])
            overlap = int(merged["overlap_percent"])
        except (TypeError, ValueError):
            raise PermanentError(
                "parser_config: chunk_token_num and overlap_percent must be integers, not "
                f"{merged['chunk_token_num']!r} and {merged['overlap_percent']!r}"
            ) from None
        if not 8 <= size <= MAX_CHUNK_TOKEN_NUM:
            raise PermanentError(
                f"parser_config: chunk_token_num must be 8…{MAX_CHUNK_TOKEN_NUM}, not {size}"
            )
        if not 0 <= overlap <= MAX_OVERLAP_PERCENT:
            raise PermanentError(
                f"parser_config: overlap_percent must be 0…{MAX_OVERLAP_PERCENT}, not {overlap}"
            )
        delimiter = merged["delimiter"]
        if not isinstance(delimiter, str):
            raise PermanentError(f"parser_config: delimiter must be a string, not {delimiter!r}")
        delimiter = delimiter.replace("\\n", "\n").replace("\\t", "\t")
        return cls(chunk_token_num=size, delimiter=delimiter, overlap_percent=overlap)

    @property
    def overlap_tokens(self) -> int:
        return self.chunk_token_num * self.overlap_percent // 100


@dataclass(frozen=True)
class Chunk:
    """One chunk of a task's text: ``position`` counts from 0 within the task."""

    content: str
    page: int  # the page its first piece is on (1-based; 0 for a format without pages)
    token_num: int
    position: int
    last_page: int = 0  # the page its last piece is on (a chunk may span pages); 0 as above


def oversize_note(config: ChunkConfig, model: str) -> str:
    """A note for the knowledge base when its chunks are longer than ``model`` reads, else ""."""
    reads = model_text_tokens(model)
    if reads is None or config.chunk_token_num <= reads:
        return ""
    return (
        f"chunk size {config.chunk_token_num} is longer than the embedding model reads "
        f"({reads} word pieces): the rest of a longer chunk is stored but not embedded"
    )


def delimiter_pattern(delimiter: str) -> re.Pattern[str] | None:
    """``"\\n!?`##`"`` → a pattern matching ``\\n``, ``!``, ``?`` or ``##`` (None: no delimiter)."""
    multi = re.findall(r"`([^`]+)`", delimiter)
    singles = re.sub(r"`[^`]+`", "", delimiter)
    options = sorted(set(multi), key=len, reverse=True) + sorted(set(singles))
    if not options:
        return None
    return re.compile("|".join(re.escape(o) for o in options))


def _split_keep(text: str, pattern: re.Pattern[str] | None) -> list[str]:
    """Cut ``text`` after each delimiter (kept at the end of its piece)."""
    if pattern is None:
        return [text]
    pieces, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start:
            pieces.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def cut_by_chars(text: str, max_chars: int) -> list[str]:
    """``text`` in consecutive parts of at most ``max_chars`` characters, each cut after the last
    whitespace in its second half where there is one (0: no cap)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return [text]
    parts, start = [], 0
    while len(text) - start > max_chars:
        end = start + max_chars
        space = max(
            text.rfind(" ", start + max_chars // 2, end), text.rfind("\n", start + max_chars // 2, end)
        )
        cut = space + 1 if space > start else end
        parts.append(text[start:cut])
        start = cut
    parts.append(text[start:])
    return parts


def cut_by_tokens(text: str, limit: int, tokenizer: TextTokenizer) -> list[str]:
    """``text`` in consecutive parts of at most ``limit`` tokens, cut between words if possible."""
    spans = tokenizer.spans(text)
    if len(spans) <= limit:
        return [text]
    parts, first, char_start = [], 0, 0
    while len(spans) - first > limit:
        end = first + limit
        cut = end
        while cut > first + 1 and spans[cut].word == spans[cut - 1].word:
            cut -= 1
        if cut == first + 1 and spans[cut].word == spans[cut - 1].word:
            cut = end  # one word longer than a chunk: cut inside it
        char_cut = spans[cut].start
        parts.append(text[char_start:char_cut])
        first, char_start = cut, char_cut
    parts.append(text[char_start:])
    return parts


def overlap_tail(text: str, tokens: int, tokenizer: TextTokenizer) -> str:
    """The end of ``text``: at most ``tokens`` tokens, starting at a word."""
    if tokens <= 0:
        return ""
    spans = tokenizer.spans(text)
    if not spans:
        return ""
    i = max(0, len(spans) - tokens)
    while 0 < i < len(spans) and spans[i].word == spans[i - 1].word:
        i += 1
    return text[spans[i].start :] if i < len(spans) else ""


@dataclass
class _Piece:
    text: str
    page: int
    tokens: int


def _pieces(sections: Iterable[Section], config: ChunkConfig, tokenizer: TextTokenizer) -> list[_Piece]:
    pattern = delimiter_pattern(config.delimiter)
    raw: list[tuple[str, int]] = []
    for section in sections:
        parts = [w for p in _split_keep(section.text, pattern) for w in cut_by_chars(p, config.max_chars - 1)]
        if parts:
            parts[-1] += "\n"  # sections stay apart inside a chunk
        raw.extend((p, section.page) for p in parts if p)
    counts = tokenizer.count_many([t for t, _ in raw])
    limit = config.chunk_token_num
    pieces: list[_Piece] = []
    for (text, page), count in zip(raw, counts, strict=True):
        if count <= limit:
            pieces.append(_Piece(text, page, count))
            continue
        sentences = [s for s in _SENTENCE_END.split(text) if s]
        for sentence, n in zip(sentences, tokenizer.count_many(sentences), strict=True):
            parts = [sentence] if n <= limit else cut_by_tokens(sentence, limit, tokenizer)
            for part, m in zip(parts, tokenizer.count_many(parts), strict=True):
                pieces.append(_Piece(part, page, m))
    return pieces


def chunk_sections(sections: Iterable[Section], config: ChunkConfig, tokenizer: TextTokenizer) -> list[Chunk]:
    """Merge sections' pieces into chunks of at most ``config.chunk_token_num`` tokens."""
    limit = config.chunk_token_num
    max_chars = config.max_chars if config.max_chars > 0 else float("inf")
    drafts: list[tuple[str, int, int]] = []  # (content, first page, last page)
    texts: list[str] = []
    tokens = chars = fresh = page = last_page = 0  # fresh: pieces of this chunk that are not overlap
    for piece in _pieces(sections, config, tokenizer):
        if fresh and (tokens + piece.tokens > limit or chars + len(piece.text) > max_chars):
            content = "".join(texts)
            drafts.append((content, page, last_page))
            overlap = overlap_tail(content, min(config.overlap_tokens, limit - piece.tokens), tokenizer)
            if len(overlap) + len(piece.text) > max_chars:
                overlap = ""  # no room for it within the character cap
            texts = [overlap] if overlap.strip() else []
            tokens = tokenizer.count(overlap) if texts else 0
            chars = len(overlap) if texts else 0
            fresh = 0
        if not fresh:
            page = piece.page
        last_page = piece.page
        texts.append(piece.text)
        tokens += piece.tokens
        chars += len(piece.text)
        fresh += 1
    if fresh:
        drafts.append(("".join(texts), page, last_page))
    chunks: list[Chunk] = []
    for content, chunk_page, chunk_last in drafts:
        content = content.strip()
        if not content:
            continue
        count = tokenizer.count(content)
        parts = [content] if count <= limit else [p.strip() for p in cut_by_tokens(content, limit, tokenizer)]
        for part in parts:
            if part:
                n = count if len(parts) == 1 else tokenizer.count(part)
                chunks.append(Chunk(part, chunk_page, n, len(chunks), max(chunk_last, chunk_page)))
    return chunks


def chunk_document(sections: Iterable[Section], config: ChunkConfig, model: str) -> list[Chunk]:
    """:func:`chunk_sections` with the tokenizer of the embedding ``model`` (cached per process)."""
    return chunk_sections(sections, config, load_tokenizer(model))
