"""Each format parses into sections; PDF page ranges are respected; content that is not what
its extension says is a BadDocument that says what was wrong."""

from __future__ import annotations

import json
import os
import time

import pytest

from ingest.errors import BadDocument
from ingest.parsers import NO_PAGE, parse_document, register_parser, supported_types, unregister_parser
from scripts.make_samples import docx_bytes, pdf_bytes

PAGES = [[f"Page {n} talks about topic number {n}.", f"A second paragraph on page {n}."] for n in range(1, 6)]


def texts(sections):
    return [s.text for s in sections]


def test_plain_text_is_split_into_paragraphs():
    data = b"First paragraph\nstill first.\r\n\r\nSecond paragraph.\n\n\n"
    sections = parse_document(data, "txt")
    assert texts(sections) == ["First paragraph\nstill first.", "Second paragraph."]
    assert {s.page for s in sections} == {NO_PAGE}


def test_a_file_without_extension_reads_as_text():
    assert texts(parse_document(b"GNU GENERAL PUBLIC LICENSE", "")) == ["GNU GENERAL PUBLIC LICENSE"]


def test_an_unknown_extension_with_text_content_reads_as_text():
    assert texts(parse_document(b"GNU LESSER GENERAL PUBLIC LICENSE\n", "1")) == [
        "GNU LESSER GENERAL PUBLIC LICENSE"
    ]


def test_markdown_keeps_headings_and_link_text_drops_comments_and_front_matter():
    data = b"---\ntitle: x\n---\n# Bees\n\nSee [the hive](http://x/hive) <!-- hidden -->now.\n"
    assert texts(parse_document(data, "md")) == ["# Bees", "See the hive now."]


def test_markdown_link_targets_may_hold_parentheses_and_an_unclosed_comment_stays():
    data = b"A [page](http://w/Foo_(bar)) and ![pic](p.png).\n\nend <!-- not closed"
    assert texts(parse_document(data, "md")) == ["A page and pic.", "end <!-- not closed"]


