"""Op and activation codes come from one Python table (``backends/opcodes.py``): the CUDA
header is generated from it and the kernels of every backend read it."""

import re

from tensorcore.backends import fused_program, opcodes
from tensorcore.backends.base import ACTIVATIONS
from tensorcore.backends.cupy import loader


def test_checked_in_cuda_header_is_the_generated_one():
    assert opcodes.HEADER.read_text() == opcodes.cuda_header(), \
        "run: python -m tensorcore.backends.opcodes"


def test_no_cuda_source_declares_the_code_enums_itself():
    declared = re.compile(r"\benum\s+(Act|Unary|Binary|RedOp)\b")
    for source in [*loader.CUDA_DIR.glob("*.cu"), *loader.CUDA_DIR.glob("*.cuh")]:
        if source != opcodes.HEADER:
            assert not declared.search(source.read_text()), source.name


def test_every_kernel_family_using_codes_sees_the_header():
    for filename in ("elementwise.cu", "reduce.cu", "conv_igemm.cu", "planenorm.cu"):
        text = loader.source(filename)
        assert "enum Act { ACT_NONE = 0" in text and "enum RedOp" in text, filename


def test_python_tables_are_the_enums():
    assert ACTIVATIONS == ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
    assert opcodes.ACT_CODES == {a.name.lower(): a.value for a in opcodes.Act}
    assert fused_program.UNARY_FLOAT == tuple(opcodes.UNARY_CODES)
    assert fused_program.ARITHMETIC == tuple(opcodes.BINARY_CODES)


def test_numba_kernels_read_the_codes():
    from tensorcore.backends.numba.kernels import activations

    assert activations.ACT_CODES == opcodes.ACT_CODES  # as literals: kernels compile per activation
    assert all(type(code) is activations.ActivationCode for code in activations.ACT_CODES.values())
    for act in opcodes.Act:
        assert getattr(activations, f"_{act.name}") == act.value
