"""Test data for the producer tests: PDFs, CLI arguments, stream contents, a finished task."""

from __future__ import annotations

import io
from typing import Any

import orjson

from db.database import unit
from db.models import DONE, Chunk, Task
from ingest.documents import lock_documents, recompute_documents


def make_pdf(pages: int) -> bytes:
    """A valid PDF of ``pages`` blank pages (pdfium writes it)."""
    import pypdfium2

    pdf = pypdfium2.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(200, 200)
    out = io.BytesIO()
    pdf.save(out)
    pdf.close()
    return out.getvalue()


def cli_args(settings: Any) -> list[str]:
    """The global options that point the CLI at a test's database and key prefix."""
    return [
        "--db-url",
        settings.db_url,
        "--redis-url",
        settings.redis_url,
        "--key-prefix",
        settings.key_prefix,
    ]


def cli_env(settings: Any) -> dict[str, str]:
    return {
        "INGEST_DB_URL": settings.db_url,
        "INGEST_REDIS_URL": settings.redis_url,
        "INGEST_KEY_PREFIX": settings.key_prefix,
        "INGEST_HOME": settings.home,
    }


def stream_messages(rclient: Any, keys: Any, priority: int) -> list[dict[str, Any]]:
    """The messages waiting at ``priority``: in the priority stream (admitted) and in every
    tenant's backlog (not yet admitted by the fair gate)."""
    streams = [keys.queue(priority), *rclient.scan_iter(match=f"{keys.queue(priority)}:t:*", count=1000)]
    return [orjson.loads(fields["message"]) for s in streams for _, fields in rclient.xrange(s)]


def all_messages(rclient: Any, keys: Any) -> list[dict[str, Any]]:
    return stream_messages(rclient, keys, 0) + stream_messages(rclient, keys, 1)


def finish_task(task_id: str, *, status: str = DONE, chunks: int = 2, msg: str = "") -> list[str]:
    """Do what an executor's finisher does: write the run's chunks, the terminal row (with its
    chunk ids), and recompute the document, in one transaction. Returns the chunk ids."""
    with unit():
        task = Task.get_by_id(task_id)
        lock_documents([task.doc_id])
        chunk_ids = [f"{task_id[:24]}{i:08d}" for i in range(chunks)] if status == DONE else []
        if chunk_ids:
            Chunk.insert_many(
                [
                    {
                        "id": cid,
                        "kb_id": task.kb_id,
                        "doc_id": task.doc_id,
                        "task_id": task_id,
                        "generation": task.generation,
                        "position": i,
                        "page": task.from_page,
                        "content": f"chunk {i} of {task_id}",
                        "token_num": 3,
                    }
                    for i, cid in enumerate(chunk_ids)
                ]
            ).execute()
        Task.update(
            status=status,
            progress=1.0 if status == DONE else -1.0,
            chunk_ids=" ".join(chunk_ids),
            progress_msg=Task.progress_msg.concat(msg or status),
        ).where(Task.id == task_id).execute()
        recompute_documents([task.doc_id])
    return chunk_ids


def ack_all(rclient: Any, keys: Any) -> None:
    """Empty the task streams, the tenants' backlogs and published keys, as acks after terminal
    writes would."""
    for stream in [*keys.queues, *rclient.scan_iter(match=f"{keys.prefix}:queue:*:t:*", count=1000)]:
        for entry_id, fields in rclient.xrange(stream):
            task_id = orjson.loads(fields["message"])["id"]
            rclient.xdel(stream, entry_id)
            rclient.delete(keys.published(task_id))
