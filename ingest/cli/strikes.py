"""``ingest strike``, ``ingest restore``, ``ingest strikes``: hold matching tasks, release them, list rules.

ingest strike parse                      # hold every parse task
ingest strike parse doc_type == pdf      # hold parse tasks of PDF documents
ingest strike tenant_id == acme          # hold every task of one tenant
ingest strike parse size '>' 50000000    # quote < and > for the shell
ingest restore parse doc_type == pdf     # or: ingest restore --id 3
ingest strikes [--all] [--json]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from db.config import Settings
from ingest.cli.common import EXIT_FAILED, EXIT_OK, GlobalOptions, err, json_out, new_console, out

RULE_HELP = "TASK_TYPE, FIELD OP VALUE, or TASK_TYPE FIELD OP VALUE"


def rule_parts(words: list[str]) -> tuple[str | None, str | None, str | None, str | None]:
    """``[TASK_TYPE] [FIELD OP VALUE]`` → (task_type, field, op, value)."""
    if len(words) == 1:
        return words[0], None, None, None
    if len(words) == 3:
        return None, words[0], words[1], words[2]
    if len(words) == 4:
        return words[0], words[1], words[2], words[3]
    raise ValueError(f"a rule is {RULE_HELP}; got {len(words)} word(s): {' '.join(words)}")


def cmd_strike(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.strikes import strike

    result = strike(settings, *rule_parts(args.rule))
    if args.json:
        json_out(result.to_dict())
    else:
        rule = result.rule
        if result.created:
            out(f"struck #{rule['id']}: {rule['rule']}; executors hold matching tasks within a second")
        else:
            out(f"already in effect: #{rule['id']}: {rule['rule']}")
    if not result.mirrored:
        err(
            "the rule is stored, but its Redis mirror could not be updated: executors apply it on "
            "their next Redis reconnect, or within 30 s"
        )
        return EXIT_FAILED
    return EXIT_OK


def cmd_restore(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.strikes import restore

    if (args.id is None) == (not args.rule):
        raise ValueError(f"restore takes a rule ({RULE_HELP}) or --id N, not both")
    if args.id is not None:
        result = restore(settings, strike_id=args.id)
    else:
        result = restore(settings, *rule_parts(args.rule))
    if args.json:
        json_out(result.to_dict())
    else:
        names = ", ".join(f"#{r['id']}: {r['rule']}" for r in result.rules)
        live = len(result.task_ids) - result.published
        also = f" ({live} still had a stream entry)" if live else ""
        out(
            f"restored {names}; released {len(result.task_ids)} held task(s), {result.published} published{also}"
        )
    if not result.mirrored:
        err("the Redis mirror could not be updated: executors see the change on their next reconnect")
        return EXIT_FAILED
    return EXIT_OK


def cmd_strikes(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.strikes import list_strikes

    rules = list_strikes(settings, include_inactive=args.all)
    if args.json:
        json_out(rules)
        return EXIT_OK
    console = new_console()
    if not rules:
        console.print("no strikes in effect" if not args.all else "no strikes")
        return EXIT_OK
    from rich.table import Table

    table = Table(title=f"{len(rules)} strike(s)")
    for column in ("id", "task type", "condition", "held", "since", "state"):
        table.add_column(column, justify="right" if column in ("id", "held") else "left")
    for r in rules:
        cond = f"{r['field']} {r['op']} {r['value']}" if r["field"] else "every task"
        table.add_row(
            f"#{r['id']}",
            r["task_type"] or "any",
            cond,
            str(r["held"]),
            _ago(r["create_time"]),
            "active" if r["active"] else "restore unfinished: run it again" if r["held"] else "restored",
        )
    console.print(table)
    return EXIT_OK


def _ago(ms: Any) -> str:
    seconds = max(0.0, time.time() - int(ms or 0) / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    def verb(name: str, func: Callable[[Settings, argparse.Namespace], int], text: str) -> Any:
        sub = verbs.add_parser(name, help=text, description=text)
        sub.set_defaults(func=func)
        sub.add_argument("--json", action="store_true", help="print JSON on stdout")
        global_options(sub, in_verb=True)
        return sub

    ops = "operators == != < <= > >= (quote < and > for the shell)"
    sub = verb(
        "strike",
        cmd_strike,
        "Hold tasks a rule matches instead of running them (not run, not lost): a task type, a "
        f"condition FIELD OP VALUE over task or document fields ({ops}), or both.",
    )
    sub.add_argument("rule", nargs="+", metavar="WORD", help=RULE_HELP)
    sub = verb(
        "restore",
        cmd_restore,
        "Lift a strike: deactivate the rule, then set every task it held queued and publish it.",
    )
    sub.add_argument("rule", nargs="*", metavar="WORD", help=f"the rule as struck: {RULE_HELP}")
    sub.add_argument("--id", type=int, metavar="N", help="the rule's id (see ingest strikes)")
    sub = verb("strikes", cmd_strikes, "The strike rules in effect, with how many tasks each holds.")
    sub.add_argument("--all", action="store_true", help="restored rules too")
