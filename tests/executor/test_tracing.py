"""Traces: one span per task, ``ingest.task.{type}``, with its attributes, its children (the parse
handler's parse, chunk, embed and index) and its status; without tracing, nothing is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from db.database import unit
from db.models import DONE, FAILED, Task
from executor import tracing
from tests.executor.support import all_in, enqueue, running_daemon, task_spec
from tests.fixtures_docs import add_document, embedder  # noqa: F401 - the model, loaded once per session
from tests.helpers import await_until
from tests.observe import TASK_TYPES
from tests.procs import ROOT


def _queued_parse_task(settings, streams) -> str:
    task, doc, _ = add_document(settings, "tides.md", b"# Tides\n\n" + b"The moon pulls the sea. " * 200)
    with unit():
        Task.update(status="queued", attempt=0).where(Task.id == task["id"]).execute()
    streams.publish_many([{"id": task["id"], "doc_id": doc["id"], "task_type": "parse", "priority": 0}])
    return str(task["id"])


@pytest.mark.usefixtures("embedder")
async def test_each_task_is_one_span_with_its_children_and_status(xsettings, streams, db):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = xsettings.replace(extra_handlers=f"{xsettings.extra_handlers},{TASK_TYPES}")
    ok = enqueue(streams, [task_spec("traced") for _ in range(2)])
    (bad,) = enqueue(streams, [task_spec("traced", fail=True)])
    parse = _queued_parse_task(settings, streams)
    async with running_daemon(settings, "host_1", tracing=tracing.Tracing(provider)):
        await await_until(lambda: all_in([*ok, parse], DONE) and all_in([bad], FAILED), 60)
    spans = exporter.get_finished_spans()
    tasks = {s.attributes["ingest.task_id"]: s for s in spans if s.name.startswith("ingest.task.")}
    assert sorted(tasks) == sorted([*ok, bad, parse])  # one span per task
    assert len([s for s in spans if s.name.startswith("ingest.task.")]) == 4
    children: dict[str, list[str]] = {}
    for s in spans:
        if s.parent is not None:
            parent = next(t for t in tasks.values() if t.context.span_id == s.parent.span_id)
            children.setdefault(parent.attributes["ingest.task_id"], []).append(s.name)
    for tid in [*ok, bad]:
        assert tasks[tid].name == "ingest.task.traced" and sorted(children[tid]) == ["step.one", "step.two"]
    assert sorted(children[parse]) == ["chunk", "embed", "index", "parse"]
    assert tasks[parse].name == "ingest.task.parse"
    attrs = tasks[parse].attributes
    assert attrs["ingest.executor"] == "host_1" and attrs["ingest.delivery_count"] == 1
    assert attrs["ingest.doc_id"] and attrs["ingest.kb_id"] and attrs["ingest.task_id"] == parse
    assert all(tasks[t].status.status_code == StatusCode.OK for t in [*ok, parse])
    assert tasks[bad].status.status_code == StatusCode.ERROR
    assert "traced failure" in tasks[bad].status.description
    spans_by_name = {
        s.name: s for s in spans if s.parent is not None and s.parent.span_id == tasks[parse].context.span_id
    }
    assert (
        spans_by_name["parse"].end_time <= spans_by_name["chunk"].start_time + 1000
    )  # in order, not overlapping


def test_tracing_off_or_unconfigured_is_the_null_path(monkeypatch):
    assert tracing.for_settings("off") is tracing.NO_TRACING
    assert (
        tracing.for_settings("auto") is tracing.NO_TRACING
    )  # no provider configured: spans would go nowhere
    monkeypatch.setattr(tracing, "installed", lambda: False)
    assert tracing.for_settings("auto") is tracing.NO_TRACING
    assert tracing.span("x") is tracing.span("y")  # outside a traced task: one shared null context


def test_without_opentelemetry_the_executor_needs_none_of_it():
    """opentelemetry made unimportable (None in sys.modules: as if the extra were not installed)."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "import executor.daemon, executor.runner, executor.handlers.parse\n"
        "from executor import tracing\n"
        "assert not tracing.installed()\n"
        "assert tracing.for_settings('auto') is tracing.for_settings('off') is tracing.NO_TRACING\n"
        "try:\n    tracing.for_settings('otlp')\nexcept RuntimeError as exc:\n    assert 'otel extra' in str(exc)\n"
        "else:\n    raise SystemExit('otlp did not refuse without the otel extra')\n"
        "with tracing.span('parse'): pass\n"
        "tracing.record_span('chunk', 0.0, 1.0)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


class _CountingProvider(TracerProvider):
    """Counts the spans the SDK was asked to start (sampled or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def get_tracer(self, *args, **kwargs):
        tracer = super().get_tracer(*args, **kwargs)
        start_span, provider = tracer.start_span, self

        def counted(*a, **kw):
            provider.started += 1
            return start_span(*a, **kw)

        tracer.start_span = counted
        return tracer


async def test_a_trace_ratio_traces_that_share_of_tasks_by_id_and_the_sdk_never_sees_the_rest(
    xsettings, streams, db
):
    exporter = InMemorySpanExporter()
    provider = _CountingProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = xsettings.replace(extra_handlers=f"{xsettings.extra_handlers},{TASK_TYPES}")
    ids = enqueue(streams, [task_spec("traced") for _ in range(40)])
    chosen = {t for t in ids if tracing.sampled(t, 0.25)}
    assert 0 < len(chosen) < 40  # (40 random ids: all or none at 0.25 is a chance of 1e-5)
    async with running_daemon(settings, "host_1", tracing=tracing.Tracing(provider, ratio=0.25)):
        await await_until(lambda: all_in(ids, DONE), 30)
    spans = exporter.get_finished_spans()
    traced = {s.attributes["ingest.task_id"] for s in spans if s.name.startswith("ingest.task.")}
    assert traced == chosen
    # each traced task: its span and its two children; an unsampled task's handler spans are the
    # shared null context too, so the SDK started nothing for it
    assert len(spans) == provider.started == 3 * len(chosen)
    assert all(tracing.sampled(t, 0.25) for t in traced) and not tracing.sampled(ids[0], 0.0)
    assert tracing.for_settings("console", ratio=0.0) is tracing.NO_TRACING  # nothing imported at 0
