"""Dense, keyword and hybrid retrieval on the same questions: recall@1, recall@3 and MRR@10.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/retrieval.py [--db-url mysql://root@127.0.0.1:3306/bench_retrieval]

Corpus and questions of ``bench/chunk_size.py`` (the demo documents of ``examples/`` with the
licence texts as distractors; each question has a key phrase found in one place), plus a set
of short queries on names, codes and rare words, where dense models are said to miss. The
documents go through the real path: parsers, the default chunker, the model, ``store_chunks``
into a MariaDB database of the bench's own (dropped at the end), and ``ingest.search.search``
in each mode (keyword: the InnoDB FULLTEXT index; hybrid: reciprocal rank fusion of both).
A hit is a returned chunk that holds the key phrase (whitespace and case normalised).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.chunk_size import LICENCE_QUESTIONS, QUESTIONS, _norm, corpus  # noqa: E402
from db.config import Settings  # noqa: E402
from db.database import close_database, unit  # noqa: E402
from db.models import Document, KnowledgeBase, Task  # noqa: E402
from db.schema import init_schema  # noqa: E402
from ingest import ids  # noqa: E402
from ingest.chunking import ChunkConfig, chunk_document  # noqa: E402
from ingest.embedding import load_embedder  # noqa: E402
from ingest.parsers import parse_document  # noqa: E402
from ingest.search import MODES, search  # noqa: E402
from ingest.store import record_embedding_model, store_chunks  # noqa: E402

NAMES_AND_RARE_WORDS: list[tuple[str, str, str]] = [  # (query, document, key phrase)
    ("Bay of Fundy", "tides.txt", "Fundy"),
    ("Ruy Lopez", "chess_openings.md", "Ruy Lopez"),
    ("Sicilian Defence", "chess_openings.md", "Sicilian"),
    ("Fresnel lens", "lighthouses.md", "Fresnel"),
    ("Pharos of Alexandria", "lighthouses.md", "Pharos"),
    ("Golden Spike", "railway_milestones.csv", "Golden Spike"),
    ("Stephenson Rocket", "railway_milestones.csv", "Rocket"),
    ("waggle dance", "beekeeping.md", "waggle"),
    ("Hohmann transfer", "orbital_mechanics.md", "Hohmann"),
    ("pyroclastic flows", "volcanoes.html", "pyroclastic"),
    ("bowline", "knots.json", "bowline"),
    ("sheet bend", "knots.json", "sheet bend"),
    ("levain", "sourdough.txt", "levain"),
    ("crema", "coffee.html", "crema"),
    ("Varroa destructor", "beekeeping.md", "Varroa destructor"),
    ("senbazuru", "origami_basics.docx", "senbazuru"),
]


def build(settings: Settings) -> int:
    """Index the corpus into the bench's database; returns the number of chunks."""
    init_schema(settings.db_url)
    embedder = load_embedder(settings.embedding_model)
    kb_id = ids.kb_id("default", "bench")
    with unit():
        KnowledgeBase.create(id=kb_id, name="bench")
    record_embedding_model(kb_id, embedder.identity, embedder.dim)
    total = 0
    for name, data, doc_type in corpus():
        chunks = chunk_document(parse_document(data, doc_type), ChunkConfig(), embedder.model)
        doc_id = ids.doc_id(kb_id, name)
        task_id = ids.task_id(doc_id, 0, 100_000_000, 1)
        with unit():
            Document.create(id=doc_id, kb_id=kb_id, name=name, doc_type=doc_type, generation=1)
            Task.create(id=task_id, doc_id=doc_id, kb_id=kb_id, generation=1, status="running", attempt=1)
        vectors = embedder.encode([c.content for c in chunks])
        store_chunks(
            kb_id=kb_id, doc_id=doc_id, task_id=task_id, generation=1, chunks=chunks, vectors=vectors
        )
        total += len(chunks)
    return total


def measure(settings: Settings, questions: list[tuple[str, str, str]], mode: str) -> dict[str, float]:
    at1 = at3 = rr = 0.0
    for question, _, phrase in questions:
        hits = search(settings, "bench", question, k=10, mode=mode)
        found = [_norm(phrase) in _norm(h.content) for h in hits]
        first = found.index(True) + 1 if True in found else 0
        at1 += first == 1
        at3 += 0 < first <= 3
        rr += 1 / first if first else 0
    n = len(questions)
    return {"recall@1": at1 / n, "recall@3": at3 / n, "mrr@10": rr / n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", default="mysql://root@127.0.0.1:3306/bench_retrieval")
    args = parser.parse_args(argv)
    settings = Settings.from_env({}, db_url=args.db_url)
    from tests.conftest import _drop_database  # the bench's own database, dropped at the end

    _drop_database(settings.db_url)
    try:
        chunks = build(settings)
        sets = {"demo": QUESTIONS, "licences": LICENCE_QUESTIONS, "names": NAMES_AND_RARE_WORDS}
        print(f"{chunks} chunks; questions: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()))
        print(f"{'set':<10} {'mode':<8} {'R@1':>6} {'R@3':>6} {'MRR@10':>7}")
        for set_name, questions in sets.items():
            for mode in MODES:
                r = measure(settings, questions, mode)
                print(
                    f"{set_name:<10} {mode:<8} {r['recall@1']:>6.3f} {r['recall@3']:>6.3f} {r['mrr@10']:>7.3f}"
                )
    finally:
        close_database()
        _drop_database(settings.db_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
