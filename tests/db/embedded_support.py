"""Helpers for the embedded Redis's tests: a home of a test's own, and the ``redis-server``
processes that run on it, found by their working directory (the home), not by what the code
under test believes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


def servers_on(home: str) -> list[int]:
    """The pids of the ``redis-server`` processes whose directory is ``home`` (its AOF)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if "redis-server" in proc.name() and Path(proc.cwd()) == Path(home).resolve():
                found.append(proc.pid)
    return sorted(found)


@pytest.fixture
def own_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A short home (a unix socket's path has ~100 bytes at most); every server a test left on it
    is killed after, whatever state the test left it in."""
    home = str(tmp_path_factory.mktemp("e"))
    yield home
    for pid in servers_on(home):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
