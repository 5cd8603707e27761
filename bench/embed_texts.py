"""Embed a file of texts (one a line) into a ``.npy`` of vectors, for benches that need real ones.

    .venv/bin/python bench/embed_texts.py TEXTS OUT.npy [--backend onnx-int8] [--window 4096]

Each line (split at newlines only) is one text, embedded by the project's encoder for ``--backend`` (the settings'
``INGEST_EMBEDDING_MODEL``; ``onnx-int8`` needs ``ingest model export --int8`` first, and encodes
short texts about 2x faster than torch here) into row ``i`` of ``OUT.npy`` (float32, normalised,
in the file's order). The file is written in place as it goes (a memory-mapped ``.npy``) and a
``OUT.npy.done`` counter is kept beside it, so a run that is stopped resumes where it stopped.
``bench/search_scale.py --vectors OUT.npy`` reads it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from db.config import Settings  # noqa: E402
from ingest.query_encoder import backend_encoder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("texts", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--backend", default="onnx-int8", choices=("torch", "onnx", "onnx-int8"))
    parser.add_argument("--window", type=int, default=4096, help="texts per encode call")
    args = parser.parse_args(argv)

    texts = args.texts.read_text(encoding="utf-8").split("\n")  # newlines only, as `wc -l` counts
    if texts and not texts[-1]:
        texts.pop()
    settings = Settings.from_env({**os.environ, "INGEST_EMBEDDING_BACKEND": args.backend})
    encoder = backend_encoder(settings)
    done_file = args.out.with_name(args.out.name + ".done")
    if args.out.exists() and done_file.exists():
        out = np.load(args.out, mmap_mode="r+")
        if out.shape != (len(texts), encoder.dim):
            raise SystemExit(f"{args.out} holds {out.shape}, not {(len(texts), encoder.dim)}: remove it")
        done = int(done_file.read_text())
    else:
        out = np.lib.format.open_memmap(
            args.out, mode="w+", dtype=np.float32, shape=(len(texts), encoder.dim)
        )
        done = 0
    print(f"{len(texts):,} texts, {done:,} done, by {getattr(encoder, 'identity', args.backend)}", flush=True)
    start, first = time.perf_counter(), done
    while done < len(texts):
        end = min(done + args.window, len(texts))
        out[done:end] = encoder.encode(texts[done:end], 128, max_tokens=8192)
        out.flush()
        done = end
        partial = done_file.with_name(done_file.name + ".tmp")
        partial.write_text(str(done))
        os.replace(partial, done_file)  # a run stopped mid-write leaves the old count whole
        rate = (done - first) / (time.perf_counter() - start)
        print(f"{done:,} / {len(texts):,}  {rate:,.0f} texts/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
