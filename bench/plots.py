"""PNG figures of the benches' measurements, one small function a figure (matplotlib, Agg backend).

The benches call these with what their run measured when given ``--plot DIR``
(``pip install -e '.[plots]'``, or the ``bench`` extra):

- ``python -m bench.dispatch --plot DIR``: ``dispatch_drain.png`` (enqueue against the raw
  baseline, drain against Docket's) and ``start_latency.png`` (the paced run's distribution);
- ``python bench/ingest.py --plot DIR``: ``ingest_rate.png`` (chunks/s end to end against raw
  ``SentenceTransformer.encode``, and CPU ms a chunk of each);
- ``python bench/search_scale.py --plot DIR``: ``search_latency.png`` (p50 and p99 by chunks, per
  backend).

Each function writes one PNG and returns its path; none computes or invents a figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

DPI = 110
OURS, BASELINE = "#1f77b4", "#999999"


def _save(fig: Any, path: Path | str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI, format="png")
    plt.close(fig)
    return out


def _plain_log_ticks(axis: Any) -> None:
    """A log axis labelled 1, 2, 5, 10, 20 rather than 2×10⁰."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
    axis.set_minor_formatter(NullFormatter())


def _p50_p99(values: Sequence[float]) -> tuple[float, float]:
    """As bench.dispatch prints them: the median, and the value at index int(0.99 n)."""
    ordered = sorted(values)
    n = len(ordered)
    p50 = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return p50, ordered[min(n - 1, int(n * 0.99))]


def _bars(ax: Any, labels: Sequence[str], values: Sequence[float], colours: Sequence[str], unit: str) -> None:
    bars = ax.bar(labels, values, color=colours)
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(
            f"{value:,.0f}" if value >= 100 else f"{value:,.1f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel(unit)
    ax.margins(y=0.15)


def dispatch_rates(
    path: Path | str,
    *,
    enqueue: float,
    enqueue_raw: float,
    drain: float,
    docket: float | None,
    n: int,
    concurrency: int,
) -> Path:
    """Enqueue tasks/s beside the raw insert_many + XADD, drain tasks/s beside Docket's (when run)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.6))
    _bars(left, ["producer", "raw insert + XADD"], [enqueue, enqueue_raw], [OURS, BASELINE], "tasks/s")
    left.set_title("enqueue")
    labels, values, colours = ["executor"], [drain], [OURS]
    if docket is not None:
        labels.append("Docket")
        values.append(docket)
        colours.append(BASELINE)
    _bars(right, labels, values, colours, "tasks/s")
    right.set_title("no-op drain" + ("" if docket is not None else " (Docket not run)"))
    fig.suptitle(f"bench.dispatch: N={n:,}, concurrency {concurrency}", fontsize=10)
    return _save(fig, path)


def start_latency(
    path: Path | str,
    *,
    returned_ms: Sequence[float],
    called_ms: Sequence[float],
    rate: float,
    goal_p50_ms: float = 2.0,
    goal_p99_ms: float = 10.0,
) -> Path:
    """The paced run's start latencies as cumulative distributions (log scale), the goals marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for values, label, colour in (
        (returned_ms, "from submit returning", OURS),
        (called_ms, "from the call (producer included)", "#ff7f0e"),
    ):
        ordered = sorted(max(v, 1e-3) for v in values)
        share = [(i + 1) / len(ordered) for i in range(len(ordered))]
        p50, p99 = _p50_p99(values)
        label += f": p50 {p50:.1f}, p99 {p99:.1f} ms"
        ax.step(ordered, share, where="post", label=label, color=colour)
    ax.axvline(goal_p50_ms, color="green", linestyle=":", label=f"goal p50 ≤ {goal_p50_ms:g} ms")
    ax.axvline(goal_p99_ms, color="red", linestyle=":", label=f"goal p99 ≤ {goal_p99_ms:g} ms")
    ax.axhline(0.5, color=BASELINE, linewidth=0.5)
    ax.axhline(0.99, color=BASELINE, linewidth=0.5)
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_xlabel("start latency to the handler's first line, ms")
    ax.set_ylabel("share of tasks")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"start latency: {len(returned_ms)} tasks at {rate:g}/s, idle executor", fontsize=10)
    ax.legend(
        fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2
    )  # below: clear of both curves
    return _save(fig, path)


def ingest_rates(
    path: Path | str,
    *,
    end_to_end: float,
    raw: float,
    executor_ms_per_chunk: float,
    raw_ms_per_chunk: float,
    chunks: int,
    documents: int,
) -> Path:
    """Chunks/s end to end beside raw ``encode``, and CPU ms a chunk of each."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.6))
    _bars(left, ["end to end", "raw encode"], [end_to_end, raw], [OURS, BASELINE], "chunks/s (wall clock)")
    left.set_title(f"rate: {end_to_end / raw:.2f}× raw")
    _bars(
        right,
        ["executor + workers", "raw encode"],
        [executor_ms_per_chunk, raw_ms_per_chunk],
        [OURS, BASELINE],
        "CPU ms a chunk",
    )
    right.set_title(f"CPU: raw / executor {raw_ms_per_chunk / executor_ms_per_chunk:.2f}")
    fig.suptitle(f"bench/ingest.py: {documents} documents, {chunks:,} chunks", fontsize=10)
    return _save(fig, path)


def search_latency(path: Path | str, rows: Sequence[Mapping[str, Any]]) -> Path:
    """p50 (solid) and p99 (dashed) search latency by chunks in the knowledge base, per backend.

    ``rows``: one mapping per measurement with ``size``, ``backend``, ``p50_ms``, ``p99_ms``."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    backends = list(dict.fromkeys(str(r["backend"]) for r in rows))
    for i, backend in enumerate(backends):
        mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["size"])
        sizes = [r["size"] for r in mine]
        colour = f"C{i}"
        ax.plot(sizes, [r["p50_ms"] for r in mine], marker="o", color=colour, label=f"{backend} p50")
        ax.plot(
            sizes,
            [r["p99_ms"] for r in mine],
            marker="x",
            linestyle="--",
            color=colour,
            label=f"{backend} p99",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("chunks in the knowledge base")
    ax.set_ylabel("search latency, ms (k = 10)")
    ax.set_title("search latency below the query's embedding (ingest.search.nearest)", fontsize=10)
    ax.grid(True, which="major", linewidth=0.4)
    ax.legend(fontsize=8)
    return _save(fig, path)
