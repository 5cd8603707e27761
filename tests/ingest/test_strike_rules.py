"""Strike rules: operators over task, document and message fields, as numbers or as text."""

from __future__ import annotations

import pytest

from ingest.strikes import Rule, check_rule, compare, first_match

ROW = {"id": "t1", "tenant_id": "acme", "kb_id": "", "priority": 1, "task_type": "parse"}
DOC = {"doc_type": "pdf", "size": 5_000_000, "kb_id": "kb9", "name": "manual.pdf"}


@pytest.mark.parametrize(
    ("rule", "held"),
    [
        (Rule(1, "parse"), True),
        (Rule(1, "memory"), False),
        (Rule(1, "", "tenant_id", "==", "acme"), True),
        (Rule(1, "", "tenant_id", "!=", "acme"), False),
        (Rule(1, "parse", "doc_type", "==", "pdf"), True),
        (Rule(1, "parse", "doc_type", "==", "docx"), False),
        (Rule(1, "memory", "doc_type", "==", "pdf"), False),
        (Rule(1, "", "size", ">", "1000000"), True),  # as numbers, not as text ("5000000" < "1000000"...)
        (Rule(1, "", "size", "<=", "5e6"), True),
        (Rule(1, "", "size", "<", "5000000"), False),
        (Rule(1, "", "priority", ">=", "1"), True),
        (Rule(1, "", "priority", "<", "1"), False),
        (Rule(1, "", "kb_id", "==", "kb9"), True),  # an empty task field falls back to the document's
        (Rule(1, "", "dataflow_id", "==", "df1"), True),  # a message field
        (Rule(1, "", "memory_id", "!=", "m1"), False),  # a field no source has never matches
    ],
)
def test_a_rule_matches_by_type_and_condition(rule, held):
    assert rule.matches("parse", ROW, DOC, {"dataflow_id": "df1"}) is held


def test_text_compares_as_text_and_numbers_as_numbers():
    assert compare("b", ">", "a") and not compare("10", "<", "9") and compare("10", ">", "9")
    assert compare(1, "==", "1.0") and compare("pdf", "!=", "PDF")


def test_the_first_active_rule_that_matches_holds():
    rules = [Rule(1, "memory"), Rule(2, "", "doc_type", "==", "pdf"), Rule(3, "parse")]
    assert first_match(rules, "parse", ROW, DOC).id == 2
    assert first_match(rules[:1], "parse", ROW, DOC) is None


@pytest.mark.parametrize(
    ("parts", "error"),
    [
        ((None, None, None, None), "needs a task type"),
        (("parse", "doc_type", "==", None), "all of FIELD, OP and VALUE"),
        ((None, "colour", "==", "red"), "unknown field 'colour'"),
        ((None, "size", "=~", "1"), "unknown operator '=~'"),
    ],
)
def test_a_bad_rule_is_refused_with_the_reason(parts, error):
    with pytest.raises(ValueError, match=error):
        check_rule(*parts)


def test_a_rule_describes_itself():
    assert Rule(3, "parse", "doc_type", "==", "pdf").describe() == "strike #3: parse doc_type == pdf"
    assert Rule(4, "", "tenant_id", "==", "acme").describe() == "strike #4: any type tenant_id == acme"
    assert Rule(5, "memory").describe() == "strike #5: memory"
