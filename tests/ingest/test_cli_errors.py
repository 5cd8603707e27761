"""The CLI explains what a person can act on in one line, without a traceback, and exits 1;
usage errors exit 2; an unreachable database or Redis exits 3."""

from __future__ import annotations

import pytest

from ingest.cli import main
from tests.ingest.factories import cli_args


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_database_unreachable(settings, capsys):
    assert main(["status", *cli_args(settings), "--db-url", "mysql://root:secret@127.0.0.1:1/x"]) == 3
    err = _one_line_error(capsys)
    assert err.startswith("ingest: database unreachable at mysql://root:***@127.0.0.1:1/x")
    assert "secret" not in err


def test_database_missing_says_run_init(settings, capsys):
    url = settings.db_url + "_missing"
    assert main(["status", *cli_args(settings), "--db-url", url]) == 1
    assert _one_line_error(capsys) == f"ingest: database missing at {url}: run `ingest init`\n"


def test_redis_unreachable(settings, capsys):
    assert main(["fleet", *cli_args(settings), "--redis-url", "redis://127.0.0.1:1/0"]) == 3
    assert _one_line_error(capsys).startswith("ingest: Redis unreachable at redis://127.0.0.1:1/0")


def test_status_shows_the_database_part_and_exits_3_without_redis(settings, capsys):
    assert main(["status", "--json", *cli_args(settings), "--redis-url", "redis://127.0.0.1:1/0"]) == 3
    out, err = capsys.readouterr()
    assert '"total": 0' in out and "Redis unreachable" in err


def test_global_options_work_before_and_after_the_verb(settings, capsys):
    assert main([*cli_args(settings), "fleet", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"


def test_usage_errors_exit_2(settings, capsys):
    for argv in (["submit", "a.txt", "--kb", "k", "--priority", "2"], ["retry"], ["rm"], []):
        with pytest.raises(SystemExit) as exited:
            main([*argv, *cli_args(settings)])
        assert exited.value.code == 2, argv
    capsys.readouterr()


def verb_paths() -> list[list[str]]:
    """Every verb of the parser, nested ones (``dataflow rm``, ``tenant limits``) by their path."""
    import argparse

    from ingest.cli.command import build_parser

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [path]
        return [p for name, sub in subs[0].choices.items() for p in walk(sub, [*path, name])]

    return walk(build_parser(), [])


def test_every_verb_has_help(capsys):
    paths = verb_paths()
    assert len(paths) > 25 and ["dataflow", "rm"] in paths and ["doctor"] in paths
    for path in paths:
        with pytest.raises(SystemExit) as exited:
            main([*path, "--help"])
        assert exited.value.code == 0, path
        text = capsys.readouterr().out
        assert "--db-url" in text and "usage: ingest " + " ".join(path) in text, path
