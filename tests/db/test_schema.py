"""ingest init's schema step: creates what is missing, changes nothing on a current schema."""

from __future__ import annotations

from db.database import init_database, unit
from db.schema import init_schema


def test_init_twice_changes_nothing(settings):
    assert not init_schema(settings.db_url).changed


def test_init_adds_a_column_an_older_schema_lacks(settings):
    db = init_database(settings.db_url)
    with unit():
        db.execute_sql("ALTER TABLE task DROP COLUMN retry_count")
    report = init_schema(settings.db_url)
    assert report.added_columns == ["task.retry_count"]
    assert not init_schema(settings.db_url).changed


def test_init_adds_an_index_an_older_schema_lacks(settings):
    db = init_database(settings.db_url)
    with unit():
        db.execute_sql("DROP INDEX memory_message_memory_id_id ON memory_message")
    report = init_schema(settings.db_url)
    assert report.added_indexes == ["memory_message_memory_id_id"] and report.changed
    with unit():
        names = {i.name: i.columns for i in db.get_indexes("memory_message")}
    assert names["memory_message_memory_id_id"] == ["memory_id", "id"]
    assert not init_schema(settings.db_url).changed
