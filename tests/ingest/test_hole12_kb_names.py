"""Issue 12, hole 12: one rule for knowledge-base names on both backends, in one place
(``ingest.ids.kb_key``): names compare case-insensitively and without trailing spaces, the
display name stays as first given; nothing else (accents, inner spaces) is folded."""

from __future__ import annotations

import pytest

from db.database import unit
from db.models import Document, KnowledgeBase
from ingest import ids
from ingest.control import remove_kb
from ingest.errors import NotFound
from ingest.producer import submit_documents
from ingest.search import search


def _kbs() -> list[tuple[str, str, int]]:
    with unit():
        return sorted((k.id, k.name, k.doc_num) for k in KnowledgeBase.select())


def _same_kb_under_case_and_trailing_spaces(settings) -> None:
    first = submit_documents(settings, [("a.txt", b"a")], "Manuals")
    second = submit_documents(settings, [("b.txt", b"b")], "manuals")
    third = submit_documents(settings, [("c.txt", b"c")], "MANUALS  ")
    assert first.kb_id == second.kb_id == third.kb_id == ids.kb_id("default", "manuals")
    assert _kbs() == [(first.kb_id, "Manuals", 3)]  # the display name as first given
    assert search(settings, "mAnUaLs", "anything") == []  # found (nothing embedded yet)
    # accents and inner spaces are part of the name: other knowledge bases, on both backends
    other = submit_documents(settings, [("a.txt", b"a")], "Manuäls")
    spaced = submit_documents(settings, [("a.txt", b"a")], "Man uals")
    assert len({first.kb_id, other.kb_id, spaced.kb_id}) == 3
    assert len(_kbs()) == 3
    removed = remove_kb(settings, "MANUALS")
    assert removed.kb_id == first.kb_id and len(removed.doc_ids) == 3
    with unit():
        assert Document.select().where(Document.kb_id == first.kb_id).count() == 0
    with pytest.raises(NotFound):
        search(settings, "Manuals", "anything")
    assert sorted(name for _, name, _ in _kbs()) == sorted(["Manuäls", "Man uals"])


def test_kb_names_are_case_and_trailing_space_insensitive_on_mariadb(settings):
    _same_kb_under_case_and_trailing_spaces(settings)


def test_kb_names_follow_the_same_rule_on_sqlite(sqlite_settings):
    _same_kb_under_case_and_trailing_spaces(sqlite_settings)


def test_a_name_of_only_spaces_is_refused():
    with pytest.raises(ValueError):
        ids.kb_key("   ")
