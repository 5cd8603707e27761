"""Run a dataflow graph on one document, reporting progress per component.

Components run in the graph's order. Those that run in a worker (Parser, Splitter, Extractor)
and are ready together go to one killable worker process job, so the document's bytes cross the
process boundary once; the Embedder goes through the executor's shared embedding service and
the Indexer writes in a thread (see :mod:`ingest.dataflow.components`). A value is dropped as
soon as every component that takes it has run; what each component gave is kept as a one-line
summary and, for a debug run, a truncated preview (:func:`preview`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ingest.dataflow.components import (
    CHUNKS,
    EMBEDDED,
    FILE,
    INDEXED,
    REGISTRY,
    SECTIONS,
    WORKER,
    ChunkSet,
    FileInput,
    IndexResult,
    Runtime,
    check_held,
    run_worker_stage,
)
from ingest.dataflow.dsl import Graph
from ingest.errors import BadDocument, PermanentError
from ingest.parsers import Section

Report = Callable[[float | None, str], None]
WorkerCall = Callable[..., Awaitable[Any]]  # ingest.worker.run_in_worker: (fn, *args, steps=N) in a worker

START, END = 0.02, 0.98  # progress before the first and after the last component
WEIGHTS = {"File": 0.0, "Parser": 2.0, "Splitter": 1.0, "Extractor": 0.5, "Embedder": 4.0, "Indexer": 1.0}
EMBED_LINE_INTERVAL_S = 2.0
PREVIEW_ITEMS = 10  # items shown per output in a debug run
PREVIEW_CHARS = 300  # characters shown per text
MAX_OUTPUTS_BYTES = 48_000  # all previews of a run together, as JSON (Task.result is a TEXT column)


@dataclass
class RunResult:
    """What a run produced: the Indexer's chunk ids, and what each component gave."""

    chunk_ids: list[str] = field(default_factory=list)
    chunks: int = 0
    written: bool = False
    summaries: dict[str, str] = field(default_factory=dict)  # component id → one line
    outputs: dict[str, Any] = field(default_factory=dict)  # component id → preview (debug runs)


async def run_graph(
    graph: Graph,
    file: FileInput,
    rt: Runtime,
    report: Report,
    *,
    run_worker: WorkerCall,
    extra_parsers: dict[str, str] | None = None,
    previews: bool = False,
) -> RunResult:
    """Run every component of ``graph`` on ``file``; ``previews`` keeps each one's output (truncated)."""
    run = _Run(graph, rt, report, previews)
    run.finished(graph.source, file)
    while len(run.done) < len(graph.order):
        stage = run.worker_stage()
        if stage:
            steps = [
                (cid, graph.components[cid].type, graph.components[cid].params, graph.components[cid].inputs)
                for cid in stage
            ]
            given = {
                i: run.values[i] for cid in stage for i in graph.components[cid].inputs if i in run.values
            }
            report(run.fraction_before(stage[0]), f"{_names(graph, stage)}: running in a worker process")
            try:
                outputs = await run_worker(
                    run_worker_stage,
                    steps,
                    given,
                    rt.model,
                    dict(extra_parsers or {}),
                    rt.max_chars,
                    rt.max_chunk_chars,
                    steps=len(stage),
                )
            except PermanentError as exc:  # the worker's own end (a budget, a crash): name the stage
                if str(exc).startswith("component "):
                    raise
                raise type(exc)(f"{_names(graph, stage)}: {exc}") from None
            for cid in stage:
                run.finished(cid, outputs[cid])
            continue
        cid = run.next_ready()
        c = graph.components[cid]
        inputs = [run.values[i] for i in c.inputs]
        rt.on_progress = run.embed_progress(cid) if c.type == "Embedder" else None
        # the executor's own components hold their concatenated inputs: checked before they run
        check_held(c.label(), inputs, rt.max_chars)
        try:
            value = await REGISTRY[c.type].run(c.params, inputs, rt)  # type: ignore[misc]  # run is set on every non-source type
        except BadDocument as exc:  # e.g. the store's refusal of a chunk's metadata: name the component
            if str(exc).startswith("component "):
                raise
            raise BadDocument(f"{c.label()}: {exc}") from None
        run.finished(cid, value)
    run.result.outputs = fit_outputs(run.result.outputs) if previews else {}
    return run.result


def _names(graph: Graph, ids: Sequence[str]) -> str:
    return ", ".join(f"{cid} ({graph.components[cid].type})" for cid in ids)


