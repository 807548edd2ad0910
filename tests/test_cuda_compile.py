"""Every CUDA source compiles to PTX for sm_90 with every instantiation the loader uses.

Runs without a GPU: only ``nvcc`` is needed.  A small wrapper per source takes the
address of each kernel instantiation the loader asks NVRTC for, which forces nvcc to
instantiate (and so type-check and compile) each of them.
"""

import shutil
import subprocess

import pytest

from tensorcore.backends.cupy import loader

NVCC = shutil.which("nvcc")
SOURCES = sorted(p.name for p in loader.CUDA_DIR.glob("*.cu"))


def wrapper(filename: str) -> str:
    names = [name for ctype in [None, *loader.C_TYPES.values()]
             for name in loader.name_expressions(filename, ctype)]
    takes = ",\n    ".join(f"(const void*)&{name}" for name in names)
    return f'#include "{filename}"\nconst void* instantiated[] = {{\n    {takes}\n}};\n'


def test_every_source_has_kernels():
    assert SOURCES
    for filename in SOURCES:
        assert loader.kernel_names(filename), filename


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("filename", SOURCES)
def test_compiles_for_sm90(filename, tmp_path):
    wrapped = tmp_path / f"wrap_{filename}"
    wrapped.write_text(wrapper(filename))
    result = subprocess.run(
        [NVCC, "-arch=sm_90", "-std=c++17", "--ptx", f"-I{loader.CUDA_DIR}",
         str(wrapped), "-o", str(tmp_path / "out.ptx")],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "out.ptx").read_text()
    for ctype in [None, *loader.C_TYPES.values()]:
        for name in loader.name_expressions(filename, ctype):
            assert name.split("<")[0] in ptx
