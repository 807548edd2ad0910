"""GroupNorm on the GPU against the NumPy backend (float64 references): the backend op
forward and backward, and each forward kernel on its own, since the backend picks one
by shape and GPU: the resident one-wave kernel (whole tensor on chip, Hopper), the
cluster kernel (Hopper) and the two-pass kernels (any GPU, any shape)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

from tensorcore.backends.cupy import groupnorm, loader  # noqa: E402
from tensorcore.backends.cupy.backend import CupyBackend  # noqa: E402
from tensorcore.backends.numpy.backend import NumpyBackend  # noqa: E402
from gpu_check import as_float32, check, on_gpu, rand  # noqa: E402
from norm_bounds import group_norm_atols  # noqa: E402

GPU, REF = CupyBackend(), NumpyBackend()


# On Hopper the forward of (1, 32, 40, 40), (2, 64, 64, 64) and (1, 64, 64, 64) runs
# the cluster kernel; (4, 64, 32, 32) (many waves of nearly idle cluster blocks),
# (1, 4, 256, 260) and (1, 4, 512, 512) (groups too large for a cluster) the resident
# kernel; the odd plane sizes the two-pass kernels, with element loads.
@pytest.mark.parametrize("shape, groups", [((2, 6, 5, 3), 3), ((1, 8, 65, 63), 2),
                                           ((3, 8, 1), 4), ((1, 32, 40, 40), 32),
                                           ((2, 64, 64, 64), 8), ((1, 64, 64, 64), 4),
                                           ((4, 64, 32, 32), 32), ((1, 4, 256, 260), 1),
                                           ((1, 4, 512, 512), 1)])
@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(shape, groups, act, affine):
    x, g = as_float32(rand(*shape) * 2 + 0.5), as_float32(rand(*shape))
    w = as_float32(rand(shape[1])) if affine else None
    b = as_float32(rand(shape[1])) if affine else None
    opt = (lambda a: None if a is None else on_gpu(a))
    y, mean, rstd = GPU.group_norm(on_gpu(x), opt(w), opt(b), groups, 1e-5, act)
    ry, rmean, rrstd = REF.group_norm(x, w, b, groups, 1e-5, act)
    check(y, ry)
    check(mean, rmean)
    check(rstd, rrstd)
    got = GPU.group_norm_backward(on_gpu(g), on_gpu(x), opt(w), opt(b), mean, rstd, groups, act)
    want = REF.group_norm_backward(g, x, w, b, rmean, rrstd, groups, act)
    # the float32 error bound of each gradient (tests/norm_bounds.py): on two-element
    # groups dx's terms cancel, so a bound relative to dx alone would be wrong
    atols = group_norm_atols(x, g, w, b, rmean, rrstd, groups, act)
    for a, b_, atol in zip(got, want, atols):
        assert (a is None) == (b_ is None)
        if a is not None:
            check(a, b_, atol=atol)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_group_norm_dtypes(dtype):
    x = rand(2, 64, 16, 16) * 2 + 1
    w, b = rand(64), rand(64)
    y, mean, rstd = GPU.group_norm(on_gpu(x, dtype), on_gpu(w, dtype), on_gpu(b, dtype), 8,
                                   1e-5, "silu")
    as_stored = (lambda a: a.astype(dtype).astype(np.float64))  # float64 reference
    ry, rmean, rrstd = REF.group_norm(as_stored(x), as_stored(w), as_stored(b), 8, 1e-5, "silu")
    check(y, ry, dtype)
    check(mean, rmean, dtype)
    check(rstd, rrstd, dtype)


# ----- each forward kernel on its own -------------------------------------------------
KERNELS = ["resident", "cluster", "two-pass"]


def forward(kernel: str, x, w, b, groups: int, act: str):
    """(y, mean, rstd) from one kernel, or None where it does not apply."""
    n, c = x.shape[:2]
    s = x.size // (n * c)
    if kernel == "two-pass":
        return GPU._plane_forward(x, w, b, (n, groups), c // groups, False, 1e-5, act)
    if loader.compute_capability() < 90:
        pytest.skip("one-pass GroupNorm kernels need Hopper")
    run = {"resident": groupnorm._resident, "cluster": groupnorm.clustered}[kernel]
    return run(x, None, w, b, (n, groups), c // groups * s, s, 1e-5, act)  # no shift


# Resident layouts: one block ((2, 6, 8, 8)); blocks touching up to four statistics
# ((1, 32, 40, 40), (3, 10, 12, 12)); packs in shared memory ((4, 64, 128, 128): 16 MiB,
# 8 packs per thread); one statistic over 64 blocks, more than a warp merges in one
# step ((1, 4, 512, 512)).  The cluster kernel does not take the last (too large).
@pytest.mark.parametrize("shape, groups", [((2, 6, 8, 8), 3), ((1, 32, 40, 40), 32),
                                           ((3, 10, 12, 12), 5), ((2, 64, 64, 64), 8),
                                           ((4, 64, 128, 128), 32), ((1, 4, 512, 512), 1)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_forward_kernels(kernel, shape, groups):
    x = rand(*shape) * 3 + 2  # mean far from zero: the sums must not cancel
    w, b = rand(shape[1]), rand(shape[1])
    out = forward(kernel, on_gpu(x), on_gpu(w), on_gpu(b), groups, "silu")
    if kernel == "cluster" and shape == (1, 4, 512, 512):
        assert out is None
        return
    ry, rmean, rrstd = REF.group_norm(x, w, b, groups, 1e-5, "silu")
    for got, want in zip(out, (ry, rmean, rrstd)):
        check(got, want)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, "bfloat16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_forward_kernels_dtypes(kernel, dtype):
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    x, w, b = rand(2, 32, 24, 24) * 2 + 1, rand(32), rand(32)
    as_stored = (lambda a: a.astype(dtype).astype(np.float64))
    y, mean, rstd = forward(kernel, on_gpu(x, dtype), on_gpu(w, dtype), on_gpu(b, dtype), 8,
                            "none")
    ry, rmean, rrstd = REF.group_norm(as_stored(x), as_stored(w), as_stored(b), 8, 1e-5, "none")
    tol = np.float64 if dtype == np.float64 else np.float16  # bfloat16: float16's rtol
    check(y, ry, tol)
    check(mean, rmean, tol)
    check(rstd, rrstd, tol)


def test_resident_declines_what_does_not_fit():
    x = cp.empty((16, 256, 64, 64), dtype=np.float32)  # 64 MiB: more than registers +
    assert forward("resident", x, None, None, 32, "none") is None  # shared memory hold
    y = cp.empty((8, 256, 4, 4), dtype=np.float32)  # 256 tiny statistics: over 4 a block
    assert forward("resident", y, None, None, 256, "none") is None


@pytest.mark.parametrize("kernel", KERNELS)
def test_forward_kernels_repeat_and_replay(kernel):
    """Repeated calls and replays of a captured call stay correct (the resident kernel's
    grid barrier, the two-pass kernels' arrival counters zero again after each launch)."""
    shape, groups = (2, 64, 32, 32), 16
    w, b = on_gpu(rand(shape[1])), on_gpu(rand(shape[1]))
    for _ in range(3):
        x = rand(*shape) * 3 - 1
        y, _, _ = forward(kernel, on_gpu(x), w, b, groups, "silu")
        check(y, REF.group_norm(x, w.get(), b.get(), groups, 1e-5, "silu")[0])
    x_gpu = on_gpu(rand(*shape))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        forward(kernel, x_gpu, w, b, groups, "none")
        stream.begin_capture()
        y_gpu, _, _ = forward(kernel, x_gpu, w, b, groups, "none")
        graph = stream.end_capture()
        for _ in range(3):
            x = rand(*shape) + 2
            x_gpu[...] = on_gpu(x)
            graph.launch(stream)
            stream.synchronize()
            check(y_gpu, REF.group_norm(x, w.get(), b.get(), groups, 1e-5, "none")[0])
