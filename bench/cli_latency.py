"""Cold-process wall times of the CLI: how long a person waits for one command.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cli_latency.py [--runs 5] [--readme]

Each command is a fresh process (``subprocess.run``), run ``--runs`` times, interleaved (one of
each in turn, so load on a shared machine falls on all alike); the median is printed beside
``ingest --help`` measured in the same run. Commands: ``python -c pass`` (the interpreter),
``ingest --help`` (the CLI's own imports), ``ingest status`` (database and Redis), and ``ingest
search`` with the query encoded through the model's ONNX export (``INGEST_QUERY_ENCODER=onnx``)
and through sentence-transformers (``INGEST_QUERY_ENCODER=torch``). The search runs on the demo
documents of ``examples/``, ingested first by a real executor into a database and key prefix of
the bench's own; each search's top hits through ONNX must equal those through torch. The export
is made (``ingest model export``) in ``INGEST_HOME`` when missing. Goal: the ONNX search's median
at most 3x ``ingest --help``'s. ``--readme`` writes the table into bench/README.md (its
``cli_latency`` section).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.ingest import fresh_settings, wait_terminal  # noqa: E402
from db.config import Settings  # noqa: E402
from db.database import init_database  # noqa: E402

EXAMPLES = ROOT / "examples"
QUERY = "how do I keep bees healthy in winter?"
README = ROOT / "bench" / "README.md"
HEADING = "## cli_latency"


def ingest_examples(settings: Settings) -> None:
    """The demo documents into the bench's knowledge base ``demo``, through a real executor."""
    from ingest.producer import submit_documents

    env = {**os.environ, **_env(settings), "INGEST_LOG_LEVEL": "WARNING", "INGEST_STAGGER_S": "0"}
    executor = subprocess.Popen([sys.executable, "-m", "executor", "cli_latency_0"], cwd=ROOT, env=env)
    try:
        docs = [(p.name, p.read_bytes()) for p in sorted(EXAMPLES.iterdir()) if p.is_file()]
        states = wait_terminal(submit_documents(settings, docs, "demo").task_ids, 900)
        print(f"ingested {len(docs)} documents of examples/: {states}")
    finally:
        executor.terminate()
        executor.wait(60)


def _env(settings: Settings) -> dict[str, str]:
    return {
        "INGEST_DB_URL": settings.db_url,
        "INGEST_REDIS_URL": settings.redis_url,
        "INGEST_KEY_PREFIX": settings.key_prefix,
        "INGEST_HOME": settings.home,
    }


def commands(ingest: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    search = [ingest, "search", "--kb", "demo", QUERY, "-k", "3", "--json"]
    return {
        "python -c pass": ([sys.executable, "-c", "pass"], {}),
        "ingest --help": ([ingest, "--help"], {}),
        "ingest status": ([ingest, "status"], {}),
        "ingest search (ONNX)": (search, {"INGEST_QUERY_ENCODER": "onnx"}),
        "ingest search (torch)": (search, {"INGEST_QUERY_ENCODER": "torch"}),
    }


def measure(settings: Settings, runs: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Wall seconds of each command, ``runs`` times interleaved; and each one's last stdout."""
    ingest = str(Path(sys.executable).with_name("ingest"))
    base = {**os.environ, **_env(settings)}
    times: dict[str, list[float]] = {name: [] for name in commands(ingest)}
    outputs: dict[str, str] = {}
    for _ in range(runs):
        for name, (argv, extra) in commands(ingest).items():
            started = time.perf_counter()
            result = subprocess.run(argv, cwd=ROOT, env={**base, **extra}, capture_output=True, text=True)
            times[name].append(time.perf_counter() - started)
            if result.returncode != 0:
                raise SystemExit(f"{name} failed ({result.returncode}): {result.stderr[-2000:]}")
            outputs[name] = result.stdout
    return times, outputs


def table(times: dict[str, list[float]]) -> list[str]:
    help_s = statistics.median(times["ingest --help"])
    lines = ["| command | median s | min s | max s | × `ingest --help` |", "| --- | --- | --- | --- | --- |"]
    for name, values in times.items():
        median = statistics.median(values)
        lines.append(
            f"| `{name}` | {median:.2f} | {min(values):.2f} | {max(values):.2f} | {median / help_s:.1f} |"
        )
    return lines


def write_readme(lines: list[str], note: str) -> None:
    text = README.read_text(encoding="utf-8") if README.exists() else "# Benchmark figures\n"
    section = f"{HEADING}\n\n{note}\n\n" + "\n".join(lines) + "\n"
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    README.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (default 5)")
    parser.add_argument("--readme", action="store_true", help="write the table into bench/README.md")
    args = parser.parse_args(argv)
    settings = fresh_settings(Settings.from_env(os.environ), "ingest_bench_cli", "ingest_bench_cli")
    init_database(settings.db_url)
    from ingest.query_encoder import find_export

    if find_export(settings).state != "ready":
        print("making the ONNX export (ingest model export) ...")
        subprocess.run([sys.executable, "-m", "ingest", "model", "export"], cwd=ROOT, check=True)
    ingest_examples(settings)
    times, outputs = measure(settings, args.runs)
    onnx_hits = [h["chunk_id"] for h in json.loads(outputs["ingest search (ONNX)"])]
    torch_hits = [h["chunk_id"] for h in json.loads(outputs["ingest search (torch)"])]
    same = "the same" if onnx_hits == torch_hits else f"DIFFERENT: {onnx_hits} vs {torch_hits}"
    load = os.getloadavg()
    ratio = statistics.median(times["ingest search (ONNX)"]) / statistics.median(times["ingest --help"])
    note = (
        f"`bench/cli_latency.py --runs {args.runs}`, {time.strftime('%Y-%m-%d')}: cold processes, median of "
        f"{args.runs} interleaved runs; {os.cpu_count()} cores shared with other engineers' work (load "
        f"average {load[0]:.1f} at the end). `ingest search` through ONNX: {ratio:.1f}× `ingest --help` "
        f"(goal ≤ 3); its top 3 hits are {same} as through torch."
    )
    lines = table(times)
    print("\n" + note + "\n")
    print("\n".join(lines))
    if args.readme:
        write_readme(lines, note)
        print(f"\nwritten to {README.relative_to(ROOT)}")
    return 0 if onnx_hits == torch_hits else 1


if __name__ == "__main__":
    sys.exit(main())
