"""The README's client examples run as written: each fenced ``python`` block of its "Python
client" section, in a fresh interpreter whose environment points at this test's database and
Redis prefix, with a real executor process (parse, embeddings) finishing the work."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.procs import ROOT, ExecutorProcess, settings_env

SECTION = "## Python client"


def readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION + "\n")
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_the_section_has_examples():
    blocks = readme_blocks()
    assert len(blocks) >= 3 and all("Client" in b for b in blocks)


def test_readme_client_examples_run(settings, tmp_path):
    fleet = settings.replace(tenant_max_running=10, progress_interval_s=0.2)
    env = settings_env(fleet, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    outputs = []
    with ExecutorProcess(fleet, "readme_1", tmp_path / "executor.log") as executor:
        executor.wait_ready(120)
        for n, block in enumerate(readme_blocks()):
            script = tmp_path / f"example_{n}.py"
            script.write_text(block)
            done = subprocess.run(
                [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280
            )
            assert done.returncode == 0, (
                f"example {n}:\n{block}\n{done.stdout}\n{done.stderr}\n{executor.log()[-3000:]}"
            )
            outputs.append(done.stdout)
        executor.stop()
    first, second, third = outputs[:3]
    assert first.splitlines()[0].startswith("state ") and "end done" in first
    assert "chunks" in first and "beekeeping.md" in first  # a hit from the submitted file
    assert second.splitlines()[0] == "done" and "not found:" in second and "invalid:" in second
    assert "async end" in third
