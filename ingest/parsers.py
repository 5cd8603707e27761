"""Document parsers: bytes of a known format → text sections, each with its page.

:func:`parse_document` is pure (bytes in, sections out) and chooses the parser by the
document's type (its extension; an unknown one is read as plain text when the content is
UTF-8 text), then checks the content: a ``.pdf`` without the ``%PDF``
marker, a ``.docx`` that is not a zip, text that is not UTF-8, JSON that does not parse, … each
raise :class:`~ingest.errors.BadDocument` saying what was wrong.

Pages: a PDF task covers pages ``[from_page, to_page)`` counted from 0 (the task row's range);
its sections carry the page number a person reads (``from_page + 1`` onwards). Formats without
pages are one page, numbered 0, that belongs to the task whose range holds page 0.

Parser libraries are imported when first used, so ``import ingest`` stays light; nothing here
imports torch or sentence-transformers (parse worker processes run this module; see
:mod:`ingest.worker`).
"""

from __future__ import annotations

import codecs
import csv
import functools
import importlib
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ingest.errors import BadDocument

NO_PAGE = 0


@dataclass(frozen=True)
class Section:
    """A block of a document's text and the page it is on (0 for formats without pages)."""

    text: str
    page: int = NO_PAGE


Parser = Callable[[bytes, int, int], list[Section]]

# Plain-text formats read as text: source code and configuration files too (RAGFlow does the same).
_TEXT_TYPES = (
    "", "txt", "text", "log", "rst", "py", "js", "ts", "java", "c", "h", "cpp", "hpp", "go", "rs", "rb",
    "sh", "sql", "yaml", "yml", "toml", "ini", "cfg", "conf", "xml", "tex",
)  # fmt: skip

# doc_type (extension, lower case, no dot) → parser name. "" (no extension) reads as text.
DOC_TYPES: dict[str, str] = {
    **dict.fromkeys(_TEXT_TYPES, "text"),
    "md": "markdown",
    "markdown": "markdown",
    "html": "html",
    "htm": "html",
    "xhtml": "html",
    "pdf": "pdf",
    "docx": "docx",
    "csv": "csv",
    "tsv": "csv",
    "json": "json",
    "jsonl": "jsonl",
    "ndjson": "jsonl",
}

# More types by "module:function" (a parser with the signature of PARSERS' values). The specs
# travel with each job to the worker process, which imports them there.
_EXTRA_PARSERS: dict[str, str] = {}


def register_parser(doc_type: str, spec: str) -> None:
    """Parse ``doc_type`` with the function named by ``spec`` (``"module:function"``)."""
    if ":" not in spec:
        raise ValueError(f"parser spec must be module:function, not {spec!r}")
    _EXTRA_PARSERS[doc_type.lower().lstrip(".")] = spec


def unregister_parser(doc_type: str) -> None:
    _EXTRA_PARSERS.pop(doc_type.lower().lstrip("."), None)


def extra_parsers() -> dict[str, str]:
    """The registered extra parser specs (sent along to worker processes)."""
    return dict(_EXTRA_PARSERS)


def supported_types() -> list[str]:
    return sorted(set(DOC_TYPES) | set(_EXTRA_PARSERS))


def parse_document(
    data: bytes,
    doc_type: str,
    from_page: int = 0,
    to_page: int = 100_000_000,
    *,
    extra: dict[str, str] | None = None,
) -> list[Section]:
    """Sections of ``data`` read as ``doc_type``; :class:`BadDocument` when that is impossible."""
    kind = (doc_type or "").lower().lstrip(".")
    specs = {**_EXTRA_PARSERS, **(extra or {})}
    if kind in specs:
        module_name, _, attr = specs[kind].partition(":")
        parser: Parser = getattr(importlib.import_module(module_name), attr)
    elif kind == "tsv":  # the CSV parser, tab-delimited
        parser = functools.partial(_parse_csv, delimiter="\t")
    elif kind in DOC_TYPES:
        parser = PARSERS[DOC_TYPES[kind]]
    else:  # an unknown extension ("GPL-3", "notes.v2"): plain text if the content is text
        try:
            decode_text(data)
        except BadDocument:
            known = ", ".join(t for t in supported_types() if t)
            raise BadDocument(
                f"unsupported document type {kind!r} and not UTF-8 text (supported: {known})"
            ) from None
        parser = PARSERS["text"]
    sections = parser(data, from_page, to_page)
    return [_storable(s) for s in sections if s.text.strip()]


def _storable(section: Section) -> Section:
    """The section with any lone surrogate (JSON's ``"\\ud800"`` decodes to one) replaced by
    U+FFFD: neither the tokenizer nor the database takes one."""
    text = section.text
    if text.isascii():
        return section
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return Section(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), section.page)
    return section


