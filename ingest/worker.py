"""Parsing and chunking in worker processes that a timeout, a cancel or a budget can kill.

A parser is third-party code on untrusted bytes: it may loop, hang, crash or swallow memory.
Each job runs in a ``trio_parallel`` worker process with ``kill_on_cancel=True``, so when the
task's ``trio.fail_after`` fires or its cancel scope is cancelled, the worker is killed at once
and the task ends; a crashed worker (a segfault in a native library) ends the task, not the
executor.

Each job is also held to a :class:`WorkerBudget` (``Settings.worker_max_memory_mb``,
``Settings.parse_timeout_s``):

- **memory**: the worker's address space is capped (``RLIMIT_AS``, set in the worker's
  initializer, with glibc's malloc arenas limited so that threads do not reserve address space
  they never use). An allocation past the cap is a ``MemoryError``: the job fails with
  "needs more than N MB to parse" and the worker is retired, never reused;
- **time**: each parse, and each dataflow component, gets ``parse_timeout_s``. A watchdog
  thread in the worker ends the process when the job's deadline passes (native code that
  never returns to Python included), and the executor kills it a little later if it has not;
- **parent**: the same watchdog ends the worker as soon as its executor process is gone (a
  pidfd of the parent, polled; ``getppid`` where there is none), so a SIGKILLed executor never
  leaves a worker parsing on as a child of init. ``PR_SET_PDEATHSIG`` would not do: the
  kernel sends it when the *thread* that started the child ends, and trio_parallel starts
  workers from a trio worker thread that ends when idle.

Every failure comes back as :class:`~ingest.errors.BadDocument` (or a plain
:class:`~ingest.errors.PermanentError`) carrying only a string: a library's own exception
object may not survive pickling across the process boundary. Workers are spawned processes
that import only this module's dependencies (the parser libraries and ``tokenizers``); never
torch or sentence-transformers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ingest.chunking import Chunk, ChunkConfig, chunk_document
from ingest.errors import BadDocument, PermanentError
from ingest.parsers import Section, extra_parsers, parse_document

if TYPE_CHECKING:
    from db.config import Settings

T = TypeVar("T")

EXIT_TIMEOUT = 86  # a worker's own exit status: its job ran past its deadline
EXIT_ORPHANED = 87  # its executor is gone
WATCH_INTERVAL_S = 0.1  # the watchdog's period
KILL_GRACE_S = 5.0  # after the worker's own deadline, the executor kills it
_M_ARENA_MAX = -8  # glibc mallopt parameter


@dataclass(frozen=True)
class WorkerBudget:
    """What one job in a parse worker may take. 0 means no cap."""

    max_memory_mb: int = 2048
    timeout_s: float = 900.0
    nice: int = 10  # the worker process's niceness: parsing yields the cores to the encoder

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerBudget:
        return cls(
            max_memory_mb=settings.worker_max_memory_mb,
            timeout_s=settings.parse_timeout_s,
            nice=settings.parse_worker_nice,
        )

    @property
    def max_held_chars(self) -> int:
        """Characters of text one dataflow component may hold: a quarter of the memory cap
        (the text is held by the worker, pickled, and held again by the executor)."""
        return (self.max_memory_mb << 20) // 4

    def memory_message(self) -> str:
        return f"needs more than {self.max_memory_mb} MB to parse (worker_max_memory_mb)"

    def timeout_message(self, what: str = "parsing") -> str:
        return f"{what} took longer than {self.timeout_s:g} s (parse_timeout_s)"


DEFAULT_BUDGET = WorkerBudget()


@dataclass(frozen=True)
class ParsedDocument:
    """What a parse-and-chunk job returns: how many sections, the chunks, and how long the
    worker spent parsing and chunking (for the task's trace)."""

    sections: int
    chunks: list[Chunk]
    parse_s: float = 0.0
    chunk_s: float = 0.0


# -- the worker side -------------------------------------------------------------------------

_deadline = 0.0  # monotonic time at which the watchdog ends this worker (0: none)
_job_budget = DEFAULT_BUDGET
_retire = False  # set after a MemoryError: the worker is not reused


def _init_worker(max_memory_mb: int, parent_pid: int, nice: int = 0) -> None:
    """The worker's initializer: watch the parent, lower its priority, cap the address space.

    The niceness is what keeps an executor's embedding at the encoder's speed on a machine with
    few cores: torch's intra-op threads (one per core) wait for their slowest one at every
    operator, so a parse worker taking a core from one of them stalls the whole batch. A nice
    worker still gets every cycle the encoder leaves (tokenizing, Python between batches, the
    database writes), so parsing keeps ahead of the batches it feeds."""
    if os.getppid() != parent_pid:  # the executor died before this worker started
        os._exit(EXIT_ORPHANED)
    if nice > 0:
        with contextlib.suppress(OSError):
            os.nice(nice)
    threading.Thread(target=_watchdog, args=(parent_pid,), name="budget-watchdog", daemon=True).start()
    if max_memory_mb > 0:
        _limit_memory(max_memory_mb << 20)


def _limit_memory(limit: int) -> None:
    import ctypes
    import resource

    with contextlib.suppress(OSError, AttributeError):  # glibc only: one arena per thread otherwise
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 2)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _watchdog(parent_pid: int) -> None:
    """Ends the process when its parent is gone or its job's deadline has passed."""
    import select

    poller = None
    try:
        fd = os.pidfd_open(parent_pid)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
    except (AttributeError, OSError):  # no pidfd (old kernel): getppid below
        poller = None
    while True:
        if poller is not None:
            if poller.poll(int(WATCH_INTERVAL_S * 1000)):
                os._exit(EXIT_ORPHANED)
        else:
            time.sleep(WATCH_INTERVAL_S)
        if os.getppid() != parent_pid:
            os._exit(EXIT_ORPHANED)
        if _deadline and time.monotonic() > _deadline:
            os._exit(EXIT_TIMEOUT)


