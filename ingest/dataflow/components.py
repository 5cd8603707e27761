"""Dataflow component types: plain functions in a registry, and the values they pass along.

Each type (:data:`REGISTRY`) names its parameters (defaults and checks), the kinds of value it
takes and the kind it gives, and where it runs:

- ``worker``: CPU-bound work on untrusted content (``Parser``, ``Splitter``, ``Extractor``).
  All such components of a run that are ready together go to a killable worker process in one
  job (:func:`run_worker_stage`), as the ``parse`` task's parsing does.
- ``embed``: the executor's shared batching embedding service (``Embedder``).
- ``index``: the chunk store, in a thread (``Indexer``).

They share the parse pipeline's code: :func:`ingest.parsers.parse_document`,
:func:`ingest.chunking.chunk_sections`, :meth:`ingest.embedding.EmbeddingService.embed`,
:func:`ingest.store.record_embedding_model` and :func:`ingest.store.store_chunks`.

Kinds of value: ``file`` (:class:`FileInput`), ``sections`` (a list of
:class:`~ingest.parsers.Section`), ``chunks`` and ``embedded`` (a :class:`ChunkSet`, without
or with vectors), ``indexed`` (an :class:`IndexResult`). A chunk's metadata (a Splitter's
heading path, an Extractor's fields) is held to :data:`ingest.store.MAX_META_BYTES` of JSON as
the component builds it: a larger one fails the run there, naming the component, not at the
Indexer after the embedding.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ingest.chunking import (
    DEFAULT_MAX_CHARS,
    DEFAULT_PARSER_CONFIG,
    MAX_CHUNK_TOKEN_NUM,
    MAX_OVERLAP_PERCENT,
    Chunk,
    ChunkConfig,
    cut_by_chars,
    cut_by_tokens,
    delimiter_pattern,
    overlap_tail,
    oversize_note,
)
from ingest.chunking import chunk_sections as chunk_by_tokens
from ingest.errors import BadDocument, PermanentError
from ingest.parsers import Section, decode_text, parse_document, supported_types
from ingest.store import check_meta

if TYPE_CHECKING:
    import trio

    from ingest.embedding import EmbeddingService

FILE, SECTIONS, CHUNKS, EMBEDDED, INDEXED = "file", "sections", "chunks", "embedded", "indexed"
KIND_NAMES = {
    FILE: "the document",
    SECTIONS: "sections",
    CHUNKS: "chunks",
    EMBEDDED: "embedded chunks",
    INDEXED: "an index result",
}
SOURCE, WORKER, EMBED, INDEX = "source", "worker", "embed", "index"
NO_PAGE_LIMIT = 100_000_000


# -- values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileInput:
    """The input document: its name, type (extension), bytes and the task's page range."""

    name: str
    doc_type: str
    data: bytes
    from_page: int = 0
    to_page: int = NO_PAGE_LIMIT


@dataclass(frozen=True)
class ChunkSet:
    """Chunks (positions 0…n-1), each one's metadata, and their vectors once embedded."""

    chunks: list[Chunk]
    meta: list[dict[str, Any]]
    vectors: np.ndarray | None = None


@dataclass(frozen=True)
class IndexResult:
    """What an Indexer did: the chunk ids written (none in a debug run) and how many chunks."""

    chunk_ids: list[str]
    chunks: int
    written: bool


@dataclass(frozen=True)
class IndexTarget:
    """Where an Indexer writes: the task's knowledge base, document, id and generation."""

    kb_id: str
    doc_id: str
    task_id: str
    generation: int
    attempt: int | None = None  # the run's attempt: its chunk writes are fenced on it


@dataclass
class Runtime:
    """What ``embed`` and ``index`` components use in the executor; ``target`` None: a debug run
    (nothing is written)."""

    model: str
    service: EmbeddingService
    db_limiter: trio.CapacityLimiter
    target: IndexTarget | None
    on_progress: Callable[[int, int], None] | None = None
    max_chars: int = 0  # characters one component's output may hold (0: no budget)
    max_chunk_chars: int = DEFAULT_MAX_CHARS  # characters one chunk may hold (Settings.max_chunk_chars)


