"""``ingest memory save|search|show``: conversation messages as searchable memory (``ingest.memory``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from db.config import Settings
from ingest.cli.common import EXIT_FAILED, EXIT_OK, GlobalOptions, err, json_out, new_console, out


def cmd_save(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.memory import save_message

    task_id = save_message(
        settings,
        args.memory,
        args.role,
        args.content,
        source_id=args.source,
        position=args.position,
        tenant_id=args.tenant,
    )
    data: dict[str, Any] = {"task_id": task_id, "memory_id": args.memory}
    code = EXIT_OK
    if args.wait:
        from ingest.task_wait import last_line, wait_for_task

        row, ended = wait_for_task(settings, task_id, timeout_s=args.timeout)
        data.update(status=row["status"], message=last_line(row["progress_msg"]))
        if not ended:
            err(f"timed out after {args.timeout:g} s: task {task_id} is {row['status']}")
            code = EXIT_FAILED
        elif row["status"] != "done":
            err(f"task {task_id} {row['status']}: {data['message']}")
            code = EXIT_FAILED
    if args.json:
        json_out(data)
    else:
        out(f"task {task_id}" + (f" {data['status']}: {data['message']}" if "status" in data else " queued"))
    return code


def cmd_search(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.cli.model import warnings_to_stderr
    from ingest.memory import search_memory

    warnings_to_stderr()
    hits = [
        h.to_dict() for h in search_memory(settings, args.memory, args.query, k=args.k, tenant_id=args.tenant)
    ]
    if args.json:
        json_out(hits)
        return EXIT_OK
    from rich.table import Table

    table = Table("score", "role", "content", "source", box=None)
    for hit in hits:
        table.add_row(f"{hit['score']:.3f}", hit["role"], hit["content"], hit["source_id"])
    new_console().print(table if hits else f"no messages in memory {args.memory!r}")
    return EXIT_OK


def cmd_show(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.memory import conversation

    rows = conversation(settings, args.memory, tenant_id=args.tenant)
    if args.json:
        json_out(rows)
        return EXIT_OK
    from rich.text import Text

    console = new_console()
    if not rows:
        console.print(f"no messages in memory {args.memory!r}")
    for row in rows:
        console.print(Text.assemble((str(row["role"]), "bold"), ": ", str(row["content"])))
    return EXIT_OK


def cmd_rm(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.memory import remove_memory

    removed = remove_memory(settings, args.memory, tenant_id=args.tenant, source_id=args.source)
    if args.json:
        json_out({"memory_id": args.memory, "tenant_id": args.tenant, "removed": removed})
    else:
        what = f"message {args.source!r} of memory" if args.source is not None else "memory"
        out(f"removed {what} {args.memory!r}: {removed} message(s)")
    return EXIT_OK


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    """``ingest memory ACTION``."""
    text = "Memory: conversation messages saved with their embeddings, searchable by meaning."
    parser = verbs.add_parser("memory", help=text, description=text)
    global_options(parser, in_verb=True)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, func: Callable[[Settings, argparse.Namespace], int], help_text: str) -> Any:
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        sub.add_argument("--json", action="store_true", help="print JSON on stdout")
        sub.add_argument("--memory", required=True, metavar="ID", help="the memory (e.g. a conversation id)")
        sub.add_argument("--tenant", default="default", metavar="ID", help="the memory's tenant")
        global_options(sub, in_verb=True)
        return sub

    from ingest.memory import ROLES

    sub = action("save", cmd_save, "Enqueue one message; an executor embeds and stores it.")
    sub.add_argument("--role", required=True, choices=ROLES)
    sub.add_argument("--content", required=True, metavar="TEXT")
    sub.add_argument(
        "--source", default=None, metavar="ID", help="the message's id at its source (saved once)"
    )
    sub.add_argument("--position", type=int, default=None, metavar="N", help="its place (default: now)")
    sub.add_argument("--wait", action="store_true", help="wait until it is stored (or failed)")
    sub.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="with --wait: give up after S s"
    )
    sub = action("search", cmd_search, "The messages closest in meaning to QUERY.")
    sub.add_argument("query", metavar="QUERY")
    sub.add_argument("-k", type=int, default=5, metavar="N", help="how many messages (default 5)")
    action("show", cmd_show, "The conversation, in order.")
    sub = action("rm", cmd_rm, "Remove a memory's messages (with --source, that one message).")
    sub.add_argument("--source", default=None, metavar="ID", help="only the message with this source id")
