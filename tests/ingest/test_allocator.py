"""ingest.allocator: the embedding processes' jemalloc, as entrypoint.sh preloads it, for every
other way this project starts an executor (``ingest demo``, the benches), and in words for the log."""

from __future__ import annotations

from pathlib import Path

from db.config import Settings
from ingest import allocator
from ingest.allocator import JEMALLOC_CONF, describe, loaded_jemalloc, preload_env
from ingest.cli.demo import _child_env


def _fake_lib(tmp_path: Path) -> str:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    return str(lib)


def test_preload_env_puts_jemalloc_first_and_never_purging_unless_the_caller_chose(tmp_path):
    lib = _fake_lib(tmp_path)
    paths = (str(tmp_path / "missing.so"), lib)
    env = preload_env({"LD_PRELOAD": "/opt/other.so", "HOME": "/root"}, paths)
    assert env == {"LD_PRELOAD": f"{lib}:/opt/other.so", "MALLOC_CONF": JEMALLOC_CONF, "HOME": "/root"}
    assert preload_env({}, paths) == {"LD_PRELOAD": lib, "MALLOC_CONF": "dirty_decay_ms:-1,narenas:1"}
    # an operator's own settings win, and a jemalloc already preloaded is not preloaded twice
    mine = {"LD_PRELOAD": "/usr/local/lib/libjemalloc.so", "MALLOC_CONF": "dirty_decay_ms:5000"}
    assert preload_env(mine, paths) == mine
    # no jemalloc installed: the environment as it was
    assert preload_env({"A": "1"}, (str(tmp_path / "missing.so"),)) == {"A": "1"}


def test_describe_reads_the_process_maps_and_flags_what_slows_encode(tmp_path):
    lib = _fake_lib(tmp_path)
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f01 r-xp 00000000 08:01 42 {lib}\n7f02-7f03 r--p 00000000 08:01 7 /usr/bin/python3\n"
    )
    assert loaded_jemalloc(maps) == lib
    assert describe({"MALLOC_CONF": JEMALLOC_CONF}, maps) == (
        f"jemalloc ({lib}, MALLOC_CONF={JEMALLOC_CONF})",
        True,
    )
    text, best = describe({}, maps)
    assert not best and "default purging" in text

    maps.write_text("7f02-7f03 r--p 00000000 08:01 7 /usr/bin/python3\n")
    assert loaded_jemalloc(maps) is None
    text, best = describe({}, maps, paths=(lib,))
    assert not best and f"{lib} is installed" in text
    assert describe({}, maps, paths=(str(tmp_path / "missing.so"),)) == (
        "the system's malloc (no libjemalloc installed)",
        True,
    )
    assert loaded_jemalloc(tmp_path / "no-such-maps") is None


def test_the_demo_fleet_gets_the_allocator_entrypoint_sh_gives(monkeypatch, tmp_path):
    lib = _fake_lib(tmp_path)
    monkeypatch.setattr(allocator, "find_jemalloc", lambda paths=(): lib)
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    env = _child_env(Settings())
    assert env["LD_PRELOAD"] == f"{lib}:/opt/other.so" and env["MALLOC_CONF"] == JEMALLOC_CONF
