"""Ids and digests are deterministic 32-hex xxh128 values of exactly their inputs."""

from __future__ import annotations

import re

from ingest import ids
from tests.lifecycle import rule

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def test_ids_are_32_hex_and_the_same_for_the_same_inputs():
    kb = ids.kb_id("default", "manuals")
    doc = ids.doc_id(kb, "guide.pdf")
    task = ids.task_id(doc, 0, 12, 1)
    for value in (kb, doc, task, ids.content_hash(b"x"), ids.new_id()):
        assert HEX32.match(value), value
    assert kb == ids.kb_id("default", "manuals")
    assert doc == ids.doc_id(kb, "guide.pdf")
    assert task == ids.task_id(doc, 0, 12, 1)


@rule("publish.generations")
def test_each_id_changes_with_each_of_its_inputs():
    kb = ids.kb_id("default", "manuals")
    assert kb != ids.kb_id("other", "manuals") != ids.kb_id("default", "manual")
    assert ids.kb_id("a", "bc") != ids.kb_id("ab", "c")  # parts are kept apart
    doc = ids.doc_id(kb, "guide.pdf")
    assert doc != ids.doc_id(kb, "guide2.pdf") and doc != ids.doc_id(ids.kb_id("t", "manuals"), "guide.pdf")
    base = ids.task_id(doc, 0, 12, 1)
    assert (
        len({base, ids.task_id(doc, 0, 12, 2), ids.task_id(doc, 12, 24, 1), ids.task_id(doc, 0, 11, 1)}) == 4
    )


def test_digest_follows_content_model_config_and_page_range_not_key_order():
    args = ("hash", "model", {"chunk_token_num": 128, "delimiter": "\n"}, 0, 12)
    d = ids.digest(*args)
    assert HEX32.match(d)
    assert d == ids.digest("hash", "model", {"delimiter": "\n", "chunk_token_num": 128}, 0, 12)
    changed = [
        ids.digest("hash2", *args[1:]),
        ids.digest("hash", "model2", *args[2:]),
        ids.digest("hash", "model", {"chunk_token_num": 256, "delimiter": "\n"}, 0, 12),
        ids.digest(*args[:3], 12, 24),
        ids.digest(*args, task_type="dataflow", dataflow_id="f1"),
    ]
    assert d not in changed and len(set(changed)) == len(changed)


def test_a_local_model_is_known_by_its_last_two_path_parts(tmp_path):
    here, there = tmp_path / "a" / "venv" / "st" / "model", tmp_path / "b" / "st" / "model"
    for path in (here, there):
        path.mkdir(parents=True)
    assert ids.model_identity(str(here)) == ids.model_identity(f"{there}/") == "st/model"
    assert (
        ids.model_identity("sentence-transformers/all-MiniLM-L6-v2")
        == "sentence-transformers/all-MiniLM-L6-v2"
    )
    assert ids.digest("hash", ids.model_identity(str(here)), {}, 0, 1) == ids.digest(
        "hash", ids.model_identity(str(there)), {}, 0, 1
    )
