"""What every ``ingest`` verb shares: exit statuses, JSON on stdout, error lines, the console.

Everything a verb prints for a person goes through :func:`out`, :func:`err` or the console of
:func:`new_console`, which escape terminal controls in it (:func:`safe_text`): a document named
``\x1b]0;pwned\x07`` shows as that text, and cannot retitle, clear or rewrite the operator's
terminal. ``--json`` output is JSON (orjson escapes every C0 control).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

import orjson

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
PIPED_WIDTH = 200

# How a verb module adds the global options to its own sub-parsers (``command._global_options``).
GlobalOptions = Callable[..., None]


def global_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the global flags give (``--db-url``, ``--redis-url``, ``--key-prefix``,
    ``--vector-store``): what every verb builds its settings with, and what ``ingest config``
    reports as ``flag``."""
    return {
        "db_url": args.db_url,
        "redis_url": args.redis_url,
        "key_prefix": args.key_prefix,
        "vector_store": getattr(args, "vector_store", None),
    }


def json_out(data: Any) -> None:
    sys.stdout.write(
        orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode()
    )
    sys.stdout.write("\n")
    sys.stdout.flush()


# C0 controls but tab and newline, DEL, C1 (\x9b is a one-character CSI), bidi embeddings,
# overrides and isolates (text that reads in another order than it is), line/paragraph separators
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    ch = match.group()
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def safe_text(text: str, *, one_line: bool = False) -> str:
    """``text`` with every terminal control written out as an escape (``\x1b``, ``\r``,
    ``\u202e``); tabs and newlines stay, unless ``one_line``."""
    return (_UNSAFE_LINE if one_line else _UNSAFE).sub(_escaped, text)


def out(text: str) -> None:
    """One line (or a few) for a person on stdout, controls escaped."""
    print(safe_text(text))


def err(text: str) -> None:
    print(f"ingest: {safe_text(text)}", file=sys.stderr)


def new_console(*, stderr: bool = False) -> Any:
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        """Escapes terminal controls in what it prints: in strings before layout (so tables
        keep their widths), and in every text segment rendered (a ``Text`` made elsewhere);
        rich's own control segments (cursor moves of a live display) pass."""

        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(safe_text(text), **kwargs)

        def render(self, renderable: Any, options: Any = None) -> Iterable[Segment]:
            for segment in super().render(renderable, options):
                if segment.control or not _UNSAFE.search(segment.text):
                    yield segment
                else:
                    yield Segment(safe_text(segment.text), segment.style, segment.control)

    # Piped output gets a wide fixed width, so tables are not squeezed to 80 columns. What is
    # printed holds users' text (names, chunks, messages, reasons): no console markup or emoji
    # codes, so "[/etc/hosts]" or "[word]" print as they are (styles are given as styles).
    # Colour only on a terminal and never under NO_COLOR (https://no-color.org: set, not empty).
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    width = None if tty else PIPED_WIDTH
    return SafeConsole(
        highlight=False,
        soft_wrap=True,
        width=width,
        markup=False,
        emoji=False,
        stderr=stderr,
        no_color=bool(os.environ.get("NO_COLOR")),
        color_system="auto" if tty else None,
        force_terminal=tty,
    )


def plain_output(stream: Any = None) -> bool:
    """No bars, no live display: the stream is not a terminal, or ``TERM=dumb``."""
    stream = sys.stderr if stream is None else stream
    return not stream.isatty() or os.environ.get("TERM") == "dumb"
