"""Tenants' limits at submit: refused before anything is written, typed, overrides only stored."""

from __future__ import annotations

import peewee
import pytest

from db.database import unit
from db.models import CANCELLED, DocumentBlob, Task, Tenant
from ingest.api.dashboard import reads
from ingest.cli import main
from ingest.control import cancel, retry
from ingest.errors import NotFound, SubmissionTooLarge, TenantQueueFull
from ingest.producer import enqueue_tasks, submit_documents
from ingest.tenants import limits_of, set_limits, standings, unfinished_count
from tests.helpers import waiting


def _written(rclient, keys, tenant: str) -> tuple[int, int, int]:
    """(task rows, blob parts, messages waiting) of a tenant."""
    with unit():
        tasks = Task.select().where(Task.tenant_id == tenant).count()
        blobs = DocumentBlob.select(peewee.fn.COUNT(DocumentBlob.location)).scalar()
    return tasks, blobs, waiting(rclient, keys, (tenant,))


def test_a_submit_over_the_queued_cap_writes_no_row_no_blob_and_no_entry(settings, rclient, keys):
    set_limits(settings, "acme", {"max_queued": 2})
    submit_documents(settings, [("a.txt", b"one"), ("b.txt", b"two")], "kb", tenant_id="acme")
    before = _written(rclient, keys, "acme")
    assert before == (2, 2, 2)
    with pytest.raises(TenantQueueFull) as refused:
        submit_documents(settings, [("c.txt", b"three")], "kb", tenant_id="acme")
    assert (refused.value.limit, refused.value.maximum, refused.value.count) == ("max_queued", 2, 2)
    assert "2 unfinished" in str(refused.value)
    assert _written(rclient, keys, "acme") == before


def test_a_submit_that_passes_the_cap_only_once_its_tasks_are_counted_leaves_nothing_either(
    settings, rclient, keys
):
    # one queued of three: the count before storing (one more document at least) passes; the
    # count in the transaction (two more) does not, and the bytes it had stored are removed
    set_limits(settings, "acme", {"max_queued": 2})
    submit_documents(settings, [("a.txt", b"one")], "kb", tenant_id="acme")
    before = _written(rclient, keys, "acme")
    with pytest.raises(TenantQueueFull) as refused:
        submit_documents(settings, [("b.txt", b"two"), ("c.txt", b"three")], "kb", tenant_id="acme")
    assert (refused.value.count, refused.value.adding) == (1, 2)
    assert _written(rclient, keys, "acme") == before


def test_a_resubmitted_document_replaces_its_queued_task_within_the_cap(settings, rclient, keys):
    set_limits(settings, "acme", {"max_queued": 1})
    submit_documents(settings, [("a.txt", b"one")], "kb", tenant_id="acme")
    again = submit_documents(settings, [("a.txt", b"one, edited")], "kb", tenant_id="acme")
    assert again.cancelled == 1 and len(again.task_ids) == 1


def test_more_documents_than_max_docs_are_refused_before_any_is_read(settings, rclient, keys, tmp_path):
    set_limits(settings, "acme", {"max_docs": 2})
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("a", "b", "c"):
        (folder / f"{name}.txt").write_text(name)
    with pytest.raises(SubmissionTooLarge) as refused:
        submit_documents(settings, [folder], "kb", tenant_id="acme")
    assert (refused.value.limit, refused.value.maximum, refused.value.count) == ("max_docs", 2, 3)
    assert _written(rclient, keys, "acme") == (0, 0, 0)


def test_enqueue_tasks_is_held_to_each_tenant_s_queued_cap(settings, rclient, keys):
    set_limits(settings, "small", {"max_queued": 1})
    with pytest.raises(TenantQueueFull):
        enqueue_tasks(settings, [{"task_type": "noop", "tenant_id": "small"} for _ in range(2)])
    assert _written(rclient, keys, "small")[0] == 0
    enqueue_tasks(settings, [{"task_type": "noop", "tenant_id": "small"}, {"task_type": "noop"}])


def test_only_overrides_are_stored_so_a_changed_default_reaches_old_tenants(settings):
    set_limits(settings, "acme", {"max_running": 7})
    with unit():
        row = Tenant.get_by_id("acme")
    assert (row.max_running, row.max_queued, row.max_docs) == (7, None, None)
    changed = settings.replace(tenant_max_queued=50, tenant_max_running=3)
    limits = limits_of(changed, "acme")
    assert (limits.max_running, limits.max_queued, limits.overrides) == (7, 50, {"max_running": 7})
    set_limits(settings, "acme", {"max_running": None})
    assert limits_of(changed, "acme").max_running == 3


