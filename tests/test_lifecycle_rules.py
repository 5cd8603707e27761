"""Every rule of shared/LIFECYCLE.md (as tests/lifecycle.py names them) has a test that names it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.lifecycle import RULES

TESTS = Path(__file__).parent


def _named_rules() -> dict[str, list[str]]:
    """rule name -> the tests (path::function) decorated with ``@rule(...)`` naming it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name) and deco.func.id == "rule":
                    assert node.name.startswith("test_"), f"{path}:{node.lineno} @rule on a non-test"
                    for arg in deco.args:
                        assert isinstance(arg, ast.Constant), (
                            f"{path}:{node.lineno} names a rule by a literal"
                        )
                        found[arg.value].append(f"{path.relative_to(TESTS)}::{node.name}")
    return found


def test_every_lifecycle_rule_has_a_test_that_names_it():
    named = _named_rules()
    assert sorted(set(named) - set(RULES)) == []  # rule() refuses these at import, too
    assert [r for r in RULES if r not in named] == []


def test_the_rules_cover_every_section_of_the_lifecycle():
    sections = {name.split(".")[0] for name in RULES}
    assert sections == {
        "states", "fact", "publish", "read", "validate", "claim", "finish", "errors",
        "lease", "cancel", "strikes", "chunks", "keys",
    }  # fmt: skip