@pytest.mark.parametrize("opener", [b"<!--", b"![", b"[a](", b"![a]("])
def test_markdown_of_a_megabyte_of_openers_parses_in_linear_time(opener):
    """Each opener never closed: the old patterns scanned from every one to the end of the text
    (quadratic: about 8 s for 40 KB, past the 900 s parse timeout for a megabyte, with the GIL
    held so the worker's own deadline could not fire)."""
    data = opener * (1_000_000 // len(opener))
    began = time.process_time()
    parse_document(data, "md")
    assert time.process_time() - began < 5.0  # linear: about 0.1 s here; quadratic: hours


def test_html_drops_script_style_and_navigation_and_keeps_blocks_apart():
    data = b"""<html><head><title>Volcanoes</title><style>p{color:red}</style>
    <script>var tracking = 1;</script></head><body><nav>Home | About</nav>
    <h1>Kinds</h1><p>Shield   volcanoes are
    <b>broad</b>.</p><table><tr><td>VEI</td><td>5</td></tr></table><!-- c --></body></html>"""
    sections = texts(parse_document(data, "html"))
    assert sections == ["Volcanoes", "Kinds", "Shield volcanoes are broad.", "VEI | 5"]
    assert not any("tracking" in s or "color" in s or "Home" in s for s in sections)


def test_html_with_a_declared_charset_is_decoded_by_it():
    data = '<meta charset="iso-8859-1"><p>Café crème</p>'.encode("latin-1")
    assert texts(parse_document(data, "html")) == ["Café crème"]


def test_pdf_pages_are_numbered_from_one():
    sections = parse_document(pdf_bytes(PAGES), "pdf")
    assert [s.page for s in sections] == [1, 2, 3, 4, 5]
    assert "Page 3 talks about topic number 3." in sections[2].text


def test_pdf_page_range_is_respected():
    sections = parse_document(pdf_bytes(PAGES), "pdf", 1, 3)  # the task's [from_page, to_page)
    assert [s.page for s in sections] == [2, 3]
    assert "Page 2" in sections[0].text and "Page 3" in sections[1].text
    assert parse_document(pdf_bytes(PAGES), "pdf", 5, 12) == []


def test_docx_paragraphs_and_tables_in_document_order():
    data = docx_bytes(
        [
            ("heading", "Knots"),
            ("p", "The bowline makes a fixed loop."),
            ("table", [["knot", "use"], ["sheet bend", "joins ropes"]]),
        ]
    )
    assert texts(parse_document(data, "docx")) == [
        "Knots",
        "The bowline makes a fixed loop.",
        "knot | use\nsheet bend | joins ropes",
    ]


def test_csv_rows_become_header_value_lines():
    data = b'year,event\n1825,"Stockton and Darlington, England"\n\n1830,Liverpool\n'
    assert texts(parse_document(data, "csv")) == [
        "year: 1825\nevent: Stockton and Darlington, England",
        "year: 1830\nevent: Liverpool",
    ]


def test_tsv_uses_tabs():
    assert texts(parse_document(b"a\tb\n1\t2\n", "tsv")) == ["a: 1\nb: 2"]


def test_json_is_flattened_to_path_value_lines():
    data = json.dumps(
        {"title": "Knots", "knots": [{"name": "Bowline", "tags": ["loop"], "ok": True}]}
    ).encode()
    assert texts(parse_document(data, "json")) == [
        "title: Knots",
        "knots[0].name: Bowline\nknots[0].tags[0]: loop\nknots[0].ok: true",
    ]


def test_json_lines_are_records():
    assert texts(parse_document(b'{"a": 1}\n{"a": null}\n', "jsonl")) == ["a: 1", "a: null"]


def test_json_lines_split_records_at_newlines_only():
    # U+2028, U+2029 and \x85 are legal unescaped inside a JSON string: not record ends
    data = '{"a": "one\u2028two"}\r\n{"a": "three\u2029four\x85five"}\n\n'.encode()
    assert texts(parse_document(data, "jsonl")) == ["a: one\u2028two", "a: three\u2029four\x85five"]
    with pytest.raises(BadDocument, match="on line 3"):
        parse_document(b'{"a": 1}\n\n{oops}\n', "jsonl")


def test_formats_without_pages_belong_to_the_task_holding_page_zero():
    assert parse_document(b"text", "txt", 12, 24) == []


@pytest.mark.parametrize(
    ("data", "doc_type", "reason"),
    [
        (os.urandom(2048), "pdf", "not a PDF: the %PDF- header is missing"),
        (b"%PDF-1.7\n" + os.urandom(2048), "pdf", "unreadable PDF"),
        (pdf_bytes(PAGES)[:300], "pdf", "unreadable PDF"),
        (os.urandom(2048), "docx", "not a DOCX: not a zip archive"),
        (b"PK\x03\x04" + os.urandom(512), "docx", "unreadable DOCX"),
        (b'{"a": [1, 2', "json", "invalid JSON: .* at line 1 column 12"),
        (b'{"a": 1}\n{oops}\n', "jsonl", "invalid JSON Lines: .* on line 2"),
        (b"caf\xe9 au lait", "txt", "not valid UTF-8: byte 0xe9 at offset 3"),
        (b"abc\x00\x00\x00def", "md", "NUL characters"),
        (b"\xff\xfe\x00", "txt", "not valid UTF-16"),
        (b'a,b\n"unterminated\n', "csv", "unreadable CSV"),
        (os.urandom(512), "html", "HTML is not valid UTF-8"),
        (b"MZ\x90\x00\x03\x00\xff", "exe", "unsupported document type 'exe' and not UTF-8 text"),
    ],
)
def test_content_that_is_not_its_format_is_a_bad_document_saying_why(data, doc_type, reason):
    with pytest.raises(BadDocument, match=reason):
        parse_document(data, doc_type)


def test_supported_types_cover_the_issue_formats():
    assert {"txt", "md", "html", "pdf", "docx", "csv", "json"} <= set(supported_types())


def test_a_parser_registered_for_tsv_is_the_one_used():
    register_parser("tsv", "tests.ingest.worker_probes:fail")  # it raises: it was the one called
    try:
        with pytest.raises(ZeroDivisionError):
            parse_document(b"a\tb\n1\t2\n", "tsv")
    finally:
        unregister_parser("tsv")
    assert texts(parse_document(b"a\tb\n1\t2\n", "tsv"))  # the built-in one again
