"""Issue 12 hole 15: on SQLite (WAL) a unit of work begins IMMEDIATE, so one that reads and then
writes waits for another writer (the busy timeout) instead of failing at once with "database is
locked" because that writer committed after its read."""

from __future__ import annotations

import threading
import time

from db.database import init_database, unit
from db.models import KnowledgeBase


def test_a_unit_that_reads_then_writes_waits_for_another_writer_instead_of_failing(sqlite_settings):
    init_database(sqlite_settings.db_url)
    with unit():
        KnowledgeBase.insert(id="kb1", name="one", doc_num=0).execute()
    read_done, other_started = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def reader_then_writer() -> None:
        try:
            with unit():
                seen = KnowledgeBase.get_by_id("kb1").doc_num  # the read
                read_done.set()
                other_started.wait(5)
                time.sleep(0.3)  # the other writer tries to write and commit meanwhile
                KnowledgeBase.update(doc_num=seen + 1).where(KnowledgeBase.id == "kb1").execute()
        except BaseException as exc:
            errors.append(exc)

    def other_writer() -> None:
        read_done.wait(5)
        other_started.set()
        try:
            with unit():
                KnowledgeBase.update(doc_num=KnowledgeBase.doc_num + 10).where(
                    KnowledgeBase.id == "kb1"
                ).execute()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader_then_writer), threading.Thread(target=other_writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    with unit():
        assert KnowledgeBase.get_by_id("kb1").doc_num == 11  # both writes, neither lost
