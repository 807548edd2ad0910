"""Launch-shape sweep of the fused elementwise kernel on the GPU.

    PYTHONPATH=. python3 tests/benchmarks/elementwise_sweep.py

Compiles ``affine_act_kernel`` (act(x * scale + bias), per-channel scale and bias) with
1, 2, 4 and 8 packs per thread per step and launches it at several blocks per SM on
64 M float32, printing each variant's time and its share of the device memcpy
bandwidth, next to PyTorch's eager ``silu(x * a + b)`` (three kernels).
"""

from __future__ import annotations

import cupy as cp
import bench_report  # this folder is on sys.path when run as a script
from gpu_ops import median_ms

from tensorcore.backends.cupy import loader

ACT_SILU, ACT_NONE = 4, 0


def main() -> None:
    bench_report.parse(__doc__)
    x = cp.random.standard_normal((8, 128, 256, 256), dtype=cp.float32)
    y = cp.empty_like(x)
    scale = cp.random.standard_normal(128, dtype=cp.float32)
    bias = cp.random.standard_normal(128, dtype=cp.float32)
    n, moved = x.size, 2 * x.nbytes
    stream = cp.cuda.get_current_stream().ptr
    copy = median_ms(lambda: cp.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, x.nbytes,
                                                         cp.cuda.runtime.memcpyDeviceToDevice, stream))
    bench_report.note(f"memcpy {copy:.4f} ms  {moved / copy / 1e6:.0f} GB/s")
    try:
        import torch

        tx = torch.as_tensor(x, device="cuda")
        ta, tb = torch.as_tensor(scale, device="cuda").view(1, -1, 1, 1), torch.as_tensor(bias, device="cuda").view(1, -1, 1, 1)
        t = median_ms(lambda: torch.nn.functional.silu(tx * ta + tb))
        bench_report.note(f"torch silu(x*a+b) eager {t:.4f} ms  {moved / t / 1e6:.0f} GB/s")
    except ImportError:
        pass
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    source = loader.source("elementwise.cu")
    table = bench_report.Table("affine_act_kernel on 64 M float32", ["packs", "blocks/SM", "act", "ms", "% memcpy"])
    for packs in (1, 2, 4, 8):
        code = source.replace("#define UNROLL 1", f"#define UNROLL {packs}")
        module = cp.RawModule(code=code, options=loader.OPTIONS, name_expressions=["affine_act_kernel<float>"])
        kernel = module.get_function("affine_act_kernel<float>")
        for blocks in (4, 8, 16):
            for act in (ACT_SILU, ACT_NONE):
                args = (x, scale, bias, y, n, 128, 256 * 256, act, 1)
                ms = median_ms(lambda: kernel((sms * blocks,), (loader.THREADS,), args), iters=60)
                table.row(packs, blocks, "silu" if act else "none", f"{ms:.4f}", f"{copy / ms * 100:.1f}%")


if __name__ == "__main__":
    main()
