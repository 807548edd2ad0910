"""Where the Numba backend's convolution time goes, against torch's whole convolution.

    python tests/benchmarks/cpu_conv_parts.py [--repeat 15]

For the two convolutions of ``cpu_bench.py`` (the 3x3 [16, 64, 32, 32] -> 64 layer,
which runs through Winograd F(4x4, 3x3), and the digits CNN's [128, 32, 8, 8] -> 64
layer, which runs through im2col + GEMM), times each pass end to end next to torch,
then each kernel and BLAS product of the pass on its own.  Best of ``--repeat`` runs;
nothing is asserted.  Numba and torch both use ``NUMBA_NUM_THREADS`` threads (default 2);
import order as in ``cpu_bench.py``: tensorcore first.
"""

from __future__ import annotations

import tensorcore  # noqa: F401  (first: sets the BLAS/OpenMP thread waits)

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import bench_report  # noqa: E402
from cpu_bench import best_time  # noqa: E402

Parts = dict[str, Callable[[], object]]
GEO = ((1, 1), (1, 1), (1, 1), 1)  # stride, padding, dilation, groups


def passes(nb, torch, x: np.ndarray, w: np.ndarray, g: np.ndarray) -> Parts:
    """The three passes of the convolution on the Numba backend, and torch's."""
    F = torch.nn.functional
    xt, wt, gt = (torch.from_numpy(a) for a in (x, w, g))
    xr, wr = xt.clone().requires_grad_(), wt.clone().requires_grad_()

    def torch_fwd_bwd():
        xr.grad = wr.grad = None
        F.conv2d(xr, wr, padding=1).backward(gt)

    return {"numba forward": lambda: nb.conv2d(x, w, *GEO),
            "numba input gradient": lambda: nb.conv2d_grad_input(g, w, x.shape, *GEO),
            "numba weight gradient": lambda: nb.conv2d_grad_weight(g, x, w.shape, *GEO),
            "torch forward": lambda: F.conv2d(xt, wt, padding=1),
            "torch forward + backward": torch_fwd_bwd}


def winograd_parts(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> Parts:
    """The Winograd kernels and batched products of the three passes."""
    from tensorcore.backends.numba.kernels import winograd as K

    n, c, h, wd = x.shape
    th, tw = -(-h // K.TILE), -(-wd // K.TILE)
    v = np.empty((36, c, n * th * tw), x.dtype)
    m = np.empty((36, w.shape[0], n * th * tw), x.dtype)
    u = K.weight_tiles(w)
    y = np.empty((n, w.shape[0], h, wd), x.dtype)
    return {"input transform": lambda: K.input_tiles_(v, x, 1, 1, th, tw),
            "weight transform": lambda: K.weight_tiles(w),
            "36 GEMMs U @ V": lambda: np.matmul(u, v, out=m),
            "output transform": lambda: K.output_tiles_(y, m, th, tw),
            "output-gradient transform": lambda: K.grad_tiles_(m, g, th, tw),
            "36 GEMMs dM @ V^T": lambda: np.matmul(m, v.transpose(0, 2, 1)),
            "weight-gradient transform": lambda: K.weight_grad(m[:, :, :c])}


def im2col_parts(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> Parts:
    """The im2col / col2im kernels, layout swaps and GEMMs of the three passes
    (same-size small planes: the channel-major kernels)."""
    from tensorcore.backends.numba.kernels import conv as K

    n, c, h, wd = x.shape
    cout = w.shape[0]
    cols = np.empty((c, 3, 3, n, h * wd), x.dtype)
    flat, w_rows = cols.reshape(c * 9, -1), w.reshape(cout, -1)
    g_rows = K.swap_leading_axes(g).reshape(cout, -1)
    out = np.empty((cout, n * h * wd), x.dtype)
    dx = np.empty_like(x)
    return {"im2col (channel-major)": lambda: K.im2col_same_(cols, K.swap_leading_axes(x), 1, 1, 1, 1),
            "GEMM W @ cols": lambda: np.matmul(w_rows, flat, out=out),
            "swap to NCHW": lambda: K.swap_leading_axes(out.reshape(cout, n, h, wd)),
            "GEMM W^T @ dY": lambda: np.matmul(w_rows.T, g_rows, out=flat),
            "col2im (channel-major)": lambda: K.col2im_same_(dx, cols, 1, 1, 1, 1),
            "GEMM cols @ dY^T": lambda: np.matmul(flat, g_rows.T)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    repeat = bench_report.parse(parser).repeat
    threads = int(os.environ.setdefault("NUMBA_NUM_THREADS", "2"))  # torch gets as many
    from tensorcore.backends import load

    nb = load("numba")
    import torch

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    cases = [("[16, 64, 32, 32] -> 64 (Winograd)", (16, 64, 32, 32), 64, winograd_parts),
             ("[128, 32, 8, 8] -> 64 (im2col)", (128, 32, 8, 8), 64, im2col_parts)]
    for title, shape, cout, parts in cases:
        x = rng.standard_normal(shape, dtype=np.float32)
        w = rng.standard_normal((cout, shape[1], 3, 3), dtype=np.float32) * 0.05
        g = rng.standard_normal((shape[0], cout) + shape[2:], dtype=np.float32)
        table = bench_report.Table(f"{title}, best of {repeat} runs, {threads} threads", ["pass or part", "ms"],
                                   first=28)
        for name, fn in {**passes(nb, torch, x, w, g), **parts(x, w, g)}.items():
            table.row(name, f"{best_time(fn, repeat) * 1e3:.3f}")


if __name__ == "__main__":
    main()
