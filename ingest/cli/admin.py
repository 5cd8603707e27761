"""``ingest config`` (the settings in effect and where each came from), ``ingest doctor`` (what
the setup lacks, and the fix) and ``ingest completion bash|zsh|tcsh`` (a shell completion
script, written by shtab from this very parser)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from db.config import Settings, setting_sources
from ingest.cli.common import EXIT_FAILED, EXIT_OK, GlobalOptions, global_overrides, json_out, new_console

SHELLS = ("bash", "zsh", "tcsh")


def cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    rows = setting_sources(os.environ, **global_overrides(args))
    if args.json:
        json_out({r["name"]: {k: r[k] for k in ("value", "source", "env")} for r in rows})
        return EXIT_OK
    from rich.table import Table

    table = Table("setting", "value", "source", "environment variable", box=None, pad_edge=False)
    for r in rows:
        table.add_row(r["name"], str(r["value"]), r["source"], r["env"])
    new_console().print(table)
    return EXIT_OK


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.doctor import examine

    findings = examine(settings)
    problems = [f for f in findings if not f.ok]
    if args.json:
        json_out({"ok": not problems, "findings": [f.to_dict() for f in findings]})
    else:
        console = new_console()
        for f in findings:
            mark = "ok     " if f.ok else "PROBLEM"
            console.print(f"{mark} {f.check}: {f.detail}", style=None if f.ok else "bold red")
            if f.fix:
                console.print(f"        fix: {f.fix}")
        console.print(f"{len(problems)} problem(s)" if problems else "no problem found")
    return EXIT_FAILED if problems else EXIT_OK


def cmd_completion(settings: Settings, args: argparse.Namespace) -> int:
    import shtab

    from ingest.cli.command import build_parser

    print(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    def verb(name: str, func: Any, text: str, *, json: bool = True) -> Any:
        sub = verbs.add_parser(name, help=text, description=text)
        sub.set_defaults(func=func)
        if json:
            sub.add_argument("--json", action="store_true", help="print JSON on stdout")
        global_options(sub, in_verb=True)
        return sub

    sub = verb(
        "config",
        cmd_config,
        "The settings in effect, each with its source (flag, environment, default); secrets redacted.",
    )
    sub.set_defaults(needs_services=False)
    verb(
        "doctor",
        cmd_doctor,
        "Check Redis (version, persistence, maxmemory-policy), the database (version, schema), the "
        "model files, the parsers and the disk; say what to fix (exit status 1 on a problem).",
    )
    sub = verb(
        "completion",
        cmd_completion,
        "Print a shell completion script: `ingest completion bash > ~/.local/share/bash-completion/"
        "completions/ingest`, or `ingest completion zsh > ~/.zfunc/_ingest`.",
        json=False,
    )
    sub.add_argument("shell", choices=SHELLS, help="the shell")
    sub.set_defaults(needs_services=False)
