"""peewee models: knowledge bases, documents (and their bytes), tasks, chunks, dataflows, memories.

Times are integer milliseconds since the epoch (``now_ms``), as RAGFlow keeps them.
Task states and who writes them are in ``../shared/LIFECYCLE.md``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import peewee

from db.database import database, is_mysql

QUEUED, RUNNING, DONE, FAILED, CANCELLED, HELD, DEAD = (
    "queued",
    "running",
    "done",
    "failed",
    "cancelled",
    "held",
    "dead",
)
TASK_STATES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED, HELD, DEAD)
TERMINAL_STATES = (DONE, FAILED, CANCELLED, DEAD)
UNFINISHED_STATES = (QUEUED, RUNNING, HELD)


def now_ms() -> int:
    return int(time.time() * 1000)


class LongTextField(peewee.TextField):
    field_type = "LONGTEXT"


class LongBlobField(peewee.BlobField):
    field_type = "LONGBLOB"


class JSONField(peewee.TextField):
    """JSON stored as text (portable between MySQL and SQLite)."""

    def db_value(self, value: Any) -> str | None:
        return None if value is None else orjson.dumps(value).decode()

    def python_value(self, value: Any) -> Any:
        if value is None or value == "":
            return None
        return orjson.loads(value)


class LongJSONField(JSONField):
    """JSON of no fixed bound (MySQL's TEXT holds 64 KiB): a task's payload (a memory message of
    up to a million characters), a handler's result, a dataflow's DSL."""

    field_type = "LONGTEXT"


# Tenant ids compare as Python and Redis compare them, byte for byte: under the database's
# case-insensitive default, "acme" would read "ACME"'s rows and share its queued cap.
TENANT_COLLATION = "utf8mb4_bin"


class TenantIdField(peewee.CharField):
    """A tenant id (``db.keys.check_tenant``): compared exactly on MySQL too."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 64)
        super().__init__(**kwargs)

    def ddl(self, ctx: Any) -> Any:
        # a collation only MySQL knows (SQLite's default, BINARY, is exact already); the
        # database is known only when a table is created, not when the model is defined
        self.collation = TENANT_COLLATION if is_mysql() else None
        return super().ddl(ctx)


class BaseModel(peewee.Model):
    class Meta:
        database = database
        legacy_table_names = False

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._meta.fields}


class KnowledgeBase(BaseModel):
    id = peewee.CharField(max_length=32, primary_key=True)
    tenant_id = TenantIdField(default="default")
    name = peewee.CharField(max_length=128)
    parser_config = JSONField(default=dict)
    embedding_model = peewee.CharField(max_length=512, default="")
    embedding_dim = peewee.IntegerField(default=0)
    doc_num = peewee.IntegerField(default=0)
    chunk_num = peewee.IntegerField(default=0)
    token_num = peewee.BigIntegerField(default=0)
    note = peewee.TextField(default="")  # e.g. "chunk size 512 is longer than the model reads (256)"
    create_time = peewee.BigIntegerField(default=now_ms)
    update_time = peewee.BigIntegerField(default=now_ms)

    class Meta:
        table_name = "knowledge_base"
        # Not unique: names are told apart by the id (``ingest.ids.kb_key``), not by the
        # column's collation, which differs between MySQL (case-, accent- and trailing-space-
        # insensitive) and SQLite (binary). The index serves listing a tenant's names.
        indexes = ((("tenant_id", "name"), False),)


class Document(BaseModel):
    id = peewee.CharField(max_length=32, primary_key=True)  # derived from kb id + name
    kb_id = peewee.CharField(max_length=32, index=True)
    tenant_id = TenantIdField(default="default")
    name = peewee.CharField(max_length=255)
    doc_type = peewee.CharField(max_length=16, default="")  # extension without the dot
    size = peewee.BigIntegerField(default=0)
    content_hash = peewee.CharField(max_length=32, default="")
    location = peewee.CharField(max_length=512, default="")  # storage key of the bytes
    page_count = peewee.IntegerField(default=0)
    parser_config = JSONField(default=dict)
    generation = peewee.IntegerField(default=0)
    # random, from the first submit until removal: task ids derive from it (ingest.ids.task_id)
    incarnation = peewee.CharField(max_length=32, default="")
    run = peewee.CharField(max_length=16, default=QUEUED)  # run state of the current generation
    progress = peewee.FloatField(default=0.0)
    progress_msg = peewee.TextField(default="")
    chunk_num = peewee.IntegerField(default=0)
    token_num = peewee.BigIntegerField(default=0)
    process_duration = peewee.FloatField(default=0.0)
    create_time = peewee.BigIntegerField(default=now_ms)
    update_time = peewee.BigIntegerField(default=now_ms)

    class Meta:
        table_name = "document"
        # (kb_id, create_time) and (tenant_id, create_time): the dashboard's pages of a knowledge
        # base's or a tenant's documents, newest first, by keyset (InnoDB appends the id)
        indexes = ((("kb_id", "create_time"), False), (("tenant_id", "create_time"), False))


