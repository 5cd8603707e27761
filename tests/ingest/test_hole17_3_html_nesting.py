"""Issue 17 #3: deeply nested HTML. 200,000 nested ``<div>``s ran until the task timeout: the
HTML block pass did work per element proportional to its depth (``find_parent``, ``append``
walking to the last descendant). It is one linear walk now: that document parses in seconds,
inside the worker's time budget, and ordinary HTML gives the same sections as before."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.parsers import Section, parse_document
from ingest.worker import WorkerBudget, parse_in_worker

DEPTH = 200_000
# The worker's budget for that document: linear work takes 6 s on one machine of this project's
# kind, 15 s on a slower one and about twice that when coverage traces the worker; the quadratic
# walk it replaced did not end within the task timeout (hours). The growth itself is held
# below, by CPU time at two depths.
BUDGET_S = 120


def _nested(depth: int, tag: bytes = b"div") -> bytes:
    return b"<html><body>" + (b"<" + tag + b">x") * depth + (b"</" + tag + b">") * depth + b"</body></html>"


async def test_two_hundred_thousand_nested_divs_parse_within_the_budget():
    began = time.monotonic()
    sections = await parse_in_worker(_nested(DEPTH), "html", budget=WorkerBudget(timeout_s=BUDGET_S))
    elapsed = time.monotonic() - began
    assert sections and {s.text for s in sections} == {"x"}
    assert elapsed < BUDGET_S  # before: still running at the task timeout


def _cpu_s(depth: int) -> float:
    """This process's CPU seconds for one parse, the best of three: other processes on a shared
    machine do not count, and one slow run (a collection, a context switch) does not decide."""
    runs = []
    for _ in range(3):
        began = time.process_time()
        parse_document(_nested(depth), "html")
        runs.append(time.process_time() - began)
    return min(runs)


def test_the_work_grows_linearly_with_the_depth():
    small, large = _cpu_s(10_000), _cpu_s(40_000)
    assert large < 8 * small + 0.5  # 4 times the depth: about 4 times the work, not 16


# -- the same sections as the block pass gave before (its code, kept here as the reference) ---

_DROP = ("script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "head", "nav")
_BLOCKS = (
    "p", "div", "section", "article", "main", "header", "footer", "aside", "nav", "h1", "h2", "h3",
    "h4", "h5", "h6", "li", "dt", "dd", "tr", "pre", "blockquote", "figcaption", "caption",
    "table", "ul", "ol", "dl", "address", "form", "fieldset", "details", "summary", "title",
)  # fmt: skip


def _reference(data: bytes) -> list[Section]:
    from bs4 import BeautifulSoup, Comment, Declaration, Doctype, NavigableString, ProcessingInstruction

    soup = BeautifulSoup(data, "lxml")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup.find_all(_DROP):
        tag.decompose()
    for node in soup.find_all(
        string=lambda s: isinstance(s, (Comment, Declaration, Doctype, ProcessingInstruction))
    ):
        node.extract()
    for string in soup.find_all(string=True):
        if string.find_parent("pre") is None and isinstance(string, NavigableString):
            string.replace_with(re.sub(r"\s+", " ", str(string)))
    for br in soup.find_all("br"):
        br.replace_with("\n")
    for cell in soup.find_all(("td", "th")):
        cell.append(" | ")
    for block in soup.find_all(_BLOCKS):
        block.insert_before("\n")
        block.append("\n")
    lines = (line.strip(" |") for line in soup.get_text().split("\n"))
    sections = [Section(line) for line in lines if line.strip()]
    if title and title not in {s.text for s in sections[:3]}:
        sections.insert(0, Section(title))
    return [s for s in sections if s.text.strip()]


TAGS = [
    "div",
    "p",
    "span",
    "b",
    "pre",
    "td",
    "th",
    "tr",
    "table",
    "br",
    "li",
    "ul",
    "h2",
    "script",
    "rt",
    "a",
]
_text = st.text(alphabet=st.sampled_from(list("ab \n\t|<>&")), max_size=8)


@st.composite
def html_fragments(draw, depth=0):
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 3 if depth < 4 else 1))
        if kind <= 1:
            parts.append(draw(_text).replace("<", "&lt;").replace(">", "&gt;"))
        elif kind == 2:
            parts.append(f"<!--{draw(_text).replace('-', '')}-->")
        else:
            tag = draw(st.sampled_from(TAGS))
            parts.append(f"<{tag}>{draw(html_fragments(depth + 1))}</{tag}>")
    return "".join(parts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=html_fragments(), title=st.one_of(st.none(), _text))
def test_ordinary_html_gives_the_same_sections_as_the_quadratic_pass(body, title):
    head = f"<head><title>{title.replace('<', '')}</title></head>" if title is not None else ""
    data = f"<html>{head}<body>{body}</body></html>".encode()
    assert parse_document(data, "html") == _reference(data)


@pytest.mark.parametrize(
    "html",
    [
        b"<html><head><title>T</title></head><body><p>One <b>two</b></p><pre>  keep\n  this </pre></body></html>",
        b"<table><tr><td>a</td><td>b</td></tr><tr><th>c</th></tr></table><br>tail<!-- gone -->",
        b"<!DOCTYPE html><div><?pi x?>x<script>no</script><nav>no</nav>y</div>",
    ],
)
def test_examples_give_the_same_sections_as_before(html):
    assert parse_document(html, "html") == _reference(html)


async def test_nested_headings_marked_for_a_dataflow_parse_within_the_budget():
    from ingest.dataflow.components import FileInput, parse
    from ingest.worker import run_in_worker

    params = {"format": "auto", "mark_headings": True}
    file = FileInput("deep.html", "html", _nested(20_000, b"h2"))
    sections = await run_in_worker(parse, params, [file], {}, budget=WorkerBudget(timeout_s=20))
    assert sections[0].text.startswith("## x x x")  # the outermost heading holds the text of all


def test_marked_headings_are_the_same_as_before():
    from ingest.dataflow.components import _mark_html_headings

    html = b"<h1>A <b>b</b><h2>inner</h2></h1><p>t</p><h3>c</h3><div><h4></h4></div>"
    assert _mark_html_headings(html) == (
        b"<html><body><h1># A b inner</h1><p>t</p><h3>### c</h3><div><h4></h4></div></body></html>"
    )
