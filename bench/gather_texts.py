"""Gather a file of distinct real text lines from a machine's own files, for ``bench/embed_texts.py``.

    .venv/bin/python bench/gather_texts.py OUT.txt [--lines 1001000] [DIR ...]

Reads the text files under each ``DIR`` (default: the Python installs and ``/usr/share``):
``*.py``, ``*.md``, ``*.txt``, ``*.rst``, ``*.html``, ``*.c``, ``*.h``. Each line is stripped
of surrounding spaces, of leading comment marks (``#``, ``*``, ``/``, ``-``, ``>``) and of
surrounding quotes (a one-line docstring's), and kept
if it is 40-300 characters long. Lines that read as prose (at least 7 words, at least 90 %
letters and spaces: comments, docstrings, documentation) come first; the rest are drawn from
the other lines, up to ``--lines`` in all (each draw with a fixed seed); the result is shuffled with the
same seed and written one a line. Which lines there are depends on what the machine has
installed, so two machines give different files of the same kind.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

SUFFIXES = (".py", ".md", ".txt", ".rst", ".html", ".c", ".h")
SEED = 14


def default_dirs() -> list[Path]:
    out = [Path(sys.base_prefix), Path(sys.prefix), Path("/usr/share")]
    return [d for i, d in enumerate(out) if d.is_dir() and d not in out[:i]]


def candidate_lines(dirs: Iterable[Path]) -> Iterator[str]:
    for top in dirs:
        for root, _, files in os.walk(top):
            for name in files:
                if not name.endswith(SUFFIXES):
                    continue
                try:
                    text = (Path(root) / name).read_text(encoding="utf-8", errors="ignore")
                except OSError:
                    continue
                for raw in text.splitlines():
                    line = raw.strip().lstrip("#*/-> ").strip().strip("\"'").strip()
                    if 40 <= len(line) <= 300:
                        yield line


def is_prose(line: str) -> bool:
    return len(line.split()) >= 7 and sum(c.isalpha() or c == " " for c in line) >= 0.9 * len(line)


def gather(dirs: Iterable[Path], lines: int, seed: int = SEED) -> list[str]:
    """Up to ``lines`` distinct lines: prose lines first (a seeded sample where there are more),
    then others."""
    seen = set(candidate_lines(dirs))
    prose = sorted(line for line in seen if is_prose(line))
    rng = random.Random(seed)
    chosen = rng.sample(prose, lines) if len(prose) > lines else prose
    if len(chosen) < lines:
        others = sorted(seen.difference(prose))
        chosen += rng.sample(others, min(len(others), lines - len(chosen)))
    rng.shuffle(chosen)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("dirs", type=Path, nargs="*")
    parser.add_argument("--lines", type=int, default=1_001_000)
    args = parser.parse_args(argv)
    texts = gather(args.dirs or default_dirs(), args.lines)
    args.out.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    prose = sum(map(is_prose, texts))
    print(f"{len(texts):,} lines ({prose:,} prose) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
