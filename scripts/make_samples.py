"""Writes the demo's PDF and DOCX samples from the texts in ``examples/.sources`` (no downloads).

    .venv/bin/python scripts/make_samples.py [--force]   # writes examples/*.pdf and *.docx

Both files are committed; they are written again only when missing or with ``--force``
(pdfium and python-docx stamp the time into them, so each run gives different bytes).

``pdf_bytes`` and ``docx_bytes`` are also what the tests use to make documents: a PDF with a
real text layer (pypdfium2 writing standard-font text objects) and a DOCX (python-docx).
"""

from __future__ import annotations

import ctypes
import io
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

PAGE_W, PAGE_H = 612, 792  # US Letter, points
MARGIN, LEADING = 72, 15

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SOURCES = EXAMPLES / ".sources"  # hidden: `ingest submit examples/` skips it
PAGE_BREAK = "---- page ----"


def read_pages(path: Path) -> list[list[str]]:
    """A text whose pages are separated by a ``---- page ----`` line: paragraphs per page."""
    pages = path.read_text(encoding="utf-8").split(PAGE_BREAK)
    return [[p.strip() for p in page.split("\n\n") if p.strip()] for page in pages]


def read_blocks(path: Path) -> list[tuple[str, object]]:
    """``# heading``, paragraphs and ``| a | b |`` table rows → blocks for :func:`docx_bytes`."""
    blocks: list[tuple[str, object]] = []
    for part in path.read_text(encoding="utf-8").split("\n\n"):
        part = part.strip()
        if part.startswith("# "):
            blocks.append(("heading", part[2:].strip()))
        elif part.startswith("|"):
            rows = [
                [cell.strip() for cell in line.strip().strip("|").split("|")] for line in part.splitlines()
            ]
            blocks.append(("table", rows))
        elif part:
            blocks.append(("p", " ".join(part.split())))
    return blocks


def _wrap(paragraphs: Sequence[str], width: int) -> list[str]:
    lines: list[str] = []
    for paragraph in paragraphs:
        lines.extend(textwrap.wrap(paragraph, width) or [""])
        lines.append("")
    return lines


def pdf_bytes(pages: Sequence[Sequence[str]], font_size: float = 11.0, wrap_at: int = 90) -> bytes:
    """A PDF with one page per item of ``pages`` (paragraphs, wrapped), as a real text layer."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    pdf = pdfium.PdfDocument.new()
    try:
        for paragraphs in pages:
            page = pdf.new_page(PAGE_W, PAGE_H)
            y = PAGE_H - MARGIN
            for line in _wrap(paragraphs, wrap_at):
                if line:
                    obj = raw.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", font_size)
                    encoded = (line + "\0").encode("utf-16-le")
                    buffer = ctypes.create_string_buffer(encoded, len(encoded))
                    raw.FPDFText_SetText(obj, ctypes.cast(buffer, raw.FPDF_WIDESTRING))
                    raw.FPDFPageObj_Transform(obj, 1, 0, 0, 1, MARGIN, y)
                    raw.FPDFPage_InsertObject(page.raw, obj)
                y -= LEADING
            raw.FPDFPage_GenerateContent(page.raw)
            page.close()
        out = io.BytesIO()
        pdf.save(out)
        return out.getvalue()
    finally:
        pdf.close()


def docx_bytes(blocks: Sequence[tuple[str, object]]) -> bytes:
    """A DOCX of ``("heading" | "p", text)`` and ``("table", rows)`` blocks, in order."""
    import docx

    document = docx.Document()
    for kind, value in blocks:
        if kind == "heading":
            document.add_heading(str(value), level=1)
        elif kind == "table":
            rows = list(value)  # type: ignore[call-overload]
            table = document.add_table(rows=len(rows), cols=len(rows[0]))
            for r, row in enumerate(rows):
                for c, text in enumerate(row):
                    table.cell(r, c).text = text
        else:
            document.add_paragraph(str(value))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def main(argv: Sequence[str] = ()) -> int:
    """Write the samples that are missing (``--force``: all of them) into the examples folder."""
    force = "--force" in argv
    folder = Path(next((a for a in argv if not a.startswith("-")), EXAMPLES))
    made = {
        "bicycle_maintenance.pdf": lambda: pdf_bytes(read_pages(SOURCES / "bicycle_maintenance.txt")),
        "origami_basics.docx": lambda: docx_bytes(read_blocks(SOURCES / "origami_basics.txt")),
    }
    for name, make in made.items():
        path = folder / name
        if force or not path.exists():
            path.write_bytes(make())
            print(f"wrote {path}")
        else:
            print(f"kept {path} (--force rewrites it)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
