"""`ingest search` checks the knowledge base, then asks ingest.search and prints the hits."""

from __future__ import annotations

import json

from ingest.cli import main
from ingest.producer import submit_documents
from tests.ingest.factories import cli_args


def test_search_of_an_unknown_kb_exits_1_with_one_line(settings, capsys):
    assert main(["search", "--kb", "nope", "anything", *cli_args(settings)]) == 1
    assert capsys.readouterr().err == "ingest: no knowledge base 'nope' (tenant 'default')\n"


def test_search_of_a_kb_with_nothing_embedded_yet_prints_no_hits(settings, capsys):
    submit_documents(settings, [("a.txt", b"x")], "kb1")
    assert main(["search", "--kb", "kb1", "anything", "--json", *cli_args(settings)]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["search", "--kb", "kb1", "anything", *cli_args(settings)]) == 0
    assert "no matching chunks" in capsys.readouterr().out
