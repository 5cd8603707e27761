"""A corpus of malformed documents, made by a seeded generator at test time (the same seed, the
same files): for each type (pdf, docx, html, md, txt, csv, json), its seed document mutated
(truncated, bytes flipped, junk inserted, a slice cut or repeated, re-encoded) or replaced by a
hostile structure of its own at a small scale (a zip bomb, deep nesting, a huge word, …), and
now and then bytes of another type under its name. No file is larger than ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import io
import random
import zipfile
from collections.abc import Callable, Iterator

from tests.fuzz.strategies import KINDS, seed_documents

MAX_FILE_BYTES = 256 << 10


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data))]


def _flip(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 32)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf)


def _insert(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.randbytes(rng.randint(1, 512)) + data[at:]


def _cut(rng: random.Random, data: bytes) -> bytes:
    a = rng.randrange(len(data))
    return data[:a] + data[a + rng.randint(1, max(1, len(data) // 2)) :]


def _repeat(rng: random.Random, data: bytes) -> bytes:
    a = rng.randrange(len(data))
    piece = data[a : a + rng.randint(1, 64)]
    return data[:a] + piece * rng.randint(2, 200) + data[a:]


def _random(rng: random.Random, data: bytes) -> bytes:
    return rng.randbytes(rng.randint(1, 4096))


def _reencode(rng: random.Random, data: bytes) -> bytes:
    text = data.decode("utf-8", "replace")
    codec = rng.choice(["utf-16", "utf-16-le", "latin-1", "cp1252", "utf-32"])
    encoded = text.encode(codec, "replace")
    return encoded if rng.random() < 0.7 else encoded + b"\x00\xff\xfe"


MUTATIONS: list[Callable[[random.Random, bytes], bytes]] = [
    _truncate, _flip, _insert, _cut, _repeat, _random, _reencode,
]  # fmt: skip


def _zip(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def _docx_members() -> dict[str, bytes]:
    original = zipfile.ZipFile(io.BytesIO(seed_documents()["docx"]))
    return {i.filename: original.read(i) for i in original.infolist()}


def _structural(kind: str, rng: random.Random) -> bytes:
    """A hostile structure of ``kind``'s own, small enough for a test run."""
    n = rng.randint(1, 6)
    if kind == "docx":
        members = _docx_members()
        if n == 1:  # a small zip bomb: 8 MB of XML in a few KB
            members["word/document.xml"] = b"<w:p/>" * (8 << 20 >> 3)
        elif n == 2:
            members.pop("word/document.xml")
        elif n == 3:
            members["word/document.xml"] = _flip(rng, members["word/document.xml"])
        elif n == 4:
            members["[Content_Types].xml"] = b"<Types"
        elif n == 5:
            return _zip({"word/document.xml": seed_documents()["docx"]})
        else:
            return _zip(members, zipfile.ZIP_STORED)[: rng.randint(30, 2000)]
        return _zip(members)
    if kind == "pdf":
        body = [
            b"1 0 obj << /Type /Pages /Count 99999999 /Kids [] >> endobj",
            b"[" * 20_000,
            b"<< /Length 999999999 >> stream\n" + rng.randbytes(512),
            b"trailer << /Root 1 0 R >> startxref 99999 %%EOF",
            b"1 0 obj " + b"<<" * 5000,
            b"xref\n0 9999999\n",
        ][n - 1]
        return b"%PDF-1.7\n" + body
    if kind == "html":
        depth = rng.randint(1_000, 20_000)
        tag = rng.choice([b"div", b"p", b"td", b"h2", b"li", b"pre"])
        return [
            b"<html><body>" + (b"<" + tag + b">x") * depth,
            b"<p " + b"a" * 100_000 + b'="x">',
            b"<script>" * 5000,
            b"<!--" + b"-" * 50_000,
            b"<meta charset=utf-7><p>+ADw-script+AD4-",
            rng.randbytes(4000).replace(b"<", b"") + b"<html>",
        ][n - 1]
    if kind == "md":
        return [
            b"[" * 20_000,
            b"!" * 10_000 + b"[](" * 5000,
            b"> " * 20_000 + b"quote",
            b"- " * 10_000 + b"item",
            b"#" * 50_000,
            b"word" * 60_000,  # one 240,000-character word
        ][n - 1]
    if kind == "txt":
        return [
            b"x" * 200_000,  # one huge "word"
            b"\x00" * 100,
            b"\xff\xfe\x00\xd8",
            "\u202e\u200b\ufeff".encode() * 20_000,
            b"line\r" * 3_000,
            b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8
        ][n - 1]
    if kind == "csv":
        return [
            b'"unclosed,quote\n' * 100,
            b",".join(b"c%d" % i for i in range(20_000)) + b"\n1,2,3",
            b"a\x00b,c\n",
            b"\n" * 50_000,
            b"a;b|c\td\n" * 300,
            b'"' * 100_001,
        ][n - 1]
    return [  # json
        b"[" * 100_000,
        b'{"a":' * 50_000,
        b"1" * 100_000,
        b'{"' + b"k" * 100_000 + b'": 1}',
        b'["\\ud800"]',
        b'{"a": NaN, "b": Infinity}',
    ][n - 1]


def generate(count: int, seed: int = 17) -> Iterator[tuple[str, bytes, str]]:
    """``count`` (name, bytes, how it was made) triples, the same for the same seed."""
    rng = random.Random(seed)
    seeds = seed_documents()
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        roll = rng.random()
        if roll < 0.25:
            how, data = "structural", _structural(kind, rng)
        elif roll < 0.30:
            other = rng.choice(KINDS)
            how, data = f"a {other} named .{kind}", seeds[other]
        else:
            mutation = rng.choice(MUTATIONS)
            how, data = mutation.__name__.strip("_"), mutation(rng, seeds[kind])
            if rng.random() < 0.2:  # twice mutated
                data = rng.choice(MUTATIONS)(rng, data or seeds[kind])
        yield f"{kind}-{i:05d}.{kind}", data[:MAX_FILE_BYTES], how
