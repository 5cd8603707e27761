"""Hypothesis strategies for what arrives from outside: stream messages, dataflow DSL documents
and file bytes per type (pdf, docx, html, md, txt, csv, json).

Each strategy mixes the well formed with the malformed: a value near the contract is what
finds the holes a purely random one misses.
"""

from __future__ import annotations

import io
import json
import zipfile
from functools import cache
from typing import Any

from hypothesis import strategies as st

from ingest.dataflow.components import REGISTRY

KINDS = ("pdf", "docx", "html", "md", "txt", "csv", "json")

# -- stream messages -------------------------------------------------------------------------

_ids = st.one_of(
    st.text(alphabet="0123456789abcdef", min_size=1, max_size=40),
    st.just(""),
    st.text(max_size=80),
    st.integers(),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
)
_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def message_objects(draw: Any) -> dict[str, Any]:
    """A JSON object near the stream message's contract (each field possibly wrong)."""
    message: dict[str, Any] = {}
    for name, values in (
        ("id", _ids),
        ("doc_id", _ids),
        ("task_type", st.one_of(st.sampled_from(["parse", "dataflow", "memory", "", "nope"]), _json_values)),
        ("priority", st.one_of(st.sampled_from([0, 1, 2, -1, True, "1", 1.5]), _json_values)),
        ("tenant_id", st.one_of(st.sampled_from(["default", "acme", "x" * 100, "a b"]), _json_values)),
        ("dataflow_id", _ids),
        ("memory_id", _ids),
        ("message_dict", _json_values),
    ):
        if draw(st.booleans()):
            message[name] = draw(values)
    if draw(st.booleans()):
        message.update(draw(st.dictionaries(st.text(max_size=10), _json_values, max_size=3)))
    return message


@st.composite
def stream_fields(draw: Any) -> dict[bytes, bytes]:
    """The fields of one stream entry: usually ``message`` holding JSON, sometimes anything."""
    choice = draw(st.integers(0, 9))
    if choice <= 5:
        body = json.dumps(draw(message_objects()), default=str).encode()
    elif choice == 6:
        body = json.dumps(draw(_json_values)).encode()
    elif choice == 7:
        body = draw(st.binary(max_size=200))
    else:
        body = draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    field = b"message" if draw(st.integers(0, 9)) else draw(st.binary(min_size=1, max_size=10))
    return {field: body}


# -- DSL documents ---------------------------------------------------------------------------

_TYPES = [*REGISTRY, "Chunker", "", "file"]
_PATTERNS = [r"\d+", r"(a+)+$", r"(?P<year>\d{4})", r"(a)\1", r"(?<=x)y", "[", "a" * 1001, r"\bword\b"]


def _param_values(name: str) -> Any:
    known = {
        "method": st.sampled_from(["tokens", "delimiter", "headings", "keywords", "regex", "other"]),
        "chunk_token_num": st.one_of(st.integers(-10, 10_000), st.just("192")),
        "overlap_percent": st.integers(-5, 100),
        "pattern": st.one_of(st.sampled_from(_PATTERNS), st.text(max_size=30)),
        "format": st.sampled_from(["auto", "pdf", "md", "docx", "exe", ""]),
    }
    return known.get(name, _json_values)


