"""``ingest dead list|replay|purge``: the dead-letter stream (:mod:`ingest.dead`)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from db.config import Settings, parse_duration
from ingest.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, GlobalOptions, err, json_out, new_console, out

REASON_SHOWN = 80


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else ""


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dead import list_dead

    letters = list_dead(settings, limit=args.limit)
    if args.json:
        json_out([d.to_dict() for d in letters])
        return EXIT_OK
    if not letters:
        out("no dead letters")
        return EXIT_OK
    from rich.table import Table

    table = Table("entry", "task", "reason", "deliveries", "time", "replayed", box=None)
    for d in letters:
        reason = d.reason if len(d.reason) <= REASON_SHOWN else d.reason[:REASON_SHOWN] + "…"
        table.add_row(d.id, d.task_id or "-", reason, str(d.deliveries), _when(d.time), _when(d.replayed_at))
    console = new_console()
    console.print(table)
    console.print(f"{len(letters)} dead letter(s)")
    return EXIT_OK


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dead import replay

    if bool(args.entries) == bool(args.all):
        err("dead replay takes entry ids or --all (one of the two)")
        return EXIT_USAGE
    result = replay(settings, None if args.all else args.entries)
    if args.json:
        json_out(result.to_dict())
    else:
        for eid, tid in result.replayed:
            out(f"replayed {eid}: task {tid} queued")
        out(
            f"replayed {len(result.replayed)} dead letter(s) ({result.published} published); "
            f"skipped {len(result.skipped)}"
        )
    for eid, why in result.skipped:
        err(f"not replayed {eid}: {why}")
    # With --all, letters that cannot be replayed (malformed, task not dead) are reported, not failures.
    return EXIT_FAILED if result.skipped and not args.all else EXIT_OK


def cmd_purge(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.dead import purge

    result = purge(settings, args.older_than)
    if args.json:
        json_out(result.to_dict())
    else:
        out(f"removed {result.removed} dead letter(s) older than {args.older_than:g} s")
    return EXIT_OK


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    """``ingest dead ACTION``."""
    text = (
        "Dead letters: messages the fleet could not process (malformed, unknown type, delivered too often)."
    )
    parser = verbs.add_parser("dead", help=text, description=text)
    global_options(parser, in_verb=True)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, func: Callable[[Settings, argparse.Namespace], int], help_text: str) -> Any:
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        sub.add_argument("--json", action="store_true", help="print JSON on stdout")
        global_options(sub, in_verb=True)
        return sub

    sub = action("list", cmd_list, "Each dead letter: entry, task, reason, deliveries, time, when replayed.")
    sub.add_argument("--limit", type=int, default=None, metavar="N", help="the oldest N only")
    sub = action(
        "replay",
        cmd_replay,
        "Set each entry's dead task queued again (attempt kept) and publish it afresh; the entry "
        "stays, marked replayed.",
    )
    sub.add_argument("entries", nargs="*", metavar="ENTRY", help="dead-letter entry ids")
    sub.add_argument("--all", action="store_true", help="every dead letter not replayed yet")
    sub = action("purge", cmd_purge, "Remove dead letters older than D (the only way entries go).")
    sub.add_argument(
        "--older-than", required=True, type=_duration, metavar="D", help="an age: 7d, 12h, 30m, 0s"
    )
