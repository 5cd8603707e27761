"""bench/gather_texts.py and bench/embed_texts.py: the real-vector inputs of
``bench/search_scale.py --vectors``."""

from __future__ import annotations

import numpy as np

from bench import embed_texts, gather_texts
from tests.fixtures_docs import embedder  # noqa: F401 - the session's one model

PROSE = "Queens lay their eggs in the spring when the colony grows"


def test_gather_keeps_distinct_prose_first_then_other_lines(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.md").write_text(
        f"{PROSE}\n  # {PROSE}\nshort line\n" + "x = compute_the_value(alpha, beta, gamma_delta)\n" * 2
    )
    (tmp_path / "a" / "skip.bin").write_text(PROSE + " and more words here\n")
    (tmp_path / "b.py").write_text('"""Workers renew their lease every ten seconds while they run."""\n')
    docstring = "Workers renew their lease every ten seconds while they run."
    found = gather_texts.gather([tmp_path], lines=10)
    assert sorted(found) == sorted([PROSE, docstring, "x = compute_the_value(alpha, beta, gamma_delta)"])
    assert sorted(gather_texts.gather([tmp_path], lines=2)) == sorted([PROSE, docstring])  # prose first
    assert gather_texts.gather([tmp_path], lines=10) == found  # the same seed, the same order


def test_embed_texts_writes_each_line_s_vector_and_resumes(tmp_path, embedder):  # noqa: F811
    texts = ["volcanoes erupt lava", "tides follow the moon", "bees make honey", "rain", "snow falls"]
    source, out = tmp_path / "texts.txt", tmp_path / "vectors.npy"
    source.write_text("\n".join(texts) + "\n")
    assert embed_texts.main([str(source), str(out), "--backend", "torch", "--window", "2"]) == 0
    expected = embedder.encode(texts)
    vectors = np.load(out)
    assert vectors.shape == (5, embedder.dim)
    assert float(np.min(np.sum(vectors * expected, axis=1))) > 0.9999
    # a stopped run resumes after its last finished window: the rows before it are not redone
    written = np.load(out, mmap_mode="r+")
    written[:2] = 7.0
    written[2:] = 0
    written.flush()
    del written
    out.with_name("vectors.npy.done").write_text("2")
    assert embed_texts.main([str(source), str(out), "--backend", "torch", "--window", "2"]) == 0
    resumed = np.load(out)
    assert (resumed[:2] == 7.0).all()
    assert float(np.min(np.sum(resumed[2:] * expected[2:], axis=1))) > 0.9999
    assert out.with_name("vectors.npy.done").read_text() == "5"