# ---------------------------------------------------------------------------- text formats


def decode_text(data: bytes, what: str = "text") -> str:
    """UTF-8 (or UTF-16/32 with a byte-order mark) → str; anything else is a BadDocument."""
    for bom, codec in (
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if data.startswith(bom):
            try:
                text = data.decode(codec)
            except UnicodeDecodeError as exc:
                raise BadDocument(
                    f"{what} is not valid {codec.upper()}: {exc.reason} at byte {exc.start}"
                ) from None
            break
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadDocument(
                f"{what} is not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                f"({exc.reason}); convert the file to UTF-8"
            ) from None
    if "\x00" in text:
        raise BadDocument(f"{what} contains NUL characters: a binary file, not {what}")
    return text


def _owns_page_zero(from_page: int, to_page: int) -> bool:
    return from_page <= 0 < to_page


def _paragraphs(text: str) -> Iterator[str]:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for block in re.split(r"\n[ \t]*\n", text):
        block = block.strip("\n")
        if block.strip():
            yield block.rstrip()


def _parse_text(data: bytes, from_page: int, to_page: int) -> list[Section]:
    text = decode_text(data)
    if not _owns_page_zero(from_page, to_page):
        return []
    return [Section(p) for p in _paragraphs(text)]


# Linear in the text, whatever it holds: no part may run past the next opener of its own kind
# (``[^\]]*`` from every ``![`` of ``"![" * n`` scanned to the end: quadratic, minutes for a
# megabyte, with the GIL held so the worker's own deadline could not fire). A link's target may
# hold one level of parentheses (``…/Foo_(bar)``).
_MD_IMAGE = re.compile(r"!\[([^\][]*)\]\((?:[^()]|\([^()]*\))*\)")
_MD_LINK = re.compile(r"\[([^\][]+)\]\((?:[^()]|\([^()]*\))*\)")
_MD_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.S)


def _strip_comments(text: str) -> str:
    """``<!-- … -->`` removed, in one pass (an unclosed one, and what follows, stays)."""
    parts: list[str] = []
    at = 0
    while (start := text.find("<!--", at)) >= 0:
        end = text.find("-->", start + 4)
        if end < 0:
            break
        parts.append(text[at:start])
        at = end + 3
    parts.append(text[at:])
    return "".join(parts)


