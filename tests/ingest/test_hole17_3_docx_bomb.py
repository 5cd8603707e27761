"""Issue 17 #3: DOCX zip bombs. A DOCX is a zip: its members' declared sizes, their actual
sizes (read as a stream with a byte budget) and their compression ratios are checked before
python-docx inflates anything, so ~40 MB of XML in a ~40 KB zip is refused in well under a
second with a named reason, and a member whose data inflates past its declared size is
refused too. Every error crosses the worker's process boundary as a plain string."""

from __future__ import annotations

import io
import struct
import time
import zipfile

import pytest

from ingest.errors import BadDocument
from ingest.parsers import parse_document
from ingest.worker import WorkerBudget, parse_in_worker
from tests.fixtures_docs import docx_bytes

PARAGRAPH = b"<w:p><w:r><w:t>all work and no play makes a bomb</w:t></w:r></w:p>"


def _with_document(xml: bytes) -> bytes:
    """A real DOCX with its ``word/document.xml`` replaced by ``xml``."""
    original = zipfile.ZipFile(io.BytesIO(docx_bytes([("p", "hello")])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bomb:
        for info in original.infolist():
            data = xml if info.filename == "word/document.xml" else original.read(info)
            bomb.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return out.getvalue()


def _bomb_xml(megabytes: int) -> bytes:
    head = (
        b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
    )
    body = PARAGRAPH * ((megabytes << 20) // len(PARAGRAPH))
    return head + body + b"</w:body></w:document>"


def _understated(data: bytes, member: str, declared: int) -> bytes:
    """``data`` with ``member``'s uncompressed size written as ``declared`` in both headers."""
    buf = bytearray(data)
    archive = zipfile.ZipFile(io.BytesIO(data))
    info = archive.getinfo(member)
    struct.pack_into("<I", buf, info.header_offset + 22, declared)  # local file header
    offset = data.index(b"PK\x01\x02")
    while offset != -1:  # find the central directory entry of ``member``
        name_len = struct.unpack_from("<H", data, offset + 28)[0]
        if data[offset + 46 : offset + 46 + name_len] == member.encode():
            struct.pack_into("<I", buf, offset + 24, declared)
            break
        offset = data.find(b"PK\x01\x02", offset + 4)
    return bytes(buf)


def test_a_zip_bomb_is_refused_before_it_is_inflated():
    bomb = _with_document(_bomb_xml(40))
    assert len(bomb) < 200_000
    began = time.monotonic()
    with pytest.raises(BadDocument, match=r"word/document\.xml.*(ratio|zip bomb)"):
        parse_document(bomb, "docx")
    assert time.monotonic() - began < 2


async def test_a_zip_bomb_in_a_worker_is_a_bad_document_with_its_reason():
    bomb = _with_document(_bomb_xml(40))
    with pytest.raises(BadDocument, match="zip bomb"):
        await parse_in_worker(bomb, "docx", budget=WorkerBudget(max_memory_mb=512))


def test_a_member_that_inflates_past_its_declared_size_is_refused():
    xml = _bomb_xml(2)
    lying = _understated(_with_document(xml), "word/document.xml", 4096)
    with pytest.raises(BadDocument, match=r"word/document\.xml"):
        parse_document(lying, "docx")


def test_a_normal_docx_still_parses():
    data = docx_bytes([("heading", "Bees"), ("p", "The queen lays eggs."), ("table", [["a", "b"]])])
    assert [s.text for s in parse_document(data, "docx")] == ["Bees", "The queen lays eggs.", "a | b"]


async def test_an_lxml_error_crosses_the_process_boundary_as_a_string():
    broken = _with_document(b'<?xml version="1.0"?><w:document xmlns:w="urn:x"><w:body><w:p>')
    with pytest.raises(BadDocument, match="unreadable DOCX|parser failed") as caught:
        await parse_in_worker(broken, "docx")
    assert type(caught.value) is BadDocument and isinstance(caught.value.args[0], str)
