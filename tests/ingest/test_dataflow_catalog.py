"""``ingest dataflow create|list|show``: the same DSL again changes nothing, another DSL under a
taken name needs ``--replace`` (and gets a new id), and each component is shown with the
parameters in effect."""

from __future__ import annotations

import json
from pathlib import Path

from ingest.cli import main
from tests.ingest.factories import cli_args

DSL = json.loads((Path(__file__).resolve().parents[2] / "docs" / "dataflow-example.json").read_text())


def test_dataflows_are_created_once_listed_shown_and_replaced(settings, tmp_path, capsys):
    path = tmp_path / "bees.json"
    path.write_text(json.dumps(DSL))
    assert main(["dataflow", "create", "bees", "--dsl", str(path), *cli_args(settings)]) == 0
    assert main(["dataflow", "create", "bees", "--dsl", str(path), *cli_args(settings)]) == 0  # unchanged
    assert "unchanged" in capsys.readouterr().out
    assert main(["dataflow", "list", "--json", *cli_args(settings)]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["name"], listed["components"]) == ("bees", 7)
    assert main(["dataflow", "show", "bees", "--json", *cli_args(settings)]) == 0
    assert json.loads(capsys.readouterr().out)["dsl"] == DSL
    assert main(["dataflow", "show", "bees", *cli_args(settings)]) == 0
    assert "split (Splitter) ← parse  gives chunks" in capsys.readouterr().out

    other = {**DSL, "description": "changed"}
    path.write_text(json.dumps(other))
    assert main(["dataflow", "create", "bees", "--dsl", str(path), *cli_args(settings)]) == 1
    assert "already exists with another DSL" in capsys.readouterr().err
    assert (
        main(["dataflow", "create", "bees", "--dsl", str(path), "--replace", "--json", *cli_args(settings)])
        == 0
    )
    replaced = json.loads(capsys.readouterr().out)
    assert replaced["outcome"] == "replaced" and replaced["replaced_id"] == listed["id"] != replaced["id"]
