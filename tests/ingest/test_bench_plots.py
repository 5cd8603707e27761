"""bench/plots.py: each figure function writes a PNG that decodes, of the figure's size, with
something drawn on it, from data shaped as the benches measure it."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib absent: pip install -e '.[plots]' (bench/plots.py)")

from bench import plots  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _check_png(path: Path, size_in: tuple[float, float]) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (round(size_in[0] * plots.DPI), round(size_in[1] * plots.DPI))
    assert len(data) > 10_000, f"{path}: {len(data)} bytes, too small for a drawn figure"
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels[..., :3].std() > 0.05, f"{path} is blank"


def test_dispatch_rates_with_and_without_docket(tmp_path):
    # shaped as a bench.dispatch run prints them: tasks/s
    out = plots.dispatch_rates(
        tmp_path / "a" / "dispatch_drain.png",
        enqueue=5_310.0,
        enqueue_raw=9_870.0,
        drain=1_420.0,
        docket=640.0,
        n=2000,
        concurrency=10,
    )
    assert out == tmp_path / "a" / "dispatch_drain.png"
    _check_png(out, (8, 3.6))
    bare = plots.dispatch_rates(
        tmp_path / "b.png",
        enqueue=5_310.0,
        enqueue_raw=9_870.0,
        drain=1_420.0,
        docket=None,
        n=2000,
        concurrency=10,
    )
    _check_png(bare, (8, 3.6))
    assert bare.read_bytes() != out.read_bytes()  # one bar fewer


def test_start_latency_distribution(tmp_path):
    rng = random.Random(3)
    returned = sorted(rng.lognormvariate(0.2, 0.5) for _ in range(300))  # ms, ~1.2 median
    called = sorted(r + rng.uniform(2, 6) for r in returned)
    out = plots.start_latency(tmp_path / "start_latency.png", returned_ms=returned, called_ms=called, rate=25)
    _check_png(out, (7.5, 4.4))


def test_ingest_rates(tmp_path):
    out = plots.ingest_rates(
        tmp_path / "ingest_rate.png",
        end_to_end=15.0,
        raw=21.7,
        executor_ms_per_chunk=78.5,
        raw_ms_per_chunk=71.8,
        chunks=8219,
        documents=240,
    )
    _check_png(out, (8, 3.6))


def test_search_latency_curve(tmp_path):
    rows = [
        {"size": size, "backend": backend, "p50_ms": p50, "p99_ms": p99}
        for size, backend, p50, p99 in (
            (10_000, "mysql", 387.0, 1174.0),
            (10_000, "milvus-lite", 79.0, 160.0),
            (100_000, "mysql", 3671.0, 5412.0),
            (100_000, "milvus-lite", 637.0, 1338.0),
            (1_000, "mysql", 41.0, 60.0),  # out of order: the curve sorts by size
        )
    ]
    out = plots.search_latency(tmp_path / "search_latency.png", rows)
    _check_png(out, (7, 3.8))