class _Run:
    def __init__(self, graph: Graph, rt: Runtime, report: Report, previews: bool) -> None:
        self.graph = graph
        self.rt = rt
        self.report = report
        self.previews = previews
        self.values: dict[str, Any] = {}
        self.done: list[str] = []
        self.result = RunResult()
        weights = [WEIGHTS.get(graph.components[cid].type, 1.0) for cid in graph.order]
        total = sum(weights) or 1.0
        self.ends: dict[str, float] = {}
        running = 0.0
        for cid, w in zip(graph.order, weights, strict=True):
            running += w
            self.ends[cid] = START + (END - START) * running / total
        self.starts = {
            cid: self.ends[cid] - (END - START) * w / total
            for cid, w in zip(graph.order, weights, strict=True)
        }

    def worker_stage(self) -> list[str]:
        """Worker components whose inputs are ready or made earlier in the same stage."""
        available = set(self.done)
        stage: list[str] = []
        for cid in self.graph.order:
            c = self.graph.components[cid]
            if cid not in available and c.kind.where == WORKER and all(i in available for i in c.inputs):
                stage.append(cid)
                available.add(cid)
        return stage

    def next_ready(self) -> str:
        for cid in self.graph.order:
            if cid not in self.done and all(i in self.done for i in self.graph.components[cid].inputs):
                return cid
        raise AssertionError("a valid graph always has a ready component")

    def fraction_before(self, cid: str) -> float:
        return self.starts[cid]

    def finished(self, cid: str, value: Any) -> None:
        c = self.graph.components[cid]
        kind = self.graph.gives[cid]
        self.values[cid] = value
        self.done.append(cid)
        line = summary(kind, value)
        self.result.summaries[cid] = line
        if self.previews:
            self.result.outputs[cid] = {"type": c.type, **preview(kind, value)}
        if isinstance(value, IndexResult):
            self.result.chunk_ids = value.chunk_ids
            self.result.chunks = value.chunks
            self.result.written = value.written
        self.report(self.ends[cid], f"{cid} ({c.type}): {line}")
        for name in c.inputs:  # drop what no component still needs
            if all(k in self.done for k in self.graph.consumers[name]):
                self.values.pop(name, None)

    def embed_progress(self, cid: str) -> Callable[[int, int], None]:
        start, end = self.starts[cid], self.ends[cid]
        last_line = -EMBED_LINE_INTERVAL_S

        def on_progress(done: int, total: int) -> None:
            nonlocal last_line
            now = time.monotonic()
            fraction = start + (end - start) * done / max(total, 1)
            if done < total and now - last_line >= EMBED_LINE_INTERVAL_S:
                last_line = now
                self.report(fraction, f"{cid} (Embedder): embedded {done}/{total}")
            else:
                self.report(fraction, "")

        return on_progress


# -- summaries and previews ------------------------------------------------------------------


def summary(kind: str, value: Any) -> str:
    """One line on what a component gave."""
    if kind == FILE:
        return f"{value.name}: {len(value.data)} bytes"
    if kind == SECTIONS:
        return f"{len(value)} sections"
    if kind in (CHUNKS, EMBEDDED):
        tokens = sum(c.token_num for c in value.chunks)
        text = f"{len(value.chunks)} chunks, {tokens} tokens"
        if kind == EMBEDDED and value.vectors is not None:
            text += f", vectors of dimension {value.vectors.shape[1] if len(value.vectors) else 0}"
        return text
    if kind == INDEXED:
        if value.written:
            return f"indexed {len(value.chunk_ids)} chunks"
        return f"{value.chunks} chunks to index (debug run: nothing written)"
    return type(value).__name__


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + "…"


def preview(kind: str, value: Any, items: int = PREVIEW_ITEMS, chars: int = PREVIEW_CHARS) -> dict[str, Any]:
    """A JSON-able, truncated view of a component's output."""
    if kind == FILE:
        head = value.data[:chars].decode("utf-8", "replace")
        return {
            "kind": kind,
            "name": value.name,
            "doc_type": value.doc_type,
            "bytes": len(value.data),
            "head": head,
        }
    if kind == SECTIONS:
        sections: list[Section] = value
        shown = [{"page": s.page, "text": _cut(s.text, chars)} for s in sections[:items]]
        return {"kind": kind, "count": len(sections), "items": shown, "truncated": len(sections) > items}
    if kind in (CHUNKS, EMBEDDED):
        chunk_set: ChunkSet = value
        shown = []
        for i, c in enumerate(chunk_set.chunks[:items]):
            item = {
                "position": c.position,
                "page": c.page,
                "token_num": c.token_num,
                "text": _cut(c.content, chars),
            }
            if chunk_set.meta[i]:
                item["meta"] = chunk_set.meta[i]
            if chunk_set.vectors is not None:
                item["vector_head"] = [round(float(x), 4) for x in chunk_set.vectors[i][:4]]
            shown.append(item)
        out = {
            "kind": kind,
            "count": len(chunk_set.chunks),
            "items": shown,
            "truncated": len(chunk_set.chunks) > items,
        }
        if chunk_set.vectors is not None and len(chunk_set.vectors):
            out["dim"] = int(chunk_set.vectors.shape[1])
        return out
    if kind == INDEXED:
        result: IndexResult = value
        return {
            "kind": kind,
            "chunks": result.chunks,
            "written": result.written,
            "chunk_ids": result.chunk_ids[:items],
        }
    return {"kind": kind}


def fit_outputs(outputs: dict[str, Any], limit: int = MAX_OUTPUTS_BYTES) -> dict[str, Any]:
    """Previews cut further (fewer items, shorter texts) until all fit in ``limit`` bytes of JSON."""
    current = outputs
    while len(orjson.dumps(current)) > limit:
        shrunk = {cid: _shrink(p) for cid, p in current.items()}
        if shrunk == current:
            return {
                cid: {"type": p.get("type"), "kind": p.get("kind"), "truncated": True}
                for cid, p in current.items()
            }
        current = shrunk
    return current


def _shrink(p: dict[str, Any]) -> dict[str, Any]:
    out = dict(p)
    if out.get("items"):
        keep = max(1, len(out["items"]) // 2) if len(out["items"]) > 1 else 1
        items = []
        for item in out["items"][:keep]:
            item = dict(item)
            if "text" in item and len(item["text"]) > 40:
                item["text"] = item["text"][: len(item["text"]) // 2] + "…"
            if "meta" in item and len(orjson.dumps(item["meta"])) > 200:
                item["meta"] = {"truncated": True}
            items.append(item)
        out["items"] = items
        out["truncated"] = True
    if out.get("head") and len(out["head"]) > 40:
        out["head"] = out["head"][: len(out["head"]) // 2] + "…"
    if out.get("chunk_ids") and len(out["chunk_ids"]) > 1:
        out["chunk_ids"] = out["chunk_ids"][: len(out["chunk_ids"]) // 2]
    return out
