"""Keyword retrieval over chunk text, and its fusion with the vector scores (hybrid search).

On MySQL/MariaDB the chunk table has an InnoDB FULLTEXT index on ``content`` (``ingest init``
adds it, :data:`FULLTEXT_INDEX`); a query is matched in natural language mode (InnoDB's own
relevance, its stopword list, words of at least ``innodb_ft_min_token_size`` = 3 characters)
within the knowledge base's current chunks. SQLite has no such index here: keyword search
raises :class:`KeywordSearchUnavailable` there, and hybrid search is dense alone (documented
fallback). Fusion is reciprocal rank fusion: each list gives a chunk ``1 / (RRF_K + rank)``.
"""

from __future__ import annotations

from db.database import connection, is_mysql
from ingest.errors import PermanentError

FULLTEXT_INDEX = "chunk_content_ft"
RRF_K = 60  # the usual constant (Cormack et al. 2009): ranks far down still count a little
_KEYWORD_SQL = (
    "SELECT c.id, MATCH(c.content) AGAINST (%s IN NATURAL LANGUAGE MODE) AS score FROM chunk AS c "
    "JOIN document AS d ON d.id = c.doc_id AND d.generation = c.generation "
    "WHERE c.kb_id = %s AND MATCH(c.content) AGAINST (%s IN NATURAL LANGUAGE MODE) "
    "ORDER BY score DESC, c.id LIMIT %s"
)


class KeywordSearchUnavailable(PermanentError):
    """Keyword search needs the MySQL/MariaDB FULLTEXT index (not on SQLite)."""


def keyword_available() -> bool:
    return is_mysql()


def keyword_top(kb_id: str, query: str, limit: int) -> list[tuple[str, float]]:
    """The ``limit`` current chunks of ``kb_id`` whose text best matches ``query``'s words."""
    if not is_mysql():
        raise KeywordSearchUnavailable(
            "keyword search needs MySQL/MariaDB (its FULLTEXT index); this is SQLite"
        )
    with connection() as db:
        rows = db.execute_sql(_KEYWORD_SQL, (query, kb_id, query, int(limit))).fetchall()
    return [(str(cid), float(score)) for cid, score in rows if score and float(score) > 0]


def fuse(rankings: list[list[tuple[str, float]]], k: int) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of best-first lists: the ``k`` best ``(id, fused score)``."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, (cid, _) in enumerate(ranking, 1):
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]
