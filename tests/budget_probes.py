"""Parsers that misbehave on purpose, for the per-document budget tests (issue 17 #3).

Registered by their spec (``tests.budget_probes:hog``) so worker processes import them there.
``parse_with_probes`` is a handler factory for ``INGEST_EXTRA_HANDLERS=parse=…``: it registers
the probes in an executor process, then returns the real ``parse`` handler.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ingest.parsers import Section, register_parser

PROBES = {
    "hog": "tests.budget_probes:hog",
    "slow": "tests.budget_probes:slow",
    "sleepy": "tests.budget_probes:sleepy",
}
BLOCK = 8 << 20


def _pid_file(data: bytes) -> None:
    path = data.decode().split("\n", 1)[0]
    with open(path, "w") as fh:
        fh.write(str(os.getpid()))


def hog(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Writes its pid to the path on the first line of ``data``, then holds memory in 8 MB
    blocks (touched, so it is resident) up to the MB on the second line, and reports it."""
    _pid_file(data)
    target_mb = int(data.decode().split("\n")[1])
    held = []
    for _ in range((target_mb << 20) // BLOCK):
        block = bytearray(BLOCK)
        block[::4096] = b"x" * len(block[::4096])
        held.append(block)
    return [Section(f"held {len(held) * BLOCK >> 20} MB")]


def slow(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Writes its pid, then spins in Python forever (a parser that never ends)."""
    _pid_file(data)
    n = 0
    while True:
        n += 1


def sleepy(data: bytes, from_page: int, to_page: int) -> list[Section]:
    """Writes its pid, then sleeps the seconds on the second line, and reports it."""
    _pid_file(data)
    seconds = float(data.decode().split("\n")[1])
    time.sleep(seconds)
    return [Section(f"slept {seconds} s")]


def register_probes() -> None:
    for doc_type, spec in PROBES.items():
        register_parser(doc_type, spec)


def parse_with_probes(env: Any) -> Any:
    from executor.handlers.parse import make_handler

    register_probes()
    return make_handler(env)
