"""bulk_insert_into_db: batches, upsert keeping create_time, on MariaDB and SQLite."""

from __future__ import annotations

import pytest

from db.bulk import bulk_insert_into_db, statement_batches
from db.database import init_database, unit
from db.models import Task


@pytest.fixture(params=["mysql", "sqlite"])
def any_db(request):
    s = request.getfixturevalue("settings" if request.param == "mysql" else "sqlite_settings")
    init_database(s.db_url)
    return s


def test_upsert_keeps_create_time_and_leaves_callers_dicts(any_db):
    rows = [{"id": f"t{i:05d}", "doc_id": "d1"} for i in range(2500)]
    assert bulk_insert_into_db(Task, rows) == 2500
    assert rows[0] == {"id": "t00000", "doc_id": "d1"}
    with unit():
        created = Task.get_by_id("t00001").create_time
    bulk_insert_into_db(Task, [{"id": "t00001", "doc_id": "d2", "create_time": 1}], replace_on_conflict=True)
    with unit():
        row = Task.get_by_id("t00001")
        assert (row.doc_id, row.create_time) == ("d2", created)
        assert Task.select().count() == 2500


def test_unknown_column_is_a_clear_error(any_db):
    with pytest.raises(ValueError, match="no column"):
        bulk_insert_into_db(Task, [{"id": "x", "nope": 1}])


def test_without_replace_a_conflict_raises(any_db):
    bulk_insert_into_db(Task, [{"id": "x"}])
    with pytest.raises(Exception):  # noqa: B017 - IntegrityError from either driver
        bulk_insert_into_db(Task, [{"id": "x"}])


def test_rows_larger_than_one_packet_in_all_go_in_batches_cut_by_bytes(any_db):
    """Twenty tasks of 1 MB each are 20 MB: one INSERT would pass MySQL's max_allowed_packet
    (16 MiB by default), so the batch is cut by the rows' text, not only their count."""
    text = "x" * 1_000_000
    rows = [{"id": f"big{i:02d}", "payload": {"content": text}} for i in range(20)]
    # each about 2 MB of statement (escaping may double text): two a batch under 4 MiB
    assert [len(b) for b in statement_batches(rows, 1000)] == [2] * 10
    # counted in UTF-8 bytes, not characters: a million "é" are 2 MB of text, 4 MB escaped
    accented = [{"id": f"e{i}", "payload": {"content": "é" * 1_000_000}} for i in range(3)]
    assert [len(b) for b in statement_batches(accented, 1000)] == [1, 1, 1]
    assert bulk_insert_into_db(Task, rows) == 20
    with unit():
        assert Task.get_by_id("big19").payload == {"content": text}
