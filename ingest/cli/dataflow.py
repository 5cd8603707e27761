"""``ingest dataflow create|list|show|rm|run``: named pipelines described as data (``ingest.dataflow``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from db.config import Settings
from ingest.cli.common import EXIT_FAILED, EXIT_OK, GlobalOptions, err, json_out, new_console, out, safe_text


def cmd_create(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dataflow.catalog import create_dataflow

    try:
        with open(args.dsl, "rb") as fh:
            dsl = json.load(fh)
    except OSError as exc:
        raise ValueError(f"cannot read {args.dsl}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{args.dsl} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    made = create_dataflow(settings, args.name, dsl, tenant_id=args.tenant, replace=args.replace)
    if args.json:
        json_out(made.to_dict())
    else:
        also = f" (was {made.replaced_id})" if made.replaced_id else ""
        out(f"dataflow {made.name!r} {made.outcome}: id {made.id}, {made.components} components{also}")
    return EXIT_OK


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dataflow.catalog import list_dataflows

    rows = list_dataflows(settings, None if args.all_tenants else args.tenant)
    if args.json:
        json_out(rows)
        return EXIT_OK
    from rich.table import Table

    table = Table("name", "tenant", "id", "components", "updated", box=None)
    for row in rows:
        table.add_row(
            row["name"], row["tenant_id"], row["id"], str(row["components"]), _when(row["update_time"])
        )
    console = new_console()
    console.print(table if rows else "no dataflows")
    return EXIT_OK


def cmd_rm(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dataflow.catalog import remove_dataflow

    removed = remove_dataflow(settings, args.name, tenant_id=args.tenant, force=args.force)
    if args.json:
        json_out(removed)
    else:
        failing = removed["unfinished_tasks"]
        also = f"; its {failing} unfinished task(s) will fail" if failing else ""
        out(f"removed dataflow {removed['name']!r} (id {removed['id']}){also}")
    return EXIT_OK


def cmd_show(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dataflow.catalog import get_dataflow, graph_of
    from ingest.dataflow.dsl import describe

    row = get_dataflow(settings, args.name, tenant_id=args.tenant)
    if args.json:
        json_out(row)
        return EXIT_OK
    out(
        f"dataflow {row['name']!r} (tenant {row['tenant_id']}), id {row['id']}, updated {_when(row['update_time'])}"
    )
    if row["dsl"].get("description"):
        out(row["dsl"]["description"])
    for c in describe(graph_of(row)):
        inputs = f" ← {', '.join(c['inputs'])}" if c["inputs"] else ""
        params = " ".join(f"{k}={json.dumps(v)}" for k, v in c["params"].items() if v is not None)
        out(f"  {c['id']} ({c['type']}){inputs}  gives {c['gives']}  {params}".rstrip())
    return EXIT_OK


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dataflow.debug import run_debug

    def queued(task_id: str) -> None:
        if not args.json:
            print(
                safe_text(f"debug run of {args.name!r} on {args.path}: task {task_id} queued"),
                file=sys.stderr,
            )

    run = run_debug(
        settings, args.name, args.path, tenant_id=args.tenant, timeout_s=args.timeout, on_queued=queued
    )
    if args.json:
        json_out(run.to_dict())
    else:
        for cid, output in run.outputs.items():
            out(f"── {cid} ({output.get('type')})")
            out(json.dumps({k: v for k, v in output.items() if k != "type"}, indent=2, ensure_ascii=False))
        out(f"task {run.task_id} {run.status}: {run.message}")
    if not run.ended:
        err(f"timed out after {args.timeout:g} s: task {run.task_id} {run.status}, its stored bytes removed")
        return EXIT_FAILED
    if run.status != "done":
        err(f"debug run {run.status}: {run.message}")
        return EXIT_FAILED
    return EXIT_OK


def _when(ms: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else ""


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    """``ingest dataflow ACTION``: its actions under one verb."""
    text = (
        "Dataflows: pipelines of components (File, Parser, Splitter, Extractor, Embedder, Indexer) as JSON."
    )
    parser = verbs.add_parser("dataflow", help=text, description=text)
    global_options(parser, in_verb=True)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, func: Callable[[Settings, argparse.Namespace], int], help_text: str) -> Any:
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        sub.add_argument("--json", action="store_true", help="print JSON on stdout")
        sub.add_argument("--tenant", default="default", metavar="ID", help="the dataflow's tenant")
        global_options(sub, in_verb=True)
        return sub

    sub = action("create", cmd_create, "Check a DSL file and store it under NAME.")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("--dsl", required=True, metavar="FILE.json", help="the DSL (see README, Dataflow DSL)")
    sub.add_argument(
        "--replace", action="store_true", help="replace a dataflow of that name (it gets a new id)"
    )
    sub = action("list", cmd_list, "The stored dataflows.")
    sub.add_argument("--all-tenants", action="store_true", help="of every tenant")
    sub = action("show", cmd_show, "One dataflow: its DSL and the parameters in effect.")
    sub.add_argument("name", metavar="NAME", help="its name (or id)")
    sub = action(
        "rm",
        cmd_rm,
        "Remove a dataflow (refused while unfinished tasks use it, unless --force; its chunks stay).",
    )
    sub.add_argument("name", metavar="NAME", help="its name (or id)")
    sub.add_argument(
        "--force", action="store_true", help="remove it even while unfinished tasks use it (they fail)"
    )
    sub = action(
        "run",
        cmd_run,
        "Debug run: send PATH through dataflow NAME on the fleet, index nothing, print each component's output.",
    )
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("path", metavar="PATH")
    sub.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="give up waiting after S s (600)"
    )
