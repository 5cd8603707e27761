"""PDF page counts for the producer, read in a short-lived child process, never in the caller's.

The producer splits a PDF into page-range tasks by its page count. Opening untrusted bytes with
pdfium can hang or crash (a native library on crafted input), and the submitting process is an
application service or the CLI: so every PDF of one submit call is counted by one child process
(``python -c``, pdfium loaded there only), started at the first PDF and given each document in
turn over a pipe. A document the child cannot open, one it takes longer than
:data:`TIMEOUT_S` on (the child is killed), or one it dies on (a fresh child takes the next) has
no page count: it is enqueued as one task, and its parser reports the real error. After
:data:`BUDGET_S` of counting in one call, or :data:`MAX_FAILURES` children lost in a row, the
rest are not counted either (each is one task).

Importing this module loads nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import subprocess
import sys
import time

TIMEOUT_S = 10.0  # one document
BUDGET_S = 60.0  # all documents of one submit call
MAX_FAILURES = 3  # children lost in a row (hung or dead) before counting stops
_LENGTH = struct.Struct(">Q")

# The child: reads (length, bytes) frames on stdin, answers one line each on its own copy of
# stdout ("N" pages, or "-" when pdfium cannot open the bytes). fd 1 itself goes to stderr so
# nothing a native library prints can mix with the answers.
_CHILD = """
import os, struct, sys
sys.path[:0] = __import__("json").loads(sys.argv[1])
answers = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
import pypdfium2
frames = sys.stdin.buffer
length = struct.Struct(">Q")
while True:
    head = frames.read(length.size)
    if len(head) < length.size:
        break
    data = frames.read(length.unpack(head)[0])
    try:
        pdf = pypdfium2.PdfDocument(data)
    except Exception:
        answers.write(b"-\\n")
        continue
    try:
        answers.write(b"%d\\n" % len(pdf))
    finally:
        pdf.close()
"""


def _ready(fd: int, events: int, timeout_s: float) -> bool:
    """Whether ``fd`` is ready (or broken) within ``timeout_s``; poll, as an application's
    descriptors may number more than select allows."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(max(1, int(timeout_s * 1000))))


class PageCounter:
    """Counts pages of the PDFs of one submit call in one child process; use as a context
    manager (the child ends with it)."""

    def __init__(
        self, timeout_s: float = TIMEOUT_S, budget_s: float = BUDGET_S, max_failures: int = MAX_FAILURES
    ) -> None:
        self.timeout_s = timeout_s
        self.budget_s = budget_s
        self.max_failures = max_failures
        self._proc: subprocess.Popen[bytes] | None = None
        self._spent = 0.0
        self._failures = 0
        self._pending = b""

    def __enter__(self) -> PageCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count(self, data: bytes) -> int | None:
        """Pages of the PDF ``data``; None when it cannot be counted (one task, the parser decides)."""
        if self._spent >= self.budget_s or self._failures >= self.max_failures:
            return None
        began = time.monotonic()
        try:
            return self._ask(data, min(self.timeout_s, self.budget_s - self._spent))
        finally:
            self._spent += time.monotonic() - began

    def _ask(self, data: bytes, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        try:
            proc = self._child()
            assert proc.stdin is not None and proc.stdout is not None
            fd = proc.stdin.fileno()
            sent = self._send(fd, _LENGTH.pack(len(data)), deadline) and self._send(fd, data, deadline)
            answer = self._read_line(proc.stdout.fileno(), deadline) if sent else None
        except OSError:  # the child died (a broken pipe) or could not start
            answer = None
        if answer is None:  # dead, hung or unable to start: a fresh child for the next document
            self._failures += 1
            self._kill()
            return None
        self._failures = 0
        return int(answer) if answer.isdigit() else None

    def argv(self) -> list[str]:
        """The child's command line (the parent's ``sys.path``, so it finds what the parent finds)."""
        return [sys.executable, "-c", _CHILD, json.dumps(sys.path)]

    def _child(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            self._pending = b""
            self._proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
            assert self._proc.stdin is not None
            os.set_blocking(self._proc.stdin.fileno(), False)  # a write never waits: see _send
        return self._proc

    @staticmethod
    def _send(fd: int, frame: bytes, deadline: float) -> bool:
        """Write ``frame`` to the child; False when the deadline passes first (a child stuck
        before reading)."""
        view = memoryview(frame)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if _ready(fd, select.POLLOUT, left):
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    continue
        return True

    def _read_line(self, fd: int, deadline: float) -> str | None:
        """The child's next answer, or None when it ends or the deadline passes first."""
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not _ready(fd, select.POLLIN, left):
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._pending += chunk
        answer, self._pending = self._pending.split(b"\n", 1)
        return answer.decode("ascii", "replace").strip()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def close(self) -> None:
        """End the child: it exits when its input closes (killed if it does not at once)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
