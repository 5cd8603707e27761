"""``python -m bench.traced_executor NAME``: an executor whose task spans are recorded by the
OpenTelemetry SDK and exported in batches to an exporter that drops them: what tracing costs the
executor itself, without a collector to talk to (``bench.dispatch --compare-observability``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class DiscardingExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def main() -> int:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
    trace.set_tracer_provider(provider)  # INGEST_TRACING=auto finds it configured
    from executor.cli import main as executor_main

    try:
        return executor_main()
    finally:
        provider.shutdown()


if __name__ == "__main__":
    sys.exit(main())