@st.composite
def dsl_documents(draw: Any) -> Any:
    """A DSL: a chain File → Parser → Splitter(s) → Extractor(s) → Embedder → Indexer with
    fan-in, then mutated (a component's type, parameters or inputs changed, one removed, …),
    or something that is not a DSL at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_json_values)
    width = draw(st.integers(1, 12))
    components: list[dict[str, Any]] = [
        {"id": "file", "type": "File"},
        {"id": "parse", "type": "Parser", "inputs": ["file"]},
    ]
    splits = [f"split{i}" for i in range(width)]
    components += [{"id": s, "type": "Splitter", "inputs": ["parse"]} for s in splits]
    components.append({"id": "extract", "type": "Extractor", "inputs": splits})
    components += [
        {"id": "embed", "type": "Embedder", "inputs": ["extract"]},
        {"id": "index", "type": "Indexer", "inputs": ["embed"]},
    ]
    for _ in range(draw(st.integers(0, 4))):
        target = draw(st.sampled_from(components))
        what = draw(st.integers(0, 5))
        if what == 0:
            target["type"] = draw(st.sampled_from(_TYPES))
        elif what == 1:
            kind = REGISTRY.get(str(target.get("type")))
            names = [*(kind.params if kind else ()), "bogus"]
            name = draw(st.sampled_from(names))
            target.setdefault("params", {})[name] = draw(_param_values(name))
        elif what == 2:
            target["inputs"] = draw(
                st.lists(st.sampled_from([c["id"] for c in components] + ["nobody"]), max_size=4)
            )
        elif what == 3 and len(components) > 1:
            components.remove(target)
        elif what == 4:
            target["id"] = draw(st.sampled_from(["", "a b", "x" * 70, "parse", 3]))
        else:
            target[draw(st.sampled_from(["extra", "inputs", "params"]))] = draw(_json_values)
    return {"components": components, **({"description": draw(_json_values)} if draw(st.booleans()) else {})}


# -- file bytes per type ---------------------------------------------------------------------


@cache
def seed_documents() -> dict[str, bytes]:
    """One small valid document per type (the PDF and DOCX written by their libraries)."""
    from tests.fixtures_docs import docx_bytes, pdf_bytes

    return {
        "pdf": pdf_bytes([["Page one: bees and hives."], ["Page two: honey and wax."]]),
        "docx": docx_bytes(
            [("heading", "Bees"), ("p", "The queen lays eggs."), ("table", [["a", "b"], ["c", "d"]])]
        ),
        "html": b"<html><head><title>Bees</title></head><body><h1>Bees</h1><p>Queen <b>and</b> drones.</p>"
        b"<table><tr><td>a</td><td>b</td></tr></table><pre> keep  this </pre></body></html>",
        "md": b"---\ntitle: x\n---\n# Bees\n\nThe [queen](http://x) lays eggs.\n\n- one\n- two\n",
        "txt": "Bees make honey.\n\nThe queen lays eggs; drones do not. Café.\n".encode(),
        "csv": b"name,role\nqueen,lays eggs\ndrone,mates\n",
        "json": b'{"hive": {"queen": 1, "drones": [1, 2, 3]}, "note": "honey"}',
    }


def _mutate(draw: Any, data: bytes) -> bytes:
    what = draw(st.integers(0, 5))
    if what == 0 or not data:
        return data
    if what == 1:
        return data[: draw(st.integers(0, len(data)))]
    if what == 2:
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(max_size=64)) + data[at:]
    if what == 3:
        buf = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
        return bytes(buf)
    if what == 4:
        at = draw(st.integers(0, len(data)))
        return data[:at] + data[at:][draw(st.integers(0, len(data) - at)) :]
    return draw(st.binary(max_size=512))


def _docx_from_members(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


@st.composite
def file_bytes(draw: Any, kind: str) -> bytes:
    """Bytes that claim to be a ``kind`` document: its seed mutated, a structure of its own
    that is wrong in some way, or bytes of another type."""
    seeds = seed_documents()
    choice = draw(st.integers(0, 9))
    if choice <= 4:
        return _mutate(draw, seeds[kind])
    if choice == 5:
        return seeds[draw(st.sampled_from(KINDS))]
    if kind == "docx":
        original = zipfile.ZipFile(io.BytesIO(seeds["docx"]))
        members = {i.filename: original.read(i) for i in original.infolist()}
        name = draw(st.sampled_from(sorted(members)))
        members[name] = _mutate(draw, members[name]) if draw(st.booleans()) else b""
        if draw(st.booleans()):
            members.pop(draw(st.sampled_from(sorted(members))))
        return _docx_from_members(members)
    if kind == "json":
        return (
            json.dumps(draw(_json_values)).encode()
            if draw(st.booleans())
            else b"[" * draw(st.integers(1, 3000))
        )
    if kind == "html":
        depth = draw(st.integers(1, 500))
        tag = draw(st.sampled_from(["div", "p", "pre", "td", "h2", "script", "b"])).encode()
        return (b"<" + tag + b">x") * depth + draw(st.binary(max_size=32))
    if kind == "csv":
        rows = draw(st.lists(st.lists(st.text(max_size=6), max_size=6), max_size=8))
        quote = b'"' if draw(st.booleans()) else b""
        return b"\n".join(b",".join(c.encode() for c in r) for r in rows) + quote
    if kind == "pdf":
        return b"%PDF-1." + draw(st.binary(max_size=400))
    return draw(st.text(max_size=300)).encode("utf-8", "surrogatepass") + draw(st.binary(max_size=8))
