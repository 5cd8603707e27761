"""``ingest prune --older-than D``: finished task rows past their retention (``ingest.prune``)."""

from __future__ import annotations

import argparse
from typing import Any

from db.config import Settings, parse_duration
from ingest.cli.common import EXIT_OK, GlobalOptions, json_out


def cmd_prune(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.prune import prune_tasks

    result = prune_tasks(settings, parse_duration(args.older_than))
    if args.json:
        json_out(result.to_dict())
    else:
        print(
            f"removed {result.tasks_removed} finished task row(s) of superseded generations or of no "
            f"document, and {result.chunks_removed} chunk(s) only they held; cut the progress text of "
            f"{result.progress_trimmed} kept row(s) to its last line"
        )
    return EXIT_OK


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    text = (
        "Remove finished task rows that ended more than D ago (superseded generations, rows of no "
        "document) and cut the progress text of the rows kept to its last line."
    )
    sub = verbs.add_parser("prune", help=text, description=text)
    sub.set_defaults(func=cmd_prune)
    sub.add_argument(
        "--older-than", required=True, metavar="D", help="a duration: 30d, 12h, 90m, 3600 (seconds)"
    )
    sub.add_argument("--json", action="store_true", help="print JSON on stdout")
    global_options(sub, in_verb=True)
