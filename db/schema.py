"""Schema set-up for ``ingest init``: database, tables, missing columns, consumer group."""

from __future__ import annotations

from dataclasses import dataclass, field

import peewee
from playhouse.migrate import MySQLMigrator, SqliteMigrator, migrate

from db.database import create_database_if_missing, database, init_database, is_mysql, unit
from db.models import ALL_MODELS, TENANT_COLLATION, SchemaVersion, TenantIdField

SCHEMA_VERSION = 3
# Version 3: task.payload, task.result and dataflow.dsl widened from TEXT to LONGTEXT (a
# payload over 64 KiB, e.g. a long memory message, was refused by the database at submit);
# every tenant id column compared exactly (``TENANT_COLLATION``: "acme" read "ACME"'s rows).
_LONG_TYPES = {"LONGTEXT": ("tinytext", "text", "mediumtext"), "LONGBLOB": ("tinyblob", "blob", "mediumblob")}
# Indexes an older schema had and this one dropped, by table. Version 2: task (status) and
# task (update_time), which (status, update_time) makes redundant; each one was an index entry
# moved on every claim and every finish (MariaDB's CPU a no-op task -17 %, bench/README.md).
RETIRED_INDEXES = {"task": ("task_status", "task_update_time")}


@dataclass
class InitReport:
    """What ``init_schema`` changed; empty lists mean the schema was already current."""

    created_database: bool = False
    created_tables: list[str] = field(default_factory=list)
    added_columns: list[str] = field(default_factory=list)
    added_indexes: list[str] = field(default_factory=list)
    dropped_indexes: list[str] = field(default_factory=list)
    widened_columns: list[str] = field(default_factory=list)
    collated_columns: list[str] = field(default_factory=list)  # tenant ids made exact

    @property
    def changed(self) -> bool:
        return bool(
            self.created_database
            or self.created_tables
            or self.added_columns
            or self.added_indexes
            or self.dropped_indexes
            or self.widened_columns
            or self.collated_columns
        )


def init_schema(db_url: str) -> InitReport:
    """Create the database if missing, the tables, and the columns and indexes an older schema
    lacks; drop the indexes it had that this one retired."""
    report = InitReport(created_database=create_database_if_missing(db_url))
    init_database(db_url)
    db = database.obj
    with unit():
        existing = set(db.get_tables())
        for model in ALL_MODELS:
            table = model._meta.table_name
            if table not in existing:
                db.create_tables([model], safe=True)
                report.created_tables.append(table)
                continue
            _bring_up_to_date(db, model, report)
        _fulltext(db, report)
        row = SchemaVersion.get_or_none(SchemaVersion.id == 1)
        if row is None:
            SchemaVersion.insert(id=1, version=SCHEMA_VERSION).execute()
        elif row.version < SCHEMA_VERSION:
            SchemaVersion.update(version=SCHEMA_VERSION).where(SchemaVersion.id == 1).execute()
    return report


def _bring_up_to_date(db: peewee.Database, model: type[peewee.Model], report: InitReport) -> None:
    table = model._meta.table_name
    have = {c.name: c.data_type.lower() for c in db.get_columns(table)}
    migrator = MySQLMigrator(db) if is_mysql() else SqliteMigrator(db)
    ops = []
    for fld in model._meta.fields.values():
        if fld.column_name not in have:
            ops.append(migrator.add_column(table, fld.column_name, fld))
            report.added_columns.append(f"{table}.{fld.column_name}")
        elif is_mysql() and have[fld.column_name] in _LONG_TYPES.get(fld.field_type, ()):
            # SQLite's TEXT has no bound: only MySQL's columns are widened (by hand: peewee's
            # alter_column_type names the column twice on MySQL)
            db.execute_sql(
                f"ALTER TABLE `{table}` MODIFY `{fld.column_name}` {fld.field_type}"
                f" {'NULL' if fld.null else 'NOT NULL'}"
            )
            report.widened_columns.append(f"{table}.{fld.column_name}")
    if ops:
        migrate(*ops)
    if is_mysql():
        _collate_tenant_ids(db, model, report)
    have_indexes = {i.name: bool(i.unique) for i in db.get_indexes(table)}
    for index in model._meta.fields_to_index():
        name = index._name
        if name in have_indexes and have_indexes[name] != bool(index._unique):
            # e.g. knowledge_base (tenant_id, name), unique before names were compared by id
            db.execute_sql(f"DROP INDEX `{name}` ON `{table}`" if is_mysql() else f'DROP INDEX "{name}"')
            del have_indexes[name]
        if name not in have_indexes:
            db.execute(index.safe(True))
            report.added_indexes.append(name)
    for name in RETIRED_INDEXES.get(table, ()):
        if name in have_indexes:
            db.execute_sql(f"DROP INDEX `{name}` ON `{table}`" if is_mysql() else f'DROP INDEX "{name}"')
            report.dropped_indexes.append(name)


def _collate_tenant_ids(db: peewee.Database, model: type[peewee.Model], report: InitReport) -> None:
    """Tenant id columns of an older schema (the database's case-insensitive default) made exact."""
    table = model._meta.table_name
    fields = [f for f in model._meta.fields.values() if isinstance(f, TenantIdField)]
    if not fields:
        return
    collations = dict(
        db.execute_sql(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (table,),
        ).fetchall()
    )
    for fld in fields:
        if collations.get(fld.column_name) not in (None, TENANT_COLLATION):
            db.execute_sql(
                f"ALTER TABLE `{table}` MODIFY `{fld.column_name}` VARCHAR({fld.max_length}) NOT NULL"
                f" COLLATE {TENANT_COLLATION}"
            )
            report.collated_columns.append(f"{table}.{fld.column_name}")


FULLTEXT = ("chunk", "chunk_content_ft", "content")  # keyword search (ingest.keywords)


def _fulltext(db: peewee.Database, report: InitReport) -> None:
    """MySQL/MariaDB: the InnoDB FULLTEXT index on chunk text, added when missing (SQLite has
    none: keyword search is not offered there)."""
    if not is_mysql():
        return
    table, name, column = FULLTEXT
    if name not in {i.name for i in db.get_indexes(table)}:
        db.execute_sql(f"ALTER TABLE `{table}` ADD FULLTEXT INDEX `{name}` (`{column}`)")
        if table not in report.created_tables:  # part of creating the table, else an addition
            report.added_indexes.append(name)
