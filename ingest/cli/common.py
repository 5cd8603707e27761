"""What every ``ingest`` verb shares: exit statuses, JSON on stdout, error lines, the console."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import orjson

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PIPED_WIDTH = 200

# How a verb module adds the global options to its own sub-parsers (``command._global_options``).
GlobalOptions = Callable[..., None]


def json_out(data: Any) -> None:
    sys.stdout.write(
        orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode()
    )
    sys.stdout.write("\n")
    sys.stdout.flush()


def err(text: str) -> None:
    print(f"ingest: {text}", file=sys.stderr)


def new_console() -> Any:
    from rich.console import Console

    # Piped output gets a wide fixed width, so tables are not squeezed to 80 columns. What is
    # printed holds users' text (names, chunks, messages, reasons): no console markup or emoji
    # codes, so "[/etc/hosts]" or "[word]" print as they are (styles are given as styles).
    width = None if sys.stdout.isatty() else PIPED_WIDTH
    return Console(highlight=False, soft_wrap=True, width=width, markup=False, emoji=False)
