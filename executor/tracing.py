"""Traces with OpenTelemetry, when it is installed (the ``otel`` extra); a no-op fast path when not.

Each task is a span ``ingest.task.{task_type}`` with attributes ``ingest.task_id``,
``ingest.doc_id``, ``ingest.kb_id``, ``ingest.executor`` and ``ingest.delivery_count``;
status OK, or ERROR with the error (a stop or a timeout included). Handlers add child spans
with :func:`span` (the parse handler: ``parse``, ``chunk``, ``embed``, ``index``). With every
span recorded, the SDK costs some 25-45 µs of CPU a task here (``bench.dispatch
--compare-observability --observe tracing``). ``INGEST_TRACING`` chooses:

- ``auto`` (default): spans go to the global tracer provider when one is configured, e.g. by
  ``opentelemetry-instrument`` from the standard ``OTEL_*`` variables; otherwise nothing is done;
- ``otlp``: the executor sets up an SDK provider with a batching OTLP exporter (install
  ``opentelemetry-exporter-otlp``; it reads ``OTEL_EXPORTER_OTLP_*`` itself); ``console``: spans
  printed on stdout, to try it out;
- ``off``: opentelemetry is never imported.

``INGEST_TRACE_RATIO`` (default 1) traces that fraction of tasks, chosen from the task id
(xxhash64 of it against the ratio, so every attempt of a task is traced or none is) before any of
the SDK runs: an unsampled task costs one hash and gets the shared null context, its attributes
never built, no span started. Leave the SDK's own sampler at its default (``parentbased_always_on``)
when using it; a ratio there as well would multiply the two.

Without opentelemetry installed, nothing of it is imported, and each task costs one call that
returns a shared null context manager.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import xxhash

log = logging.getLogger("executor.tracing")

TRACER_NAME = "ingest.executor"
MODES = ("auto", "otlp", "console", "off")
_NULL: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
_current: ContextVar[Any] = ContextVar("ingest_tracer", default=None)  # the running task's tracer


def installed() -> bool:
    """Whether the OpenTelemetry API can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # a parent missing, or blocked (None in sys.modules)
        return False


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A child span of the running task's span (a shared null context when tracing is off)."""
    tracer = _current.get()
    if tracer is None:
        return _NULL
    started: contextlib.AbstractContextManager[Any] = tracer.start_as_current_span(
        name, attributes=attributes or None
    )
    return started


def record_span(name: str, start_s: float, end_s: float, **attributes: Any) -> None:
    """A child span for work already done between two ``time.time()`` values (e.g. the stages of
    a worker process's job, measured there)."""
    tracer = _current.get()
    if tracer is None:
        return
    s = tracer.start_span(name, start_time=int(start_s * 1e9), attributes=attributes or None)
    s.end(end_time=int(end_s * 1e9))


class NoTracing:
    enabled = False

    def task(self, run: Any, consumer: str) -> contextlib.AbstractContextManager[Any]:
        return _NULL


NO_TRACING = NoTracing()


_HASH_SPACE = 2**64


def sampled(task_id: str, ratio: float) -> bool:
    """Whether a task of this id is traced at ``ratio`` (the same answer for every attempt)."""
    if ratio >= 1.0:
        return True
    return xxhash.xxh64_intdigest(task_id.encode()) < ratio * _HASH_SPACE


class Tracing:
    """Task spans from one tracer provider (the global one unless given), for ``ratio`` of tasks."""

    enabled = True

    def __init__(self, provider: Any = None, ratio: float = 1.0) -> None:
        self.ratio = ratio
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        self._trace, self._context = trace, context
        self._ok, self._status, self._error = Status(StatusCode.OK), Status, StatusCode.ERROR
        self.tracer = (provider or trace.get_tracer_provider()).get_tracer(TRACER_NAME)

    def task(self, run: Any, consumer: str) -> contextlib.AbstractContextManager[Any]:
        """A running task's span (``executor.book.Running``), current for the block and for
        :func:`span` in its handler; a cancelled block says why (``run.stop_reason``). A task the
        ratio leaves out gets the shared null context: nothing of the SDK runs for it."""
        if self.ratio < 1.0 and not sampled(run.claimed.task_id, self.ratio):
            return _NULL
        return self._span(run, consumer)

    @contextlib.contextmanager
    def _span(self, run: Any, consumer: str) -> Iterator[Any]:
        claimed = run.claimed
        row = claimed.row
        attributes = {
            "ingest.task_id": claimed.task_id,
            "ingest.doc_id": claimed.doc_id,
            "ingest.kb_id": row.get("kb_id") or (claimed.doc or {}).get("kb_id") or "",
            "ingest.executor": consumer,
            "ingest.delivery_count": int(claimed.entry.deliveries),
        }
        s = self.tracer.start_span(f"ingest.task.{claimed.task_type}", attributes=attributes)
        token = self._context.attach(self._trace.set_span_in_context(s))
        mine = _current.set(self.tracer)
        try:
            yield s
        except Exception as exc:
            s.record_exception(exc)
            s.set_status(self._status(self._error, f"{type(exc).__name__}: {exc}"))
            raise
        except BaseException:  # trio.Cancelled: a stop request or the timeout
            why = run.stop_reason or "timed out"
            s.set_status(self._status(self._error, f"stopped: {why}"))
            raise
        else:
            s.set_status(self._ok)
        finally:
            _current.reset(mine)
            self._context.detach(token)
            s.end()


def for_settings(mode: str, provider: Any = None, ratio: float = 1.0) -> Tracing | NoTracing:
    """The daemon's tracing: on when ``mode`` is not ``off``, OpenTelemetry is installed, and a
    provider is given or configured globally (``auto``) or set up here (``otlp``, ``console``);
    ``ratio`` of the tasks traced (none at 0: nothing is imported then either)."""
    if mode == "off" or ratio <= 0.0:
        return NO_TRACING
    if not installed():
        if mode == "auto":
            return NO_TRACING
        raise RuntimeError(f"INGEST_TRACING={mode} needs the otel extra: pip install 'ingest-executor[otel]'")
    if provider is not None:
        return Tracing(provider, ratio)
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        if mode == "auto":
            return NO_TRACING  # nobody configured a provider: spans would go nowhere
        setup_provider(mode)
    return Tracing(ratio=ratio)


def setup_provider(mode: str) -> None:
    """A global SDK provider exporting spans in batches (``otlp``) or to stdout (``console``)."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise RuntimeError(f"INGEST_TRACING={mode} needs the otel extra (opentelemetry-sdk): {exc}") from None
    if mode == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise RuntimeError(f"INGEST_TRACING=otlp needs opentelemetry-exporter-otlp: {exc}") from None
        exporter: Any = OTLPSpanExporter()
    else:
        exporter = ConsoleSpanExporter()
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing: %s exporter", mode)