def held_chars(value: Any) -> int:
    """Characters of text a component's output holds (sections or chunks; 0 for the rest)."""
    if isinstance(value, ChunkSet):
        return sum(len(c.content) for c in value.chunks)
    if isinstance(value, list):
        return sum(len(s.text) for s in value if isinstance(s, Section))
    return 0


def check_held(label: str, values: Sequence[Any], max_chars: int) -> None:
    """BadDocument when ``values`` together hold more text than the budget (``max_chars``; 0: none)."""
    if max_chars > 0:
        held = sum(held_chars(v) for v in values)
        if held > max_chars:
            raise BadDocument(
                f"{label} would hold {held} characters, more than {max_chars} characters "
                "(a component's budget, from worker_max_memory_mb): fewer inputs or a smaller document"
            )


def merge_chunk_sets(sets: Sequence[ChunkSet]) -> ChunkSet:
    """One chunk set from several, positions renumbered; vectors kept when every set has them."""
    if len(sets) == 1:
        return sets[0]
    chunks = [dataclasses.replace(c, position=i) for i, c in enumerate(c for s in sets for c in s.chunks)]
    meta = [dict(m) for s in sets for m in s.meta]
    vectors = None
    if sets and all(s.vectors is not None for s in sets):
        vectors = np.concatenate([s.vectors for s in sets if s.vectors is not None])
    return ChunkSet(chunks, meta, vectors)


# -- parameters ------------------------------------------------------------------------------

Check = Callable[[Any], str | None]  # a problem with the value, or None


@dataclass(frozen=True)
class Param:
    default: Any = None
    check: Check | None = None
    required: bool = False
    methods: tuple[str, ...] = ()  # only for these values of the ``method`` parameter


def one_of(*values: str) -> Check:
    return lambda v: None if v in values else f"must be one of {', '.join(values)}, not {v!r}"


def int_between(low: int, high: int) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            return f"must be an integer {low}…{high}, not {v!r}"
        return None

    return check


def a_bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, not {v!r}"


def a_string(v: Any) -> str | None:
    return None if isinstance(v, str) else f"must be a string, not {v!r}"