def _parse_markdown(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Markdown keeps its headings and lists (useful context); links keep their text only."""
    text = decode_text(data, "Markdown").replace("\r\n", "\n")
    if not _owns_page_zero(from_page, to_page):
        return []
    text = _MD_FRONT_MATTER.sub("", text)
    text = _strip_comments(text)
    text = _MD_IMAGE.sub(r"\1", text)
    text = _MD_LINK.sub(r"\1", text)
    return [Section(p) for p in _paragraphs(text)]


# ---------------------------------------------------------------------------- HTML

_HTML_DROP = ("script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "head", "nav")
_HTML_BLOCKS = (
    "p", "div", "section", "article", "main", "header", "footer", "aside", "nav", "h1", "h2", "h3",
    "h4", "h5", "h6", "li", "dt", "dd", "tr", "pre", "blockquote", "figcaption", "caption",
    "table", "ul", "ol", "dl", "address", "form", "fieldset", "details", "summary", "title",
)  # fmt: skip


def _parse_html(data: bytes, from_page: int, to_page: int) -> list[Section]:
    from bs4 import BeautifulSoup

    head = data[:4096].lower()
    if b"charset" not in head:
        decode_text(data, "HTML")  # undeclared encodings must be UTF-8
    if not _owns_page_zero(from_page, to_page):
        return []
    soup = BeautifulSoup(data, "lxml")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    lines = (line.strip(" |") for line in _html_text(soup).split("\n"))
    sections = [Section(line) for line in lines if line.strip()]
    if title and title not in {s.text for s in sections[:3]}:
        sections.insert(0, Section(title))
    return sections


def _html_text(root: Any) -> str:
    """The text of a parsed HTML tree in one walk, each node visited once (an explicit stack:
    200,000 nested elements are neither quadratic nor a recursion): dropped elements and
    comments left out, whitespace collapsed outside ``<pre>``, ``<br>`` a line break, a cell
    followed by ``" | "``, a block element on lines of its own."""
    from bs4 import CData, Comment, Declaration, Doctype, ProcessingInstruction, Tag
    from bs4.element import NavigableString

    skipped = (Comment, Declaration, Doctype, ProcessingInstruction)
    kept_in_pre = (NavigableString, CData)  # what get_text() keeps of a string left as parsed
    parts: list[str] = []
    stack: list[tuple[Iterator[Any], str, bool]] = [(iter(root.contents), "", False)]
    while stack:
        children, name, in_pre = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            if name in ("td", "th"):
                parts.append(" | ")
            if name in _HTML_BLOCKS:
                parts.append("\n")
        elif isinstance(child, NavigableString):
            if isinstance(child, skipped):
                continue
            if not in_pre:
                parts.append(re.sub(r"\s+", " ", str(child)))
            elif type(child) in kept_in_pre:
                parts.append(str(child))
        elif isinstance(child, Tag) and child.name not in _HTML_DROP:
            if child.name == "br":
                parts.append("\n")
                continue
            if child.name in _HTML_BLOCKS:
                parts.append("\n")
            stack.append((iter(child.contents), child.name, in_pre or child.name == "pre"))
    return "".join(parts)


# ---------------------------------------------------------------------------- PDF


def _parse_pdf(data: bytes, from_page: int, to_page: int) -> list[Section]:
    import pypdfium2 as pdfium

    if b"%PDF-" not in data[:1024]:
        raise BadDocument("not a PDF: the %PDF- header is missing")
    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        raise BadDocument(f"unreadable PDF: {exc}") from None
    try:
        sections: list[Section] = []
        for index in range(max(0, from_page), min(to_page, len(pdf))):
            page = pdf[index]
            textpage = page.get_textpage()
            try:
                text = textpage.get_text_bounded()
            finally:
                textpage.close()
                page.close()
            text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
            text = re.sub(r"\n{3,}", "\n\n", text).strip()
            if text:
                sections.append(Section(text, index + 1))
        return sections
    except pdfium.PdfiumError as exc:
        raise BadDocument(f"unreadable PDF page: {exc}") from None
    finally:
        pdf.close()


# ---------------------------------------------------------------------------- DOCX


# A DOCX is a zip: what its members may inflate to, checked before python-docx inflates them.
DOCX_MAX_MEMBERS = 10_000
DOCX_MAX_MEMBER_BYTES = 256 << 20  # one member, uncompressed
DOCX_MAX_TOTAL_BYTES = 512 << 20  # all members together, uncompressed
DOCX_MAX_RATIO = 200  # uncompressed / compressed, for a member past DOCX_RATIO_FROM_BYTES
DOCX_RATIO_FROM_BYTES = 1 << 20
_READ_BLOCK = 1 << 20


def check_zip_members(data: bytes, what: str = "DOCX") -> None:
    """Refuse a zip whose members would inflate past the budget: each member's declared size
    and ratio, then its actual size, read as a stream in blocks and counted (a member whose data
    inflates past what its header declares is refused, not trusted)."""
    import zipfile

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise BadDocument(f"unreadable {what}: {type(exc).__name__}: {exc}") from None
    if len(members) > DOCX_MAX_MEMBERS:
        raise BadDocument(f"{what} has {len(members)} zip members (at most {DOCX_MAX_MEMBERS})")
    declared = 0
    for info in members:
        declared += info.file_size
        if info.file_size > DOCX_MAX_MEMBER_BYTES or declared > DOCX_MAX_TOTAL_BYTES:
            raise BadDocument(
                f"{what} member {info.filename!r} inflates to {info.file_size} bytes ({declared} in all; "
                f"at most {DOCX_MAX_MEMBER_BYTES} per member, {DOCX_MAX_TOTAL_BYTES} in all): a zip bomb?"
            )
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > DOCX_RATIO_FROM_BYTES and ratio > DOCX_MAX_RATIO:
            raise BadDocument(
                f"{what} member {info.filename!r} inflates {ratio:.0f} times ({info.compress_size} → "
                f"{info.file_size} bytes; at most {DOCX_MAX_RATIO}): a zip bomb?"
            )
    for info in members:
        _read_counted(archive, info, what)


def _read_counted(archive: Any, info: Any, what: str) -> None:
    import zipfile
    import zlib

    actual = 0
    try:
        with archive.open(info) as member:
            while block := member.read(_READ_BLOCK):
                actual += len(block)
                if actual > info.file_size:
                    break
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        OSError,
        ValueError,
        NotImplementedError,
        RuntimeError,
    ) as exc:
        raise BadDocument(
            f"unreadable {what} member {info.filename!r}: {type(exc).__name__}: {exc}"
        ) from None
    if actual != info.file_size:
        raise BadDocument(
            f"{what} member {info.filename!r} holds {actual} bytes, not the {info.file_size} its header declares"
        )


def _parse_docx(data: bytes, from_page: int, to_page: int) -> list[Section]:
    import zipfile
    import zlib

    import docx
    from docx.table import Table

    if not data.startswith(b"PK\x03\x04"):
        raise BadDocument("not a DOCX: not a zip archive (a .doc or another format renamed?)")
    if not _owns_page_zero(from_page, to_page):
        return []
    check_zip_members(data)
    from lxml.etree import LxmlError

    try:
        document = docx.Document(io.BytesIO(data))
    except (zipfile.BadZipFile, zlib.error, KeyError, ValueError, NotImplementedError, LxmlError) as exc:
        raise BadDocument(f"unreadable DOCX: {type(exc).__name__}: {exc}") from None
    sections: list[Section] = []
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            rows = []
            for row in block.rows:
                cells: list[str] = []
                for cell in row.cells:  # merged cells repeat: keep each once per row
                    text = cell.text.strip()
                    if text and (not cells or cells[-1] != text):
                        cells.append(text)
                if cells:
                    rows.append(" | ".join(cells))
            if rows:
                sections.append(Section("\n".join(rows)))
        elif block.text.strip():
            sections.append(Section(block.text.strip()))
    return sections


# ---------------------------------------------------------------------------- CSV / JSON


def _parse_csv(data: bytes, from_page: int, to_page: int, delimiter: str | None = None) -> list[Section]:
    """Each row a section of ``header: value`` lines (empty cells left out)."""
    text = decode_text(data, "CSV")
    if not _owns_page_zero(from_page, to_page):
        return []
    if delimiter is None:
        try:
            delimiter = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|").delimiter
        except csv.Error:
            delimiter = ","
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        rows = [row for row in reader if any(cell.strip() for cell in row)]
    except csv.Error as exc:
        raise BadDocument(f"unreadable CSV at line {reader.line_num}: {exc}") from None
    if not rows:
        return []
    header = [h.strip() or f"column {i + 1}" for i, h in enumerate(rows[0])]
    sections = []
    for row in rows[1:]:
        lines = [
            f"{header[i] if i < len(header) else f'column {i + 1}'}: {cell.strip()}"
            for i, cell in enumerate(row)
            if cell.strip()
        ]
        if lines:
            sections.append(Section("\n".join(lines)))
    return sections


def _flatten(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, dict):
        if not value and path:
            yield f"{path}: {{}}"
        for key, item in value.items():
            yield from _flatten(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        if not value and path:
            yield f"{path}: []"
        for i, item in enumerate(value):
            yield from _flatten(item, f"{path}[{i}]")
    else:
        text = (
            "null"
            if value is None
            else ("true" if value is True else "false" if value is False else str(value))
        )
        yield f"{path}: {text}" if path else text


def _json_sections(value: Any) -> list[Section]:
    """A top-level list or object: one section per element or key, lines ``path: value``."""
    if isinstance(value, list):  # records: paths inside each record
        parts = [("", item) for item in value]
    elif isinstance(value, dict):  # each key, and each element of a key's list
        parts = []
        for key, item in value.items():
            if isinstance(item, list) and item:
                parts.extend((f"{key}[{i}]", element) for i, element in enumerate(item))
            else:
                parts.append((str(key), item))
    else:
        parts = [("", value)]
    sections = []
    for path, item in parts:
        lines = list(_flatten(item, path))
        if lines:
            sections.append(Section("\n".join(lines)))
    return sections


def _parse_json(data: bytes, from_page: int, to_page: int) -> list[Section]:
    text = decode_text(data, "JSON")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadDocument(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # a number of more digits than Python converts
        raise BadDocument(f"invalid JSON: {exc}") from None
    if not _owns_page_zero(from_page, to_page):
        return []
    return _json_sections(value)


def _parse_jsonl(data: bytes, from_page: int, to_page: int) -> list[Section]:
    text = decode_text(data, "JSON Lines")
    records = []
    # Records end at "\n" only (and "\r\n"): splitlines() would also split at U+2028, U+2029,
    # \x85 and others, which JSON allows unescaped inside strings.
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise BadDocument(f"invalid JSON Lines: {exc.msg} on line {lineno}") from None
            except ValueError as exc:
                raise BadDocument(f"invalid JSON Lines: {exc} on line {lineno}") from None
    if not _owns_page_zero(from_page, to_page):
        return []
    return _json_sections(records)


PARSERS: dict[str, Parser] = {
    "text": _parse_text,
    "markdown": _parse_markdown,
    "html": _parse_html,
    "pdf": _parse_pdf,
    "docx": _parse_docx,
    "csv": _parse_csv,
    "json": _parse_json,
    "jsonl": _parse_jsonl,
}
