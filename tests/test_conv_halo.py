"""Which forwards the few-output-channel kernel takes (``backends/cupy/conv_halo.py``);
the kernel itself is checked against float64 in tests/test_cuda_conv.py."""

import pytest

from tensorcore.backends.cupy import conv_halo


@pytest.mark.parametrize("cout, kernel_hw, stride, dilation, dtype, three_pass, taken", [
    (3, (3, 3), (1, 1), (1, 1), "float16", False, True),     # an SD VAE's last convolution
    (4, (3, 3), (1, 1), (1, 1), "bfloat16", False, True),    # a UNet's
    (8, (1, 1), (1, 1), (1, 1), "float32", False, True),     # TF32
    (9, (3, 3), (1, 1), (1, 1), "float16", False, False),    # more outputs than one n8 tile
    (3, (3, 3), (2, 2), (1, 1), "float16", False, False),    # strided
    (3, (3, 3), (1, 1), (2, 2), "float16", False, False),    # dilated
    (3, (3, 3), (1, 1), (1, 1), "float32", True, False),     # 3xTF32 keeps the GEMM
    (3, (3, 3), (1, 1), (1, 1), "float64", False, False),
    (3, (7, 7), (1, 1), (1, 1), "float16", False, False),    # its halo would not fit
])
def test_covers(cout, kernel_hw, stride, dilation, dtype, three_pass, taken):
    assert conv_halo.covers(cout, kernel_hw, stride, dilation, dtype, three_pass) == taken


def test_two_blocks_fit_an_sm_for_every_kernel_it_takes():
    """Shared memory per block within the limit (two blocks per SM: 2 x (limit + 1 KiB)
    within 228 KiB); 3 x 3 and 5 x 3 kernels are taken."""
    assert 2 * (conv_halo.SMEM_LIMIT + 1024) <= 228 * 1024
    for r in range(1, 8):
        for s in range(1, 8):
            if conv_halo.covers(3, (r, s), (1, 1), (1, 1), "float16", False):
                assert conv_halo.smem_bytes((r, s)) <= conv_halo.SMEM_LIMIT
    assert conv_halo.covers(3, (5, 3), (1, 1), (1, 1), "float16", False)
