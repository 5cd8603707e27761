"""scripts/test.sh: when a set-up failure may fall back to the venv-only job, and what job 2 runs.

Each test runs a copy of the script in a tree of its own whose scripts/setup.sh, tools and pytest
are stubs that record how they were called: the real set-up and suite are never run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# job 2's files, as the script lists them
EMBEDDED = re.findall(r"^  (tests/\S+)$", (ROOT / "scripts" / "test.sh").read_text(), re.M)


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _run(
    tmp_path: Path, *args: str, setup_status: int = 0, uid: int = 1000, ci: str | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """scripts/test.sh ARGS where scripts/setup.sh exits SETUP_STATUS (and --venv-only 0), `id -u`
    says UID and CI is CI (unset: None); its status and output, and every call a stub recorded."""
    tree, calls = tmp_path / "tree", tmp_path / "calls"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test.sh", tree / "scripts" / "test.sh")
    _script(
        tree / "scripts" / "setup.sh",
        f'echo "setup $*" >>{calls}\n[ "${{1:-}}" = --venv-only ] && exit 0\n'
        f'[ {setup_status} = 0 ] || echo "E: Unable to locate package chromium" >&2\nexit {setup_status}',
    )
    for tool in ("ruff", "lint-imports", "mypy", "coverage", "python"):
        _script(
            tree / ".venv" / "bin" / tool, f'echo "${{INGEST_TEST_EMBEDDED:+embedded }}{tool} $*" >>{calls}'
        )
    real_id = shutil.which("id")
    _script(tmp_path / "bin" / "id", f'[ "$*" = -u ] && {{ echo {uid}; exit; }}\nexec {real_id} "$@"')
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COVERAGE")}
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(
        [str(tree / "scripts" / "test.sh"), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_a_set_up_failure_fails_the_command_with_its_message_and_runs_no_test(tmp_path):
    """An apt error used to read as "no root or sudo": job 1 dropped, the command green."""
    done, calls = _run(tmp_path, "-q", setup_status=100)
    assert done.returncode == 100
    assert "E: Unable to locate package chromium" in done.stderr
    assert "scripts/setup.sh failed with exit status 100" in done.stderr
    assert calls == ["setup "]


def test_without_root_or_sudo_job_1_is_the_lint_alone_and_the_summary_says_why(tmp_path):
    done, calls = _run(tmp_path, "-q", setup_status=3)
    assert done.returncode == 0, done.stderr
    assert (
        "job 1, every test on MariaDB and Redis: NOT RUN: scripts/setup.sh needs root or sudo" in done.stdout
    )
    assert "setup --venv-only" in calls and "mypy " in calls
    assert not [c for c in calls if c.startswith("coverage")]
    assert calls[-1] == "embedded python -m pytest -q " + " ".join(EMBEDDED)


@pytest.mark.parametrize(("uid", "ci"), [(1000, "true"), (0, None)], ids=["on CI", "as root"])
def test_on_ci_or_as_root_wanting_root_or_sudo_is_a_failure(tmp_path, uid, ci):
    """There the services can always be had: falling back would pass with the suite unrun."""
    done, calls = _run(tmp_path, "-q", setup_status=3, uid=uid, ci=ci)
    assert done.returncode == 3
    assert "on CI or as root the suite must run on them" in done.stderr
    assert calls == ["setup "]


@pytest.mark.parametrize(
    ("args", "embedded"),
    [
        (["-q"], ["-q", *EMBEDDED]),
        (["tests/executor"], ["tests/executor/test_sqlite.py", "tests/executor/test_parse_handler.py"]),
        (
            ["-m", "lifecycle", "./tests/reliability/", "tests/executor/test_sqlite.py::test_one", "tests"],
            ["-m", "lifecycle", *EMBEDDED[4:], "tests/executor/test_sqlite.py::test_one", *EMBEDDED[:4]],
        ),
        (["-x", "tests/api", "tests/executor/test_claim.py"], None),
    ],
    ids=["no path", "a folder", "options, a node id, overlapping paths", "no embedded file"],
)
def test_job_2_runs_only_its_own_files_among_the_paths_given(tmp_path, args, embedded):
    """Job 2 got every argument after its own files, so `scripts/test.sh tests/executor` ran
    every executor test on SQLite, the MySQL-only ones failing."""
    done, calls = _run(tmp_path, *args, uid=0, ci="true")
    assert done.returncode == 0, done.stderr
    assert f"coverage run -m pytest {' '.join(args)}" in calls  # job 1: every argument
    job_2 = [c for c in calls if c.startswith("embedded ")]
    if embedded is None:
        assert job_2 == []
        assert "job 2, the core on the embedded default" in done.stdout
        assert "nothing to run: none of its files is among the paths given" in done.stdout
    else:
        assert job_2 == ["embedded python -m pytest " + " ".join(embedded)]