def a_name(v: Any) -> str | None:
    if isinstance(v, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", v):
        return None
    return f"must be a name (letters, digits, _ . -; at most 64), not {v!r}"


def a_format(v: Any) -> str | None:
    if v == "auto" or (isinstance(v, str) and v.lower().lstrip(".") in supported_types()):
        return None
    known = ", ".join(t for t in supported_types() if t)
    return f"must be auto or a document type ({known}), not {v!r}"


MAX_PATTERN_CHARS = 1000
_REGEX_MAX_MEM = 32 << 20  # RE2's memory for one compiled pattern


def compile_regex(pattern: str, ignore_case: bool = False) -> Any:
    """``pattern`` compiled by RE2: a linear-time engine, so no pattern can backtrack
    catastrophically on any text. It has no backreferences and no lookaround, and its ``\\w``,
    ``\\d`` and ``\\b`` are ASCII (``\\pL`` is any letter). Raises ``re2.error``."""
    import re2

    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    options.max_mem = _REGEX_MAX_MEM
    return re2.compile(pattern, options)


def a_regex(v: Any) -> str | None:
    import re2

    if not isinstance(v, str) or not v:
        return f"must be a non-empty regular expression, not {v!r}"
    if len(v) > MAX_PATTERN_CHARS:
        return f"must be at most {MAX_PATTERN_CHARS} characters, not {len(v)}"
    try:
        compile_regex(v)
    except re2.error as exc:
        reason = (
            exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        )
        return f"is not a pattern that runs in linear time (RE2: {reason}; no backreference, no lookaround)"
    return None


# -- File, Parser (worker) ---------------------------------------------------------------------

_HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def parse(params: Mapping[str, Any], inputs: Sequence[FileInput], extra: dict[str, str]) -> list[Section]:
    """The document's sections, by its type (``format: auto``) or a forced one."""
    (file,) = inputs
    kind = file.doc_type if params["format"] == "auto" else str(params["format"]).lower().lstrip(".")
    data = file.data
    if params["mark_headings"] and kind in ("html", "htm", "xhtml"):
        data = _mark_html_headings(data)
    return parse_document(data, kind, file.from_page, file.to_page, extra=extra)


def _mark_html_headings(data: bytes) -> bytes:
    """HTML with each ``<hN>`` written as a Markdown heading line (``## Title``), so a
    ``headings`` Splitter can cut there as it does in Markdown."""
    from bs4 import BeautifulSoup

    if b"charset" not in data[:4096].lower():
        decode_text(data, "HTML")  # undeclared encodings must be UTF-8, as the parser requires
    soup = BeautifulSoup(data, "lxml")
    for tag in _outermost(soup, _HEADING_TAGS):
        text = tag.get_text(" ", strip=True)
        tag.clear()
        if text:
            tag.append(f"{'#' * int(tag.name[1])} {text}")
    return soup.encode("utf-8")  # bs4 rewrites a <meta charset> to the new encoding


def _outermost(root: Any, names: tuple[str, ...]) -> list[Any]:
    """The elements named ``names`` that are inside no other such element, in document order,
    in one walk (a heading nested in a heading is part of the outer one's text: marking each
    in turn read every nested subtree again, quadratic in the depth)."""
    from bs4 import Tag

    found: list[Any] = []
    stack = [iter(root.contents)]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
        elif isinstance(child, Tag):
            if child.name in names:
                found.append(child)
            else:
                stack.append(iter(child.contents))
    return found


# -- Splitter (worker) -------------------------------------------------------------------------

_HEADING_LINE = re.compile(r"^ {0,3}(#{1,6})[ \t]+(\S.*?)[ \t#]*$")


def split(
    params: Mapping[str, Any],
    inputs: Sequence[list[Section]],
    tokenizer: Any,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> ChunkSet:
    """Chunks by tokens (merged up to ``chunk_token_num``), by delimiter (each delimiter ends a
    chunk) or by Markdown headings (no chunk spans two sections); ``overlap_percent`` of a chunk
    repeats at the start of the next one cut from the same stretch of text. No chunk holds more
    than ``max_chars`` characters."""
    sections = [s for group in inputs for s in group]
    method = params["method"]
    delimiter = params["delimiter"]
    if delimiter is None:
        delimiter = "\n" if method == "delimiter" else DEFAULT_PARSER_CONFIG["delimiter"]
    config = ChunkConfig.from_parser_configs(
        {
            "chunk_token_num": params["chunk_token_num"],
            "overlap_percent": params["overlap_percent"],
            "delimiter": delimiter,
        }
    )
    config = dataclasses.replace(config, max_chars=max_chars)
    if method == "tokens":
        chunks = chunk_by_tokens(sections, config, tokenizer)
        return ChunkSet(chunks, [{} for _ in chunks])
    if method == "delimiter":
        return _delimited_chunks(_delimited(sections, config.delimiter, max_chars), config, tokenizer)
    return _chunk_segments(_heading_segments(sections, params["max_heading_level"]), config, tokenizer)


def _delimited(
    sections: Sequence[Section], delimiter: str, max_chars: int = DEFAULT_MAX_CHARS
) -> list[Section]:
    """Each section cut after every delimiter (kept at the end of its piece), and a piece longer
    than ``max_chars`` into windows (before anything tokenizes it)."""
    pattern = delimiter_pattern(delimiter)
    pieces: list[Section] = []
    for section in sections:
        start = 0
        ends = [m.end() for m in pattern.finditer(section.text)] if pattern is not None else []
        for end in [*ends, len(section.text)]:
            for window in cut_by_chars(section.text[start:end], max_chars):
                text = window.strip()
                if text:
                    pieces.append(Section(text, section.page))
            start = max(start, end)
    return pieces


def _delimited_chunks(pieces: Sequence[Section], config: ChunkConfig, tokenizer: Any) -> ChunkSet:
    """One chunk per piece (a longer piece cut between words), each after the first starting
    with the end of the piece before it: ``overlap_percent`` of ``chunk_token_num``, as room allows."""
    limit, overlap = config.chunk_token_num, config.overlap_tokens
    parts: list[tuple[str, int, int]] = []  # (text, page, tokens)
    for piece in pieces:
        size = tokenizer.count(piece.text)
        texts = (
            [piece.text] if size <= limit else cut_by_tokens(piece.text, max(1, limit - overlap), tokenizer)
        )
        texts = [t.strip() for t in texts if t.strip()]
        counts = [size] if size <= limit else tokenizer.count_many(texts)
        parts.extend((t, piece.page, n) for t, n in zip(texts, counts, strict=True))
    chunks: list[Chunk] = []
    previous = ""
    for text, page, tokens in parts:
        tail = overlap_tail(previous, min(overlap, limit - tokens), tokenizer).strip() if previous else ""
        content = f"{tail} {text}" if tail else text
        count = tokenizer.count(content) if tail else tokens
        if count > limit or (config.max_chars > 0 and len(content) > config.max_chars):
            # the join tokenised longer than its parts, or is past the character cap: no overlap
            content, count = text, tokens
        chunks.append(Chunk(content, page, count, len(chunks)))
        previous = text
    return ChunkSet(chunks, [{} for _ in chunks])


def _heading_segments(sections: Sequence[Section], max_level: int) -> list[tuple[list[str], list[Section]]]:
    """``(heading path, sections)`` per stretch of text under one heading of at most ``max_level``."""
    segments: list[tuple[list[str], list[Section]]] = []
    path: list[tuple[int, str]] = []
    current: list[Section] = []
    for section in sections:
        lines: list[str] = []
        for line in section.text.split("\n"):
            match = _HEADING_LINE.match(line)
            if match and len(match.group(1)) <= max_level:
                if lines:
                    current.append(Section("\n".join(lines), section.page))
                if current:
                    segments.append(([t for _, t in path], current))
                level = len(match.group(1))
                path = [p for p in path if p[0] < level] + [(level, match.group(2))]
                current, lines = [], []
            lines.append(line)
        if lines:
            current.append(Section("\n".join(lines), section.page))
    if current:
        segments.append(([t for _, t in path], current))
    return segments


def _chunk_segments(
    segments: Sequence[tuple[list[str], list[Section]]], config: ChunkConfig, tokenizer: Any
) -> ChunkSet:
    chunks: list[Chunk] = []
    meta: list[dict[str, Any]] = []
    for headings, sections in segments:
        fields = {"headings": headings} if headings else {}
        check_meta(fields, f"chunk {len(chunks)}")  # the same path on each chunk of the segment
        for chunk in chunk_by_tokens(sections, config, tokenizer):
            chunks.append(dataclasses.replace(chunk, position=len(chunks)))
            meta.append(dict(fields))
    return ChunkSet(chunks, meta)


# -- Extractor (worker) ------------------------------------------------------------------------

_WORD = re.compile(r"[^\W\d_]{3,}")
STOPWORDS = frozenset(
    (
        "about", "above", "after", "again", "against", "all", "also", "and", "any", "are", "because",
        "been", "before", "being", "below", "between", "both", "but", "can", "could", "did", "does",
        "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having",
        "her", "here", "hers", "herself", "him", "himself", "his", "how", "into", "its", "itself", "just",
        "more", "most", "much", "must", "not", "now", "off", "once", "only", "other", "our", "ours", "out",
        "over", "own", "same", "she", "should", "some", "such", "than", "that", "the", "their", "theirs",
        "them", "then", "there", "these", "they", "this", "those", "through", "too", "under", "until",
        "very", "was", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will",
        "with", "would", "you", "your", "yours", "one", "two", "may", "might", "many", "per", "via",
        "upon", "within", "without",
    )
)  # fmt: skip


def extract(params: Mapping[str, Any], inputs: Sequence[ChunkSet]) -> ChunkSet:
    """Metadata onto each chunk: its ``top_n`` keywords, or fields matched by a regular expression
    (each named group a field; else ``field`` takes group 1, or the whole match). A chunk's
    metadata over :data:`~ingest.store.MAX_META_BYTES` is refused (:class:`BadDocument`)."""
    merged = merge_chunk_sets(inputs)
    if params["method"] == "keywords":
        field_name = params["field"] or "keywords"
        meta = [
            _bounded({**m, field_name: keywords(c.content, params["top_n"])}, c)
            for c, m in zip(merged.chunks, merged.meta, strict=True)
        ]
    else:
        pattern = compile_regex(params["pattern"], params["ignore_case"])
        meta = [
            _bounded({**m, **regex_fields(pattern, c.content, params["field"] or "match", params["all"])}, c)
            for c, m in zip(merged.chunks, merged.meta, strict=True)
        ]
    return ChunkSet(merged.chunks, meta, merged.vectors)


def _bounded(meta: dict[str, Any], chunk: Chunk) -> dict[str, Any]:
    check_meta(meta, f"chunk {chunk.position}")
    return meta


def keywords(text: str, top_n: int) -> list[str]:
    """The ``top_n`` most frequent words of three letters or more that are not stop words
    (ties: the first seen first)."""
    words = [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]
    counts = Counter(words)
    first = {w: i for i, w in reversed(list(enumerate(words)))}
    return sorted(counts, key=lambda w: (-counts[w], first[w]))[:top_n]


def regex_fields(pattern: Any, text: str, field_name: str, all_matches: bool) -> dict[str, Any]:
    """Fields from ``pattern`` (an RE2 pattern, or any with the ``re`` API) on ``text``."""

    def value(match: Any) -> str:
        found: str = match.group(1) if pattern.groups else match.group(0)
        return found

    if pattern.groupindex:
        matches = list(pattern.finditer(text)) if all_matches else [m for m in [pattern.search(text)] if m]
        if not matches:
            return {}
        if all_matches:
            return {name: [m.group(name) for m in matches] for name in pattern.groupindex}
        return dict(matches[0].groupdict())
    if all_matches:
        found = [value(m) for m in pattern.finditer(text)]
        return {field_name: found} if found else {}
    match = pattern.search(text)
    return {field_name: value(match)} if match else {}


# -- Embedder, Indexer (executor) -------------------------------------------------------------


async def embed(params: Mapping[str, Any], inputs: Sequence[ChunkSet], rt: Runtime) -> ChunkSet:
    """Vectors for every chunk, through the executor's shared embedding service."""
    merged = merge_chunk_sets(inputs)
    vectors = await rt.service.embed([c.content for c in merged.chunks], on_progress=rt.on_progress)
    return ChunkSet(merged.chunks, merged.meta, vectors)


async def index(params: Mapping[str, Any], inputs: Sequence[ChunkSet], rt: Runtime) -> IndexResult:
    """Upsert the chunks into the task's knowledge base (ids from task id + position); a debug
    run writes nothing."""
    import functools

    import trio

    merged = merge_chunk_sets(inputs)
    if rt.target is None:
        return IndexResult([], len(merged.chunks), written=False)
    assert merged.vectors is not None  # the DSL check lets only embedded chunks in
    target = rt.target
    embedder = await rt.service.embedder()
    longest = max((c.token_num for c in merged.chunks), default=0)
    note = oversize_note(ChunkConfig(chunk_token_num=max(longest, 8)), rt.model)
    write = functools.partial(_record_and_store, target, embedder.identity, embedder.dim, note, merged)
    ids = await trio.to_thread.run_sync(write, limiter=rt.db_limiter)
    return IndexResult(ids, len(merged.chunks), written=True)


def _record_and_store(
    target: IndexTarget,
    identity: str,
    dim: int,
    note: str,
    merged: ChunkSet,
) -> list[str]:
    """Blocking (one thread hop): record the knowledge base's model, then upsert the chunks."""
    from ingest.store import record_embedding_model, store_chunks

    record_embedding_model(target.kb_id, identity, dim, note)
    return store_chunks(
        kb_id=target.kb_id,
        doc_id=target.doc_id,
        task_id=target.task_id,
        generation=target.generation,
        attempt=target.attempt,
        chunks=merged.chunks,
        vectors=merged.vectors,  # type: ignore[arg-type]  # set: the caller asserted it (embedded chunks only)
        meta=[m or None for m in merged.meta],
    )


# -- the registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ComponentType:
    """One DSL ``type``: its parameters, what it takes and gives, where and how it runs."""

    name: str
    doc: str
    params: Mapping[str, Param]
    takes: tuple[str, ...]  # kinds of input it accepts; () for the source
    gives: str | None  # the kind it gives; None: the kind it was given
    where: str  # SOURCE | WORKER | EMBED | INDEX
    run: Callable[..., Any] | None = None
    max_inputs: int | None = None  # None: any number (concatenated in order)
    requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # method → required params


_CHUNK_PARAMS = {
    "chunk_token_num": Param(DEFAULT_PARSER_CONFIG["chunk_token_num"], int_between(8, MAX_CHUNK_TOKEN_NUM)),
    "overlap_percent": Param(DEFAULT_PARSER_CONFIG["overlap_percent"], int_between(0, MAX_OVERLAP_PERCENT)),
}

REGISTRY: dict[str, ComponentType] = {
    t.name: t
    for t in (
        ComponentType("File", "the input document's bytes", {}, (), FILE, SOURCE, max_inputs=0),
        ComponentType(
            "Parser",
            "the document's text sections, by its type or a forced format",
            {"format": Param("auto", a_format), "mark_headings": Param(False, a_bool)},
            (FILE,),
            SECTIONS,
            WORKER,
            parse,
            max_inputs=1,
        ),
        ComponentType(
            "Splitter",
            "chunks by tokens, by delimiter or by Markdown headings, with overlap",
            {
                "method": Param("tokens", one_of("tokens", "delimiter", "headings")),
                **_CHUNK_PARAMS,
                "delimiter": Param(None, a_string, methods=("tokens", "delimiter")),
                "max_heading_level": Param(6, int_between(1, 6), methods=("headings",)),
            },
            (SECTIONS,),
            CHUNKS,
            WORKER,
            split,
        ),
        ComponentType(
            "Extractor",
            "keywords, or regular-expression fields, onto each chunk's metadata",
            {
                "method": Param("keywords", one_of("keywords", "regex")),
                "field": Param(None, a_name),
                "top_n": Param(5, int_between(1, 50), methods=("keywords",)),
                "pattern": Param(None, a_regex, methods=("regex",)),
                "ignore_case": Param(False, a_bool, methods=("regex",)),
                "all": Param(False, a_bool, methods=("regex",)),
            },
            (CHUNKS, EMBEDDED),
            None,
            WORKER,
            extract,
            requires={"regex": ("pattern",)},
        ),
        ComponentType(
            "Embedder",
            "a vector for each chunk (the shared embedding service)",
            {},
            (CHUNKS,),
            EMBEDDED,
            EMBED,
            embed,
        ),
        ComponentType(
            "Indexer", "the chunks into the task's knowledge base", {}, (EMBEDDED,), INDEXED, INDEX, index
        ),
    )
}


# -- the worker side ---------------------------------------------------------------------------

Step = tuple[str, str, dict[str, Any], tuple[str, ...]]  # (id, type, params, input ids)


def run_worker_stage(
    steps: Sequence[Step],
    values: dict[str, Any],
    model: str,
    extra: dict[str, str],
    max_chars: int = 0,
    max_chunk_chars: int = DEFAULT_MAX_CHARS,
) -> dict[str, Any]:
    """Runs in a worker process: ``steps`` in order, each on ``values`` of its inputs (given, or
    made by an earlier step), each output held to ``max_chars``; returns every step's output.
    A failure names its component."""
    from ingest.tokens import load_tokenizer
    from ingest.worker import restart_deadline

    out: dict[str, Any] = {}
    for cid, type_name, params, input_ids in steps:
        inputs = [out[i] if i in out else values[i] for i in input_ids]
        restart_deadline()  # each component has a time budget of its own (parse_timeout_s)
        label = f"component {cid!r} ({type_name})"
        try:
            check_held(label, inputs, max_chars)  # what it would take, concatenated
            if type_name == "Parser":
                out[cid] = parse(params, inputs, extra)
            elif type_name == "Splitter":
                out[cid] = split(params, inputs, load_tokenizer(model), max_chunk_chars)
            else:
                out[cid] = REGISTRY[type_name].run(params, inputs)  # type: ignore[misc]  # run is set on every non-source type
            check_held(label, [out[cid]], max_chars)  # and what it made (overlap repeats text)
        except PermanentError as exc:
            if str(exc).startswith(f"component {cid!r}"):
                raise

            raise type(exc)(f"component {cid!r} ({type_name}): {exc}") from None
        except RecursionError:
            raise BadDocument(f"component {cid!r} ({type_name}): nested too deeply to process") from None
        except MemoryError:  # the worker's budget names the cap
            raise MemoryError(f"component {cid!r} ({type_name})") from None
        except Exception as exc:  # noqa: BLE001 - a library's own error on this content, reported as is
            raise BadDocument(
                f"component {cid!r} ({type_name}) failed: {type(exc).__name__}: {exc}"
            ) from None
    return out
