"""Digest reuse: a new task whose digest equals a done task of the same document takes over
that task's chunks and is done at once, without a message (``LIFECYCLE.md``, "Publish").

The chunks are moved to the new generation (their ids stay), so when the new generation is done
and older generations' chunks are removed, these stay. A done task is a source only while every
chunk it lists still exists (a later generation that finished may have removed them).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from db.models import DONE, Chunk, Task
from ingest.lines import line

BATCH = 1000


def apply_reuse(existing_doc_ids: list[str], tasks_by_doc: dict[str, list[dict[str, Any]]]) -> int:
    """Write ``done`` each new task whose digest equals a done task of its document whose chunks
    are all still there, and move those chunks to the new generation."""
    if not existing_doc_ids:
        return 0
    wanted = {(t["doc_id"], t["digest"]) for d in existing_doc_ids for t in tasks_by_doc[d]}
    sources = _reusable_sources(existing_doc_ids, wanted)
    moves: dict[int, tuple[set[str], list[str], list[str]]] = defaultdict(lambda: (set(), [], []))
    count = 0
    for doc in existing_doc_ids:
        for task in tasks_by_doc[doc]:
            source = sources.get((doc, task["digest"]))
            if source is None:
                continue
            src_id, src_generation, chunk_ids = source
            task.update(
                status=DONE,
                progress=1.0,
                chunk_ids=" ".join(chunk_ids),
                progress_msg=task["progress_msg"]
                + line(
                    f"done: took over {len(chunk_ids)} chunk(s) of task {src_id} (generation {src_generation}), same digest"
                ),
            )
            docs, chunks, src_tasks = moves[task["generation"]]
            docs.add(doc)
            chunks.extend(chunk_ids)
            src_tasks.append(src_id)
            count += 1
    for generation, (docs, chunks, src_tasks) in moves.items():
        in_docs = Chunk.doc_id.in_(sorted(docs))
        for start in range(0, len(chunks), BATCH):
            Chunk.update(generation=generation).where(
                in_docs & Chunk.id.in_(chunks[start : start + BATCH])
            ).execute()
        for start in range(0, len(src_tasks), BATCH):  # chunks a finisher did not list on its row
            batch = src_tasks[start : start + BATCH]
            Chunk.update(generation=generation).where(
                in_docs & Chunk.task_id.in_(batch) & (Chunk.generation < generation)
            ).execute()
    return count


def _reusable_sources(
    doc_ids: list[str], wanted: set[tuple[str, str]]
) -> dict[tuple[str, str], tuple[str, int, list[str]]]:
    """For each wanted (document, digest): the newest done task whose chunks all still exist."""
    candidates: dict[tuple[str, str], list[tuple[int, str, list[str]]]] = defaultdict(list)
    for start in range(0, len(doc_ids), BATCH):
        batch = doc_ids[start : start + BATCH]
        query = Task.select(Task.id, Task.doc_id, Task.digest, Task.generation, Task.chunk_ids).where(
            Task.doc_id.in_(batch) & (Task.status == DONE) & (Task.digest != "")
        )
        for tid, did, digest, generation, chunk_ids in query.tuples():
            if (did, digest) in wanted:
                candidates[(did, digest)].append((int(generation), tid, (chunk_ids or "").split()))
    needed = sorted({c for cands in candidates.values() for _, _, chunk_ids in cands for c in chunk_ids})
    present: set[str] = set()
    for start in range(0, len(needed), BATCH):
        present.update(
            c for (c,) in Chunk.select(Chunk.id).where(Chunk.id.in_(needed[start : start + BATCH])).tuples()
        )
    chosen: dict[tuple[str, str], tuple[str, int, list[str]]] = {}
    for key, cands in candidates.items():
        for generation, tid, chunk_ids in sorted(cands, reverse=True):
            if all(c in present for c in chunk_ids):
                chosen[key] = (tid, generation, chunk_ids)
                break
    return chosen
