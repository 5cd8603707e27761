"""ingest init's schema step: creates what is missing, changes nothing on a current schema."""

from __future__ import annotations

from db.database import init_database, unit
from db.models import Task
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


def test_hole12_init_replaces_the_unique_kb_name_index_of_an_older_schema(settings):
    # Names are told apart by the knowledge base's id (ingest.ids.kb_key); a unique index on
    # (tenant_id, name) under MySQL's collation made "Café" and "Cafe" collide.
    db = init_database(settings.db_url)
    index = "knowledge_base_tenant_id_name"
    with unit():
        db.execute_sql(f"DROP INDEX {index} ON knowledge_base")
        db.execute_sql(f"CREATE UNIQUE INDEX {index} ON knowledge_base (tenant_id, name)")
    report = init_schema(settings.db_url)
    assert report.added_indexes == [index]
    with unit():
        found = {i.name: i.unique for i in db.get_indexes("knowledge_base")}
    assert found[index] is False
    assert not init_schema(settings.db_url).changed


def test_init_drops_the_indexes_this_version_retired(settings, capsys):
    # (status) and (update_time) on task: (status, update_time) serves their queries, and each
    # was one more index entry moved on every claim and every finish
    from ingest.cli import main
    from tests.ingest.factories import cli_args

    db = init_database(settings.db_url)
    with unit():
        db.execute_sql("CREATE INDEX task_status ON task (status)")
        db.execute_sql("CREATE INDEX task_update_time ON task (update_time)")
    assert main([*cli_args(settings), "init"]) == 0
    assert "dropped index task_status" in capsys.readouterr().out
    with unit():
        names = {i.name for i in db.get_indexes("task")}
    assert not names & {"task_status", "task_update_time"} and "task_status_update_time" in names
    assert not init_schema(settings.db_url).changed


def test_init_widens_the_text_columns_this_version_made_longtext(settings, capsys):
    # version 2's task.payload was TEXT (64 KiB): a long memory message was refused at submit
    from ingest.cli import main
    from tests.ingest.factories import cli_args

    db = init_database(settings.db_url)
    with unit():
        db.execute_sql("ALTER TABLE task MODIFY payload TEXT NULL")
        db.execute_sql("ALTER TABLE dataflow MODIFY dsl TEXT NOT NULL")
        Task.insert(id="t1", payload={"a": 1}, create_time=0, update_time=0).execute()
    assert main([*cli_args(settings), "init"]) == 0
    out = capsys.readouterr().out
    assert "widened column task.payload (LONGTEXT)" in out and "widened column dataflow.dsl" in out
    with unit():
        types = {c.name: c.data_type.lower() for c in db.get_columns("task")}
        (payload,) = db.execute_sql("SELECT payload FROM task WHERE id = 't1'").fetchone()
        nullable = {c.name: c.null for c in db.get_columns("dataflow")}
    assert types["payload"] == "longtext" and types["result"] == "longtext"
    assert payload == '{"a":1}' and nullable["dsl"] is False
    assert not init_schema(settings.db_url).changed


def test_init_makes_an_older_schema_s_tenant_ids_compare_exactly(settings, capsys):
    from ingest.cli import main
    from tests.ingest.factories import cli_args

    db = init_database(settings.db_url)
    with unit():
        db.execute_sql("ALTER TABLE task MODIFY tenant_id VARCHAR(64) NOT NULL COLLATE utf8mb4_unicode_ci")
        db.execute_sql("ALTER TABLE tenant MODIFY id VARCHAR(64) NOT NULL COLLATE utf8mb4_unicode_ci")
        Task.insert(id="t1", tenant_id="ACME", create_time=0, update_time=0).execute()
        assert Task.select().where(Task.tenant_id == "acme").count() == 1  # the older schema's fault
    assert main([*cli_args(settings), "init"]) == 0
    out = capsys.readouterr().out
    assert "column task.tenant_id now compares tenant ids exactly" in out and "column tenant.id" in out
    with unit():
        assert Task.select().where(Task.tenant_id == "acme").count() == 0
        assert Task.select().where(Task.tenant_id == "ACME").count() == 1
        indexes = {i.name for i in db.get_indexes("task")} | {i.name for i in db.get_indexes("tenant")}
    assert {"task_tenant_id_status", "PRIMARY"} <= indexes
    assert not init_schema(settings.db_url).changed
