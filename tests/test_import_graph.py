"""The layering rule: the engine's lower layers never import the compiler.

``tensorcore.ops``, ``tensorcore.backends``, ``optim`` and ``layers`` reach the tracer
only through the leaf module ``tensorcore.tracing``; an import of ``tensorcore.compile``
anywhere in their source (at the top or inside a function, absolute or relative) fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["tensorcore/ops", "tensorcore/backends", "optim", "layers"]
FORBIDDEN = "tensorcore.compile"


def _package(path: Path) -> list[str]:
    """The package a source file's relative imports start from."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1]


def _imports(source: str, package: list[str]) -> list[str]:
    """Every module an import statement in ``source`` names, relative imports resolved
    against ``package`` (``from tensorcore import compile`` names tensorcore.compile)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names]
    return found


def _reaches_compile(name: str) -> bool:
    return name == FORBIDDEN or name.startswith(FORBIDDEN + ".")


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_never_imports_compile(layer: str) -> None:
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, f"no sources under {layer}"
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in files
                 for name in _imports(path.read_text(), _package(path)) if _reaches_compile(name)]
    assert not offenders, "imports of tensorcore.compile below the compiler:\n" + "\n".join(offenders)


@pytest.mark.parametrize("source", ["from ..compile import trace", "from .. import compile",
                                    "from ..compile.trace import Tracer", "import tensorcore.compile.host",
                                    "def f():\n    from tensorcore.compile import host_effect"])
def test_checker_sees_every_form(source: str) -> None:
    package = _package(ROOT / "tensorcore" / "ops" / "embedding.py")
    assert any(map(_reaches_compile, _imports(source, package)))


def test_checker_passes_the_leaf_module() -> None:
    package = _package(ROOT / "tensorcore" / "ops" / "embedding.py")
    assert not any(map(_reaches_compile, _imports("from ..tracing import is_tracing\nfrom .. import compiler",
                                                  package)))


def test_the_tracing_hook_is_a_leaf() -> None:
    path = ROOT / "tensorcore" / "tracing.py"
    assert not [name for name in _imports(path.read_text(), _package(path)) if name.startswith("tensorcore")]