def restart_deadline() -> None:
    """In a worker: the next step (a dataflow component) gets a time budget of its own."""
    global _deadline
    budget = _job_budget.timeout_s
    _deadline = time.monotonic() + budget if budget > 0 else 0.0


def _retire_worker() -> bool:
    """trio_parallel's retire hook, called after each job."""
    return _retire


def _plain(exc: PermanentError) -> PermanentError:
    """The error as a string in one of our own classes (any subclass's extra state dropped)."""
    return BadDocument(str(exc)) if isinstance(exc, BadDocument) else PermanentError(str(exc))


def _guarded(budget: WorkerBudget, fn: Callable[..., T], *args: Any) -> T:
    """Runs in the worker: under its budget; any failure becomes a picklable error with the reason.

    The error is raised outside the ``except`` block, so it carries no ``__context__``: a
    library's exception object (lxml's holds its error log) may not pickle, and trio_parallel
    sends the whole chain."""
    global _job_budget, _deadline, _retire
    _job_budget = budget
    restart_deadline()
    error: PermanentError
    try:
        return fn(*args)
    except PermanentError as exc:
        error = _plain(exc)
    except RecursionError:
        error = BadDocument("the document is nested too deeply to parse")
    except MemoryError as exc:
        _retire = True
        error = BadDocument((f"{exc}: " if str(exc) else "") + budget.memory_message())
    except Exception as exc:  # noqa: BLE001 - a parser library's own error, reported as is
        error = BadDocument(f"parser failed: {type(exc).__name__}: {exc}")
    finally:
        _deadline = 0.0
    raise error


def _parse_job(
    data: bytes, doc_type: str, from_page: int, to_page: int, extra: dict[str, str]
) -> list[Section]:
    return parse_document(data, doc_type, from_page, to_page, extra=extra)


def _parse_and_chunk_job(
    data: bytes,
    doc_type: str,
    from_page: int,
    to_page: int,
    config: ChunkConfig,
    model: str,
    extra: dict[str, str],
) -> ParsedDocument:
    began = time.perf_counter()
    sections = parse_document(data, doc_type, from_page, to_page, extra=extra)
    parsed = time.perf_counter()
    chunks = chunk_document(sections, config, model)
    return ParsedDocument(len(sections), chunks, parsed - began, time.perf_counter() - parsed)


