"""DDIM sampling with the reference UNet, tensorcore against a diffusers-style loop on PyTorch.

    TENSORCORE_BACKEND=cupy python tests/benchmarks/ddim_bench.py             # GPU (H200)
    python tests/benchmarks/ddim_bench.py --cpu-train                         # + CPU `train` wall time

GPU part: ``UNet2D.reference()`` (57.6 M parameters) with random weights, saved as a
diffusers folder and loaded by diffusers' ``UNet2DModel``, so both sides run the same
config and weights.  ``DiffusionPipeline.generate`` (eager, sync and async; compiled --
one CUDA graph per step for the UNet and the guidance combine --, sync and async) and the loop
of diffusers' ``DDIMPipeline`` (``scheduler.step(unet(x, t).sample, t, x)``, PyTorch
eager) each sample [1, 4, 128, 128] latents over 10 and 50 DDIM steps from the same
starting noise, TF32 allowed on both sides.  Each figure is the median of several
runs after a warm-up; the results are compared (max |difference| against PyTorch's, and
compiled against eager).

``--cpu-train`` times ``python -m diffusion train`` (all defaults, Numba backend, a
fresh output folder) in a subprocess: the README's first command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.append(".gpu-vendor")  # the GPU machine vendors diffusers here

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def median_ms(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up: kernel compilation, memory pools, cuBLAS handles
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), result


def gpu_rows(steps_list: list[int], repeats: int) -> None:
    import torch
    from diffusers import DDIMScheduler as TorchDDIM
    from diffusers import UNet2DModel

    import tensorcore as tc
    from diffusion import DDIMScheduler, UNet2D
    from diffusion.pipelines import DiffusionPipeline

    tc.set_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    tc.manual_seed(0)
    ours = UNet2D.reference().to("cuda").eval()
    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(folder)
        theirs = UNet2DModel.from_pretrained(folder).to("cuda").eval()
    pipe = DiffusionPipeline(ours, DDIMScheduler(), compile=False)
    compiled = DiffusionPipeline(ours, DDIMScheduler(), compile=True)
    reference_scheduler = TorchDDIM()
    noise = np.random.default_rng(0).standard_normal((1, 4, 128, 128)).astype(np.float32)
    latents, torch_latents = tc.tensor(noise, device="cuda"), torch.tensor(noise, device="cuda")

    def ours_sync(steps: int, pipe=pipe):
        images = pipe.generate(num_inference_steps=steps, latents=latents, progress=False).images
        tc.cuda.synchronize()
        return images

    def ours_async(steps: int, pipe=pipe):
        return asyncio.run(pipe.generate_async(num_inference_steps=steps, latents=latents, progress=False)).images

    def torch_loop(steps: int):
        reference_scheduler.set_timesteps(steps)
        x = torch_latents
        with torch.no_grad():
            for t in reference_scheduler.timesteps:
                x = reference_scheduler.step(theirs(x, t).sample, t, x, eta=0.0).prev_sample
            images = (x / 2 + 0.5).clamp(0, 1)
        torch.cuda.synchronize()
        return images

    print(f"reference UNet DDIM generate [1,4,128,128], TF32 allowed ({repeats} runs, median)")
    print(f"{'steps':>5} | {'eager ms':>9} | {'async ms':>9} | {'compiled ms':>11} | {'c. async ms':>11} | "
          f"{'torch ms':>9} | {'compiled/torch':>14} | {'c. ms/step':>10} | max |diff| torch | compiled-eager")
    for steps in steps_list:
        ours_ms, ours_images = median_ms(lambda: ours_sync(steps), repeats)
        async_ms, async_images = median_ms(lambda: ours_async(steps), repeats)
        compiled_ms, compiled_images = median_ms(lambda: ours_sync(steps, compiled), repeats)
        compiled_async_ms, compiled_async_images = median_ms(lambda: ours_async(steps, compiled), repeats)
        torch_ms, torch_images = median_ms(lambda: torch_loop(steps), repeats)
        assert np.array_equal(ours_images.numpy(), async_images.numpy()), "async differs from sync"
        assert np.array_equal(compiled_images.numpy(), compiled_async_images.numpy()), "compiled async differs"
        diff = float(np.abs(ours_images.numpy() - torch_images.cpu().numpy()).max())
        compiled_diff = float(np.abs(ours_images.numpy() - compiled_images.numpy()).max())
        print(f"{steps:>5} | {ours_ms:>9.1f} | {async_ms:>9.1f} | {compiled_ms:>11.1f} | {compiled_async_ms:>11.1f} | "
              f"{torch_ms:>9.1f} | {compiled_ms / torch_ms:>13.2f}x | {compiled_ms / steps:>10.2f} | "
              f"{diff:.2e} | {compiled_diff:.2e}")


def cpu_train_seconds() -> float:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "TENSORCORE_BACKEND": "numba", "PYTHONPATH": REPO}
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "diffusion", "train", "--out", os.path.join(folder, "run"),
                        "--no-progress"], check=True, env=env, cwd=folder)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 50], help="DDIM step counts")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure")
    parser.add_argument("--cpu-train", action="store_true", help="also time `python -m diffusion train` on the CPU")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU rows")
    args = parser.parse_args()
    if not args.no_gpu:
        gpu_rows(args.steps, args.repeats)
    if args.cpu_train:
        seconds = cpu_train_seconds()
        print(f"python -m diffusion train (defaults, numba backend, {os.cpu_count()} CPU cores): "
              f"{seconds:.1f} s wall ({seconds / 60:.2f} min)")


if __name__ == "__main__":
    main()