class DocumentBlob(BaseModel):
    """A document's bytes in parts small enough for MySQL's packet limit."""

    location = peewee.CharField(max_length=512)
    part = peewee.IntegerField()
    data = LongBlobField()

    class Meta:
        table_name = "document_blob"
        primary_key = peewee.CompositeKey("location", "part")


class Task(BaseModel):
    id = peewee.CharField(max_length=32, primary_key=True)
    doc_id = peewee.CharField(max_length=32, index=True, default="")
    kb_id = peewee.CharField(max_length=32, default="")
    tenant_id = TenantIdField(default="default")
    task_type = peewee.CharField(max_length=32, default="parse")
    priority = peewee.IntegerField(default=0)
    from_page = peewee.IntegerField(default=0)
    to_page = peewee.IntegerField(default=100000000)
    # no index of its own: (status, update_time) below serves every query on status alone, and
    # each index on status is one more entry moved on every claim and every finish
    status = peewee.CharField(max_length=16, default=QUEUED)
    progress = peewee.FloatField(default=0.0)
    progress_msg = LongTextField(default="")
    owner = peewee.CharField(max_length=255, default="")
    attempt = peewee.IntegerField(default=0)
    claim_token = peewee.CharField(max_length=32, default="", index=True)
    generation = peewee.IntegerField(default=0)
    handback_count = peewee.IntegerField(default=0)
    retry_count = peewee.IntegerField(default=0)
    digest = peewee.CharField(max_length=32, default="")
    strike_id = peewee.IntegerField(default=0)  # the strike rule holding this task (status held)
    chunk_ids = LongTextField(default="")  # space-separated
    payload = LongJSONField(null=True)  # the type's own context (memory / dataflow), re-sent on publish
    result = LongJSONField(null=True)  # what the handler returned beyond chunks (a debug run's outputs)
    begin_at = peewee.BigIntegerField(null=True)
    process_duration = peewee.FloatField(default=0.0)
    create_time = peewee.BigIntegerField(default=now_ms)
    update_time = peewee.BigIntegerField(default=now_ms)  # queried only with status: (status, update_time)

    class Meta:
        table_name = "task"
        # (tenant_id, status): a tenant's unfinished tasks, counted at submit (the queued cap);
        # (status, update_time): the reconciler's pages of old queued/running/cancelled rows and
        # ``ingest prune``'s finished rows older than a cutoff (InnoDB appends the id, so the
        # reconciler's (update_time, id) keyset needs no sort); (task_type, status): ``ingest
        # status``'s counts, read from the index alone; (doc_id, generation): a document's
        # current tasks (``ingest status DOC``, every recompute); (tenant_id | kb_id,
        # create_time): the dashboard's keyset pages.
        indexes = (
            (("tenant_id", "status"), False),
            (("status", "update_time"), False),
            (("task_type", "status"), False),
            (("doc_id", "generation"), False),
            # the dashboard's pages of a tenant's or a knowledge base's tasks, newest first
            (("tenant_id", "create_time"), False),
            (("kb_id", "create_time"), False),
        )


class Chunk(BaseModel):
    id = peewee.CharField(max_length=32, primary_key=True)  # from task id + position
    kb_id = peewee.CharField(max_length=32)  # indexed with id (below)
    doc_id = peewee.CharField(max_length=32)  # indexed with generation and token_num (below)
    task_id = peewee.CharField(max_length=32, index=True)
    generation = peewee.IntegerField(default=0)
    position = peewee.IntegerField()
    page = peewee.IntegerField(default=0)  # first page (1-based); 0: a format without pages
    last_page = peewee.IntegerField(default=0)  # the page it ends on (a chunk may span pages)
    content = LongTextField()
    token_num = peewee.IntegerField(default=0)
    vector = LongBlobField(null=True)  # float32, normalised
    meta = JSONField(null=True)
    create_time = peewee.BigIntegerField(default=now_ms)

    class Meta:
        table_name = "chunk"
        # (doc_id, generation, token_num): a document's chunks; a generation's count and tokens
        # read from the index alone; older generations found without touching the current one.
        # (kb_id, id): search's keyset blocks and ``ingest reindex`` read one knowledge base's
        # rows in id order and nothing else (``ingest.vectors``)
        indexes = ((("doc_id", "generation", "token_num"), False), (("kb_id", "id"), False))


