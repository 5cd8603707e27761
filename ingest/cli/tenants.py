"""``ingest tenant limits|list``, ``ingest results clear`` and ``ingest serve``: the shared fleet's verbs."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from db.config import Settings, parse_duration
from ingest.cli.common import EXIT_OK, GlobalOptions, json_out, new_console, out

DEFAULT = "default"


def _limit_value(text: str) -> int | None:
    """A limit flag: a whole number (0 or more), or ``default`` to drop the override."""
    if text.strip().lower() == DEFAULT:
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number or 'default', not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"0 or more, not {value}")
    return value


def cmd_limits(settings: Settings, args: argparse.Namespace) -> int:
    from ingest import tenants

    changes = {name: getattr(args, name) for name in tenants.LIMITS if hasattr(args, name)}
    if changes:
        limits = tenants.set_limits(settings, args.tenant, changes)
    else:
        limits = tenants.limits_of(settings, args.tenant)
    if args.json:
        json_out(limits.to_dict())
        return EXIT_OK
    for name in tenants.LIMITS:
        value = getattr(limits, name)
        source = "override" if name in limits.overrides else "default"
        shown = "no cap" if value == 0 and name != "max_running" else str(value)
        if name == "max_running" and value == 0:
            shown = "0 (paused)"
        out(f"{args.tenant} {name} = {shown} ({source})")
    return EXIT_OK


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.tenants import standings

    rows = [s.to_dict() for s in standings(settings)]
    if args.json:
        json_out(rows)
    else:
        render_standings(new_console(), rows)
    return EXIT_OK


def render_standings(console: Any, rows: list[dict[str, Any]]) -> None:
    """The per-tenant table of ``ingest fleet``, ``status`` and ``tenant list``."""
    from rich.table import Table

    if not rows:
        console.print("no tenants with work")
        return
    table = Table(
        "tenant", "queued", "running", "held", "slots", "waiting at gate", "limit", "state", box=None
    )
    for r in rows:
        state = "paused" if r["paused"] else "at cap" if r["parked"] else ""
        limit = str(r["max_running"]) + (f", queued ≤ {r['max_queued']}" if r["max_queued"] else "")
        table.add_row(
            r["tenant_id"],
            str(r["queued"]),
            str(r["running"]),
            str(r["held"]),
            str(r["slots"]),
            str(r["backlog"]),
            limit,
            state,
        )
    console.print(table)


def cmd_clear(settings: Settings, args: argparse.Namespace) -> int:
    from db.keys import Keys
    from db.results import Results
    from db.streams import connect

    older_ms = int(parse_duration(args.older_than) * 1000) if args.older_than else None
    client = connect(settings)
    try:
        removed = Results(client, Keys(settings.key_prefix)).clear(
            older_than_ms=older_ms, now_ms=int(time.time() * 1000), tenant_id=args.tenant
        )
    finally:
        client.close()
    if args.json:
        json_out({"removed": removed})
    else:
        out(f"removed {removed} result(s)")
    return EXIT_OK


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.api.server import serve

    serve(
        settings,
        host=args.host or settings.api_host,
        port=args.port if args.port is not None else settings.api_port,
        workers=args.workers or settings.api_workers,
    )
    return EXIT_OK


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    def verb(parent: Any, name: str, func: Callable[..., int], text: str, *, json: bool = True) -> Any:
        sub = parent.add_parser(name, help=text, description=text)
        sub.set_defaults(func=func)
        if json:
            sub.add_argument("--json", action="store_true", help="print JSON on stdout")
        global_options(sub, in_verb=True)
        return sub

    tenant = verbs.add_parser("tenant", help="tenants' limits and standing", description="Tenants.")
    actions = tenant.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub = verb(
        actions,
        "limits",
        cmd_limits,
        "Show a tenant's limits, or set overrides (a number, or 'default' to drop one). "
        "--max-running 0 pauses the tenant.",
    )
    sub.add_argument("tenant", metavar="TENANT")
    for name, text in (
        ("max_running", "tasks running at once across the fleet (0 = paused)"),
        ("max_queued", "unfinished tasks; over it a submit is refused (0 = no cap)"),
        ("max_docs", "documents per submission (0 = no cap)"),
    ):
        sub.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=_limit_value,
            default=argparse.SUPPRESS,
            metavar="N|default",
            help=text,
        )
    verb(actions, "list", cmd_list, "Every tenant with work: queued, running, slots, limits, paused.")

    results = verbs.add_parser("results", help="finished tasks' results", description="Results.")
    actions = results.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub = verb(actions, "clear", cmd_clear, "Remove results now (all, or those older than D).")
    sub.add_argument("--older-than", metavar="D", help="only results finished more than D ago (7d, 12h)")
    sub.add_argument("--tenant", metavar="ID", help="only this tenant's results")

    sub = verb(
        verbs,
        "serve",
        cmd_serve,
        "Serve the HTTP API (FastAPI on Hypercorn's trio worker); binds 127.0.0.1 by default.",
        json=False,
    )
    sub.add_argument("--host", metavar="ADDR", help="address to bind (INGEST_API_HOST)")
    sub.add_argument("--port", type=int, metavar="N", help="port (INGEST_API_PORT)")
    sub.add_argument("--workers", type=int, metavar="N", help="worker processes (INGEST_API_WORKERS)")
