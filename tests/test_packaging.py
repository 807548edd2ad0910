"""The distribution has a name of its own, and every install hint installs this project."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_distribution_is_tensorcore_engine_with_four_import_packages():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["name"] == "tensorcore-engine"
    found = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {name.rstrip("*") for name in found} == {"tensorcore", "layers", "optim", "diffusion"}


def test_no_install_hint_names_the_unrelated_tensorcore_distribution():
    """``pip install tensorcore`` would install someone else's package: hints say
    ``pip install -e .`` (a checkout) or ``tensorcore-engine``."""
    wrong = re.compile(r"pip install\s+[\"']?tensorcore(?!-engine)")
    files = [REPO / "README.md", *REPO.glob("docs/*.md"),
             *(p for folder in ("tensorcore", "layers", "optim", "diffusion") for p in (REPO / folder).rglob("*.py"))]
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in files
                 for n, line in enumerate(path.read_text().splitlines(), 1) if wrong.search(line)]
    assert offenders == []
