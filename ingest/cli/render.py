"""How the ``ingest`` command line shows things to a person (rich tables); ``--json`` skips it."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from ingest.status import health_text

DOCS_LISTED = 50


def _when(ms: Any) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(ms) / 1000))


def _age(seconds: Any) -> str:
    if seconds is None:
        return "?"
    seconds = float(seconds)
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def init_report(console: Console, data: dict[str, Any], *, group: str) -> None:
    said = False
    if data["created_database"]:
        console.print(f"created database {data['database']}")
        said = True
    for label, key in (("created table", "created_tables"), ("added column", "added_columns")):
        for name in data[key]:
            console.print(f"{label} {name}")
            said = True
    for name in data["added_indexes"]:
        console.print(f"added index {name}")
        said = True
    for name in data.get("collated_columns", ()):
        console.print(f"column {name} now compares tenant ids exactly (utf8mb4_bin)")
        said = True
    for name in data.get("widened_columns", ()):
        console.print(f"widened column {name} (LONGTEXT)")
        said = True
    for name in data.get("dropped_indexes", ()):
        console.print(f"dropped index {name} (retired by this version)")
        said = True
    for stream in data["created_groups"]:
        console.print(f"created consumer group {group} on {stream}")
        said = True
    export = data.get("model_export") or {}
    if export.get("state") == "made":
        console.print(
            f"made the model's ONNX export in {export['export_dir']} (minimum cosine {export['min_cosine']:.6f})"
        )
        said = True
    if not said:
        console.print(f"nothing changed: {data['database']}, its tables and the consumer group are current")


def submitted(console: Console, result: Any) -> None:
    tasks = len(result.task_ids)
    console.print(
        f"knowledge base {result.kb_name} ({result.kb_id}): {len(result.documents)} document(s), "
        f"{tasks} task(s), {result.published} published, {result.reused} reused, "
        f"{result.cancelled} older task(s) cancelled"
    )
    for doc in result.documents[:DOCS_LISTED]:
        reused = f", {doc.reused} reused" if doc.reused else ""
        console.print(
            f"  {doc.id}  {doc.name}  generation {doc.generation}, {len(doc.task_ids)} task(s){reused}"
        )
    if len(result.documents) > DOCS_LISTED:
        console.print(f"  … and {len(result.documents) - DOCS_LISTED} more (--json lists all)")


def summary(console: Console, data: dict[str, Any]) -> None:
    tasks = data["tasks"]
    statuses = [s for s, n in tasks["by_status"].items() if n] or list(tasks["by_status"])
    table = Table(title=f"tasks ({tasks['total']})")
    table.add_column("type")
    for status in statuses:
        table.add_column(status, justify="right")
    for task_type, counts in sorted(tasks["by_type"].items()):
        table.add_row(task_type, *[str(counts.get(s, 0)) for s in statuses])
    table.add_row("all", *[str(tasks["by_status"].get(s, 0)) for s in statuses], style="bold")
    console.print(table)
    docs = data["documents"]
    by_run = ", ".join(f"{n} {run}" for run, n in sorted(docs["by_run"].items())) or "none"
    console.print(f"documents: {docs['total']} ({by_run}); knowledge bases: {data['knowledge_bases']}")
    redis_part = data.get("redis") or {}
    if "streams" in redis_part:
        streams = ", ".join(
            f"{s} {v['length']} entries ({v['pending']} pending, {v.get('waiting', 0)} waiting at the gate)"
            for s, v in redis_part["streams"].items()
        )
        console.print(f"streams: {streams}; dead letters: {redis_part['dead_letters']}")
        stats = ", ".join(f"{k} {v}" for k, v in sorted(redis_part["stats"].items()))
        console.print(f"live executors: {redis_part['executors']}" + (f"; {stats}" if stats else ""))
    store = data.get("vector_store") or {}
    if store.get("error"):
        console.print(f"vector store: {store['error']}", style="red")
    elif store:
        console.print(
            f"vector store: {store['store']}, {len(store['knowledge_bases'])} knowledge base(s) compared"
        )
        for kb in store["differs"]:
            console.print(
                f"vector store lost vectors of knowledge base {kb['name']} (tenant {kb['tenant_id']}): "
                f"{kb['rows']} chunk rows, {kb['engine']} in the engine; run `ingest reindex --kb {kb['name']}`",
                style="red",
            )


def described(console: Console, data: dict[str, Any]) -> None:
    if data["kind"] == "task":
        task = data["task"]
        table = Table(title=f"task {task['id']}", show_header=False)
        table.add_column("field", style="bold")
        table.add_column("value")
        for key, value in task.items():
            if key in ("progress_msg", "chunk_ids"):
                continue
            shown = _when(value) if key.endswith("_time") or key == "begin_at" else value
            table.add_row(key, str(shown))
        console.print(table)
        console.print(task["progress_msg"] or "", markup=False)
        return
    doc = data["document"]
    console.print(
        f"document {doc['name']} ({doc['id']}) in {doc['kb_name']}: {doc['run']}, progress "
        f"{doc['progress']:.0%}, generation {doc['generation']}, {doc['size']} bytes, "
        f"{doc['page_count']} page(s), {doc['chunk_num']} chunk(s)",
        markup=False,
    )
    table = Table()
    for column in ("task", "pages", "status", "progress", "owner", "last message"):
        table.add_column(column)
    for task in data["tasks"]:
        last = (task["progress_msg"] or "").strip().splitlines()[-1:] or [""]
        pages = f"{task['from_page']}-{task['to_page']}" if task["to_page"] < 100000000 else "all"
        table.add_row(task["id"], pages, task["status"], f"{task['progress']:.0%}", task["owner"], last[0])
    console.print(table)
    if data["older_generations"]:
        older = ", ".join(f"{n} {s}" for s, n in sorted(data["older_generations"].items()))
        console.print(f"older generations: {older}")


def fleet(console: Console, beats: list[dict[str, Any]]) -> None:
    if not beats:
        console.print("no live executors")
        return
    table = Table(title=f"{len(beats)} executor(s)")
    for column in (
        "consumer",
        "host",
        "pid",
        "heartbeat",
        "running",
        "done",
        "failed",
        "rss MB",
        "state",
        "health",
    ):
        table.add_column(
            column, justify="right" if column in ("pid", "running", "done", "failed", "rss MB") else "left"
        )
    for beat in beats:
        if "error" in beat:
            table.add_row(beat["consumer"], "", "", "", "", "", "", "", beat["error"], "")
            continue
        running = beat.get("running") or []
        rss = beat.get("rss_mb")
        table.add_row(
            str(beat.get("consumer", "")),
            str(beat.get("host", "")),
            str(beat.get("pid", "")),
            _age(beat.get("age_s")) + " ago",
            str(len(running) if isinstance(running, list) else running),
            str(beat.get("done", "")),
            str(beat.get("failed", "")),
            f"{float(rss):.0f}" if isinstance(rss, (int, float)) else "",
            "draining" if beat.get("draining") else "running",
            health_text(beat.get("health")),
        )
    console.print(table)


def _pages(hit: dict[str, Any]) -> str:
    """ "" for a format without pages, "2" or "2-3" for a chunk that spans pages."""
    first, last = hit.get("page"), hit.get("last_page")
    if not first:
        return ""
    return f"{first}-{last}" if last and last != first else str(first)


def hits(console: Console, rows: list[dict[str, Any]]) -> None:
    if not rows:
        console.print("no matching chunks")
        return
    table = Table(show_lines=True)
    for column in ("#", "score", "document", "page", "text"):
        table.add_column(column)
    for rank, hit in enumerate(rows, 1):
        text = " ".join(str(hit["content"] or "").split())
        table.add_row(
            str(rank),
            f"{float(hit['score']):.3f}",
            str(hit["doc_name"]),
            _pages(hit),
            text[:300] + ("…" if len(text) > 300 else ""),
        )
    console.print(table)
