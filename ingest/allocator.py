"""The memory allocator of the processes that embed: jemalloc, never purging, one arena.

torch's encode allocates and frees every batch's activations. jemalloc with its default purging
hands those pages back to the kernel a few at a time and the next batch faults them in again
(15-25 % more CPU a chunk than glibc's malloc); with ``dirty_decay_ms:-1,narenas:1`` it keeps
them, and encode is about 1.2x glibc's speed at the same peak memory (bench/README.md, "the
allocator was the cause"). entrypoint.sh preloads it for the fleet it supervises; ``ingest
demo`` and the benches start their executors with :func:`preload_env`, and an executor logs what
it got (:func:`describe`), so one started some other way says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

JEMALLOC_CONF = "dirty_decay_ms:-1,narenas:1"  # entrypoint.sh's default, too
JEMALLOC_PATHS = (  # Debian's and Ubuntu's libjemalloc2, then the usual other places (entrypoint.sh asks pkg-config first)
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)


def find_jemalloc(paths: tuple[str, ...] = JEMALLOC_PATHS) -> str | None:
    """The first libjemalloc installed, or None."""
    return next((p for p in paths if os.path.exists(p)), None)


def preload_env(env: Mapping[str, str], paths: tuple[str, ...] = JEMALLOC_PATHS) -> dict[str, str]:
    """``env`` for a child process that embeds, with jemalloc preloaded as entrypoint.sh does.

    An ``LD_PRELOAD`` that already names a jemalloc is kept as it is, and so is the caller's own
    ``MALLOC_CONF``; with no jemalloc installed, ``env`` comes back unchanged.
    """
    out = dict(env)
    path = find_jemalloc(paths)
    if path is None:
        return out
    preload = out.get("LD_PRELOAD", "")
    if "libjemalloc" not in preload:
        out["LD_PRELOAD"] = f"{path}:{preload}" if preload else path
    out.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    return out


def loaded_jemalloc(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The libjemalloc mapped into the process whose maps these are, or None."""
    try:
        text = maps.read_text()
    except OSError:
        return None
    return next((line.split()[-1] for line in text.splitlines() if "libjemalloc" in line), None)


def describe(
    env: Mapping[str, str], maps: Path = Path("/proc/self/maps"), paths: tuple[str, ...] = JEMALLOC_PATHS
) -> tuple[str, bool]:
    """What this process allocates with, in words, and whether that is the embedding's best.

    The second value is False where jemalloc is installed and not loaded (an executor started
    outside entrypoint.sh: torch's encode then runs at about 0.8x the speed), or loaded without
    ``MALLOC_CONF``, i.e. purging (about 0.7x). A ``MALLOC_CONF`` of the operator's is their choice.
    """
    path = loaded_jemalloc(maps)
    if path is None:
        installed = find_jemalloc(paths)
        if installed is None:
            return "the system's malloc (no libjemalloc installed)", True
        return f"the system's malloc, though {installed} is installed: encode runs about 0.8x as fast", False
    conf = env.get("MALLOC_CONF", "")
    if not conf:
        return f"jemalloc ({path}) with its default purging: encode runs about 0.7x as fast", False
    return f"jemalloc ({path}, MALLOC_CONF={conf})", True
