"""Every CUDA source compiles to PTX for sm_90 with every instantiation the loader uses,
and for sm_90a too where it holds Hopper-only (wgmma) code, compiled only there.

Runs without a GPU: only ``nvcc`` is needed.  A small wrapper per source takes the
address of each kernel instantiation the loader asks NVRTC for (per storage type, and
the explicit tile-shape instantiations), which forces nvcc to instantiate (and so
type-check and compile) each of them.
"""

import shutil
import subprocess

import pytest

from tensorcore.backends.cupy import loader

NVCC = shutil.which("nvcc")
SOURCES = loader.sources()
TARGETS = [(f, "sm_90") for f in SOURCES] + \
    [(f, "sm_90a") for f in SOURCES if "wgmma" in loader.source(f)]


def instantiations(filename: str) -> list[str]:
    return [name for ctype in [None, *loader.C_TYPES.values()]
            for name in loader.name_expressions(filename, ctype)] + \
        loader.explicit_instances(filename)


def wrapper(filename: str) -> str:
    """The source as NVRTC gets it (local headers pasted in), then the instantiations."""
    names = instantiations(filename)
    takes = ",\n    ".join(f"(const void*)&{name}" for name in names)
    return f'{loader.source(filename)}\nconst void* instantiated[] = {{\n    {takes}\n}};\n'


def test_every_source_has_kernels():
    assert SOURCES
    for filename in SOURCES:
        assert loader.kernel_names(filename), filename


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("filename, arch", TARGETS)
def test_compiles_for_sm90(filename, arch, tmp_path):
    wrapped = tmp_path / f"wrap_{filename}"
    wrapped.write_text(wrapper(filename))
    result = subprocess.run(
        [NVCC, f"-arch={arch}", "-std=c++17", "--ptx", str(wrapped), "-o", str(tmp_path / "out.ptx")],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "out.ptx").read_text()
    entries = [line for line in ptx.splitlines() if ".entry" in line]
    names = instantiations(filename)
    for base in {name.split("<")[0] for name in names}:
        wanted = sum(name.split("<")[0] == base for name in names)
        found = sum(f"{len(base)}{base}" in entry for entry in entries)  # mangled: length + name
        assert found >= wanted, (base, found, wanted)