def test_a_bad_tenant_id_or_limit_is_refused(settings):
    for bad in ("a b:c", "acme\n", "", "x" * 65):
        with pytest.raises(ValueError, match="tenant id"):
            submit_documents(settings, [("a.txt", b"x")], "kb", tenant_id=bad)
    with pytest.raises(ValueError, match="0 or more"):
        set_limits(settings, "acme", {"max_running": -1})
    with pytest.raises(ValueError, match="unknown limit"):
        set_limits(settings, "acme", {"max_bananas": 1})


def test_the_cli_sets_shows_and_resets_limits_and_fleet_shows_tenants(settings, capsys, rclient, keys):
    args = [
        "--db-url",
        settings.db_url,
        "--redis-url",
        settings.redis_url,
        "--key-prefix",
        settings.key_prefix,
    ]
    assert main(["tenant", "limits", "acme", "--max-running", "0", "--max-queued", "10", *args]) == 0
    out = capsys.readouterr().out
    assert "max_running = 0 (paused) (override)" in out and "max_queued = 10 (override)" in out
    submit_documents(settings, [("a.txt", b"one")], "kb", tenant_id="acme")
    assert main(["fleet", "--json", "--tenants", *args]) == 0
    import orjson

    data = orjson.loads(capsys.readouterr().out)
    (acme,) = [t for t in data["tenants"] if t["tenant_id"] == "acme"]
    assert acme["queued"] == 1 and acme["paused"] and acme["max_queued"] == 10 and acme["backlog"] == 1
    assert main(["tenant", "limits", "acme", "--max-running", "default", *args]) == 0
    assert "max_running = 5 (default)" in capsys.readouterr().out
    assert main(["status", *args]) == 0
    assert "acme" in capsys.readouterr().out
    assert [s.tenant_id for s in standings(settings)] == ["acme"]


def test_the_same_tasks_sent_again_at_the_cap_are_not_refused(settings, rclient, keys):
    """A client retrying a call that timed out sends the same ids: the unfinished ones are left
    as they are, so they add nothing to the count."""
    set_limits(settings, "small", {"max_queued": 2})
    tasks = [{"id": f"{i}" * 32, "task_type": "noop", "tenant_id": "small"} for i in (1, 2)]
    assert enqueue_tasks(settings, tasks) == [t["id"] for t in tasks]
    assert enqueue_tasks(settings, tasks) == [t["id"] for t in tasks]
    assert _written(rclient, keys, "small")[0] == 2
    with pytest.raises(TenantQueueFull):  # one new task still passes the cap
        enqueue_tasks(settings, [*tasks, {"task_type": "noop", "tenant_id": "small"}])


def test_a_tenant_s_retry_is_held_to_its_queued_cap_and_an_operator_s_is_not(settings, rclient, keys):
    set_limits(settings, "acme", {"max_queued": 2})
    first = submit_documents(settings, [("a.txt", b"one"), ("b.txt", b"two")], "kb", tenant_id="acme")
    doc_ids = [d.id for d in first.documents]
    for doc_id in doc_ids:
        cancel(settings, doc_id, tenant_id="acme")
    submit_documents(settings, [("c.txt", b"three"), ("d.txt", b"four")], "kb", tenant_id="acme")
    before = _written(rclient, keys, "acme")
    with pytest.raises(TenantQueueFull) as refused:
        retry(settings, doc_ids[0], tenant_id="acme")
    assert (refused.value.count, refused.value.adding) == (2, 1)
    assert _written(rclient, keys, "acme") == before
    with unit():
        assert Task.get_by_id(first.task_ids[0]).status == CANCELLED  # nothing re-queued
    # the operator (no tenant) re-queues past the cap: a repair, not a tenant's submission
    assert retry(settings, doc_ids[0]).task_ids == [first.task_ids[0]]


def test_tenant_ids_differing_only_in_case_are_two_tenants(settings, rclient, keys):
    """The database compares tenant ids exactly, as Python and Redis do: "acme" neither reads
    "ACME"'s documents nor shares its queued cap or its limits row."""
    set_limits(settings, "ACME", {"max_queued": 1})
    theirs = submit_documents(settings, [("secret.txt", b"ACME's secret")], "kb", tenant_id="ACME")
    submit_documents(settings, [("mine.txt", b"acme's own")], "kb", tenant_id="acme")  # not ACME's cap
    rows, _ = reads.documents_page(settings, reads.Filters(tenant="acme"))
    assert [(r["name"], r["tenant_id"]) for r in rows] == [("mine.txt", "acme")]
    with unit():
        assert unfinished_count("acme") == 1 and unfinished_count("ACME") == 1
        assert Tenant.select().where(Tenant.id == "acme").count() == 0
    assert limits_of(settings, "acme").max_queued != 1
    with pytest.raises(NotFound):
        enqueue_tasks(settings, [{"doc_id": theirs.documents[0].id, "tenant_id": "acme"}])
