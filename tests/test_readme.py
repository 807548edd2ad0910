"""The README's Python examples run as written, one after another, as a reader would
paste them into one session."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def test_the_readme_examples_run_in_order(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)  # the examples write files
    namespace: dict = {"__name__": "__readme__"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    assert (tmp_path / "model.safetensors").exists()
    assert namespace["loss"].item() < 2.0  # the layers example trained (chance is ln 10 = 2.3)