# -- the executor side -----------------------------------------------------------------------

_CONTEXTS: trio.lowlevel.RunVar[dict[tuple[int, int], Any]] = trio.lowlevel.RunVar("ingest_worker_contexts")


async def _context(max_memory_mb: int, nice: int) -> Any:
    """This run's worker context for a memory cap and niceness: opened on first use, held open
    by a system task until ``trio.run`` ends (so workers are reused across tasks, and never
    outlive it)."""
    try:
        contexts = _CONTEXTS.get()
    except LookupError:
        contexts = {}
        _CONTEXTS.set(contexts)
    found = contexts.get((max_memory_mb, nice))
    if found is None:
        ready = trio.Event()
        found = contexts[(max_memory_mb, nice)] = [ready, None]
        trio.lowlevel.spawn_system_task(_hold_context, max_memory_mb, nice, found)
    await found[0].wait()
    return found[1]


async def _hold_context(max_memory_mb: int, nice: int, box: list[Any]) -> None:
    import trio_parallel

    init = functools.partial(_init_worker, max_memory_mb, os.getpid(), nice)
    with contextlib.suppress(trio_parallel.BrokenWorkerError):  # a worker slow to exit at the end
        async with trio_parallel.open_worker_context(
            init=init, retire=_retire_worker, grace_period=5.0
        ) as ctx:
            box[1] = ctx
            box[0].set()
            await trio.sleep_forever()


async def run_in_worker(
    fn: Callable[..., T], *args: Any, budget: WorkerBudget | None = None, steps: int = 1
) -> T:
    """``fn(*args)`` in a killable worker process under ``budget`` (``steps``: how many time
    budgets the job may use, one per dataflow component); a dead worker is a BadDocument."""
    import trio_parallel

    budget = budget or DEFAULT_BUDGET
    ctx = await _context(budget.max_memory_mb, budget.nice)
    limit_s = budget.timeout_s * max(1, steps) + KILL_GRACE_S if budget.timeout_s > 0 else float("inf")
    # The time budget starts once a worker is this job's: waiting for one (more tasks than
    # cores) is not parsing. So the workers' limiter is taken here, before the clock starts, and
    # run_sync is given a limiter of its own that never waits.
    async with trio_parallel.current_default_worker_limiter():
        try:
            with trio.move_on_after(limit_s):
                return await ctx.run_sync(  # type: ignore[no-any-return]  # trio_parallel is untyped
                    _guarded, budget, fn, *args, kill_on_cancel=True, limiter=trio.CapacityLimiter(1)
                )
        except trio_parallel.BrokenWorkerError as exc:
            raise BadDocument(_describe_broken(exc, budget)) from None
    raise BadDocument(budget.timeout_message())


def _describe_broken(exc: BaseException, budget: WorkerBudget) -> str:
    for arg in getattr(exc, "args", ()):
        code = getattr(arg, "exitcode", None)
        if code == EXIT_TIMEOUT:
            return budget.timeout_message()
        if code is not None:
            how = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
            return f"the parser process died ({how})"
    return f"the parser process died ({exc or type(exc).__name__})"


async def parse_in_worker(
    data: bytes,
    doc_type: str,
    from_page: int = 0,
    to_page: int = 100_000_000,
    *,
    budget: WorkerBudget | None = None,
) -> list[Section]:
    """:func:`ingest.parsers.parse_document` in a killable worker process."""
    return await run_in_worker(_parse_job, data, doc_type, from_page, to_page, extra_parsers(), budget=budget)


async def parse_and_chunk_in_worker(
    data: bytes,
    doc_type: str,
    from_page: int,
    to_page: int,
    config: ChunkConfig,
    model: str,
    *,
    budget: WorkerBudget | None = None,
) -> ParsedDocument:
    """Parse then chunk in one worker job (the bytes cross the process boundary once)."""
    return await run_in_worker(
        _parse_and_chunk_job,
        data,
        doc_type,
        from_page,
        to_page,
        config,
        model,
        extra_parsers(),
        budget=budget,
    )