class Dataflow(BaseModel):
    """A named pipeline: a DSL document (a graph of components, ``ingest.dataflow.dsl``)."""

    id = peewee.CharField(max_length=32, primary_key=True)  # from tenant + name + DSL
    tenant_id = TenantIdField(default="default")
    name = peewee.CharField(max_length=128)
    dsl = LongJSONField()
    create_time = peewee.BigIntegerField(default=now_ms)
    update_time = peewee.BigIntegerField(default=now_ms)

    class Meta:
        table_name = "dataflow"
        indexes = ((("tenant_id", "name"), True),)


class MemoryMessage(BaseModel):
    """One conversation message of a memory, with its embedding (``ingest.memory``)."""

    id = peewee.CharField(max_length=32, primary_key=True)  # from tenant + memory id + source id
    tenant_id = TenantIdField(default="default")  # memory ids are per tenant
    memory_id = peewee.CharField(max_length=64)
    source_id = peewee.CharField(max_length=128)
    role = peewee.CharField(max_length=16)
    content = LongTextField()
    position = peewee.BigIntegerField(default=0)  # order in the conversation
    vector = LongBlobField(null=True)  # float32, normalised
    # the identity of the model that embedded it (``ingest.ids.embedding_identity``; "" for a
    # message stored before schema 3): a memory's vectors are of one model, as a knowledge base's
    embedding_model = peewee.CharField(max_length=255, default="")
    task_id = peewee.CharField(max_length=32, default="")
    create_time = peewee.BigIntegerField(default=now_ms)
    update_time = peewee.BigIntegerField(default=now_ms)

    class Meta:
        table_name = "memory_message"
        # (memory_id, position): a conversation in order; (memory_id, id): search's keyset blocks;
        # (memory_id, embedding_model): whether a memory holds another model's vectors, read at
        # each store as a range of the index (not a scan of the memory's messages)
        indexes = (
            (("memory_id", "position"), False),
            (("memory_id", "id"), False),
            (("memory_id", "embedding_model"), False),
        )


class Strike(BaseModel):
    """A rule that holds matching tasks instead of running them (``ingest strike``).

    Empty ``task_type`` means every type; empty ``field`` means every task of the type.
    ``version`` is the rule set's version when this row last changed (mirrored in Redis).
    """

    id = peewee.AutoField()
    task_type = peewee.CharField(max_length=32, default="")
    field = peewee.CharField(max_length=64, default="")
    op = peewee.CharField(max_length=2, default="")
    value = peewee.CharField(max_length=255, default="")
    active = peewee.BooleanField(default=True, index=True)
    version = peewee.IntegerField(default=0)
    create_time = peewee.BigIntegerField(default=now_ms)
    update_time = peewee.BigIntegerField(default=now_ms)

    class Meta:
        table_name = "strike"


class Tenant(BaseModel):
    """A tenant's limit overrides (NULL: the setting's default applies, so a changed default
    reaches every tenant that has no override); also the row a submit locks to count its queue."""

    id = TenantIdField(primary_key=True)
    max_running = peewee.IntegerField(null=True)  # tasks running at once, fleet-wide; 0 = paused
    max_queued = peewee.IntegerField(null=True)  # unfinished tasks; 0 = no cap
    max_docs = peewee.IntegerField(null=True)  # documents per submission; 0 = no cap
    create_time = peewee.BigIntegerField(default=now_ms)
    update_time = peewee.BigIntegerField(default=now_ms)

    class Meta:
        table_name = "tenant"


class SchemaVersion(BaseModel):
    id = peewee.IntegerField(primary_key=True)
    version = peewee.IntegerField()

    class Meta:
        table_name = "schema_version"


ALL_MODELS: list[type[BaseModel]] = [
    KnowledgeBase,
    Document,
    DocumentBlob,
    Task,
    Chunk,
    Dataflow,
    MemoryMessage,
    Strike,
    Tenant,
    SchemaVersion,
]
