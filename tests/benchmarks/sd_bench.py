"""Stable-Diffusion-class work on the GPU: tensorcore against diffusers + PyTorch, same configs and weights, one run.

    TENSORCORE_BACKEND=cupy python tests/benchmarks/sd_bench.py                  # everything
    TENSORCORE_BACKEND=cupy python tests/benchmarks/sd_bench.py --only unet --no-torch-compile

Workloads (diffusers' SD-1.5 configs, random weights, batch as a guided call runs them):

* ``unet``: the SD-1.5 UNet forward on [2, 4, 64, 64] with text states [2, 77, 768], in
  float16 and bfloat16;
* ``vae``: the SD VAE decode [1, 4, 64, 64] -> [1, 3, 512, 512], float16;
* ``txt2img``: 50-step text to image at 512², guidance 7.5 (text encoder, 50 UNet calls
  on [uncond, cond], the PNDM update, the VAE decode), float16;
* ``sdxl``: the SDXL UNet forward on [2, 4, 128, 128], float16 (when memory allows).

Rows: ours eager, ours compiled (``tc.compile``: one CUDA graph per call), diffusers
eager, PyTorch CUDA-graph replay and ``torch.compile`` (default mode, ``dynamic=False``)
captured in a CUDA graph.  Ours holds its convolution weights channels-last
(``Module.to(memory_format=tc.channels_last)``, as ``from_pretrained`` does on the GPU), so
no plan keeps a packed copy of them.  Times are medians of CUDA-event timings.  Each
side's GPU memory while its fastest form replays is printed as the bytes it holds from
the driver once cached free blocks are returned ("MB": ours ``tc.cuda.memory_reserved()``,
every pool: weights, workspaces, each plan's whole pool; PyTorch ``memory_reserved()``
after ``empty_cache()``, its graph's pool included, the earlier graph dropped), and
PyTorch's ``max_memory_allocated`` over those replays, counted from after the capture
(live tensors only: the blocks its capture freed and its graph reuses are not counted).
Outputs are compared (max |ours - diffusers| over max |diffusers|).  Printed, never asserted.
"""

from __future__ import annotations

import sys

sys.path.append(".gpu-vendor")  # the GPU machine vendors diffusers here

import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

import bench_report  # noqa: E402  (tests/benchmarks/bench_report.py)

WORKLOADS = ("unet", "vae", "txt2img", "sdxl")
SD15_UNET = dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
SDXL_UNET = dict(sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                 block_out_channels=(320, 640, 1280), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
                 transformer_layers_per_block=(1, 2, 10), use_linear_projection=True, addition_embed_type="text_time",
                 addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816)
SD15_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512),
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                layers_per_block=2, sample_size=512)
SD15_TEXT = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, max_position_embeddings=77, eos_token_id=49407, bos_token_id=49406)
SD15_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True,
                      steps_offset=1, set_alpha_to_one=False)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--no-torch-compile", action="store_true", help="skip the torch.compile rows (slow to build)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per row")
    parser.add_argument("--dtypes", nargs="+", choices=("float16", "bfloat16"), default=["float16", "bfloat16"],
                        help="the SD-1.5 UNet's dtypes")
    parser.add_argument("--steps", type=int, default=50, help="txt2img steps")
    return bench_report.parse(parser)


# ----- timing ----------------------------------------------------------------------------------------
def timed_ms(fn: Callable[[], Any], iters: int) -> float:
    """Median CUDA-event ms per call (events on the legacy default stream both sides use)."""
    from gpu_timing import event_ms

    return event_ms(fn, iters, warmup=3)


def torch_graph(fn: Callable[[], Any]) -> tuple[Callable[[], Any], Any]:
    from gpu_timing import torch_graph as capture

    return capture(fn)


def ours_held_mb() -> float:
    """Device memory the engine holds once cached free blocks are returned: every pool's
    reserved bytes (weights, workspaces, each plan's whole pool)."""
    import cupy as cp

    import tensorcore as tc

    cp.get_default_memory_pool().free_all_blocks()
    return tc.cuda.memory_reserved() / 2 ** 20


def torch_held_mb() -> float:
    """The same for PyTorch: reserved bytes after ``empty_cache`` (a graph's pool stays)."""
    import torch

    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() / 2 ** 20


def torch_peak_mb() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2 ** 20


def reset_peaks() -> None:
    import cupy as cp
    import torch

    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def relative_diff(ours: Any, theirs: Any) -> float:
    a = np.asarray(ours.numpy() if hasattr(ours, "numpy") and not hasattr(ours, "detach") else ours, np.float32)
    b = theirs.float().cpu().numpy() if hasattr(theirs, "detach") else np.asarray(theirs, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


# ----- twins ------------------------------------------------------------------------------------------
def unet_twins(config: dict, dtype_name: str) -> tuple[Any, Any]:
    """(ours, diffusers') UNet2DConditionModel with the same random weights, on the GPU in ``dtype_name``."""
    import diffusers
    import torch

    import tensorcore as tc
    from diffusion import UNet2DConditionModel

    torch.manual_seed(0)
    theirs = diffusers.UNet2DConditionModel(**config).eval()
    ours = UNet2DConditionModel(**config)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    dtype = getattr(torch, dtype_name)
    ours.to("cuda", dtype=getattr(tc, dtype_name), memory_format=tc.channels_last)
    return ours.eval(), theirs.to("cuda", dtype=dtype)


def vae_twins() -> tuple[Any, Any]:
    import diffusers
    import torch

    import tensorcore as tc
    from diffusion import AutoencoderKL

    torch.manual_seed(1)
    theirs = diffusers.AutoencoderKL(**SD15_VAE).eval()
    ours = AutoencoderKL(**SD15_VAE)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    ours.to("cuda", dtype=tc.float16, memory_format=tc.channels_last)
    return ours.eval(), theirs.to("cuda", dtype=torch.float16)


# ----- rows -------------------------------------------------------------------------------------------
def forward_rows(table: bench_report.Table, label: str, ours_call: Callable[[], Any], ours_module: Any,
                 theirs_call: "Call", theirs_module: Any, iters: int, torch_compile: bool,
                 compiled_call: Callable[[Any], Callable[[], Any]]) -> None:
    """One workload: ours eager / compiled, diffusers eager / CUDA graph / torch.compile + graph."""
    import tensorcore as tc
    import torch

    with tc.no_grad(), torch.inference_mode():
        reset_peaks()
        reference = theirs_call()
        eager = timed_ms(ours_call, iters)
        diff = relative_diff(ours_call(), reference)
        tc.cuda.empty_cache()  # the eager calls' scratch and cached blocks
        compiled = tc.compile(ours_module)
        ours_compiled = compiled_call(compiled)
        compiled_ms = timed_ms(ours_compiled, iters)
        compiled_diff = relative_diff(ours_compiled(), reference)
        ours_mb = ours_held_mb()
        theirs_eager = timed_ms(theirs_call, iters)
        replay, kept = torch_graph(theirs_call)
        torch.cuda.reset_peak_memory_stats()  # from here: the peak while the graph replays
        graph_ms = timed_ms(replay, iters)
        theirs_mb = torch_peak_mb()
        theirs_held = torch_held_mb()
        row = [label, f"{eager:.2f}", f"{compiled_ms:.2f}", f"{theirs_eager:.2f}", f"{graph_ms:.2f}"]
        if torch_compile:
            del replay, kept
            gc.collect()
            torch.cuda.empty_cache()
            module_compiled = torch.compile(theirs_module, dynamic=False)
            built = time.perf_counter()
            call = theirs_call.rebound(module_compiled)
            call()
            build_s = time.perf_counter() - built
            replay_c, kept_c = torch_graph(call)
            torch.cuda.reset_peak_memory_stats()
            compile_ms = timed_ms(replay_c, iters)
            theirs_mb = torch_peak_mb()
            theirs_held = torch_held_mb()
            row += [f"{compile_ms:.2f}", f"{compile_ms / compiled_ms:.2f}x", f"{build_s:.0f} s"]
        else:
            row += ["-", "-", "-"]
        row += [f"{graph_ms / compiled_ms:.2f}x", f"{diff:.1e} / {compiled_diff:.1e}", f"{ours_mb:.0f}",
                f"{theirs_held:.0f}", f"{theirs_mb:.0f}"]
        table.row(*row)


class Call:
    """A call ``fn(module)`` bound to a module, re-bindable to another (its torch.compile twin)."""

    def __init__(self, fn: Callable[[Any], Any], module: Any) -> None:
        self.fn, self.module = fn, module

    def __call__(self) -> Any:
        return self.fn(self.module)

    def rebound(self, module: Any) -> "Call":
        return Call(self.fn, module)


def unet_table(args: argparse.Namespace, which: str) -> None:
    import tensorcore as tc
    import torch

    config, size, text = (SD15_UNET, 64, 768) if which == "unet" else (SDXL_UNET, 128, 2048)
    columns = ["dtype", "ours eager", "ours compiled", "diffusers eager", "torch graph", "torch.compile+graph",
               "speed-up vs compile", "compile build", "speed-up vs graph", "rel diff eager/compiled",
               "ours MB", "torch MB", "torch MB allocated"]
    name = "SD-1.5 UNet" if which == "unet" else "SDXL UNet"
    table = bench_report.Table(f"{name} forward [2, 4, {size}, {size}], text [2, 77, {text}], ms", columns, first=8)
    rng = np.random.default_rng(0)
    sample = rng.standard_normal((2, 4, size, size)).astype(np.float32)
    states = rng.standard_normal((2, 77, text)).astype(np.float32)
    dtypes = args.dtypes if which == "unet" else ("float16",)
    for dtype_name in dtypes:
        ours, theirs = unet_twins(config, dtype_name)
        tdtype, odtype = getattr(torch, dtype_name), getattr(tc, dtype_name)
        o = {"sample": tc.tensor(sample, device="cuda").to(dtype=odtype), "t": tc.tensor([501], device="cuda"),
             "states": tc.tensor(states, device="cuda").to(dtype=odtype)}
        t = {"sample": torch.tensor(sample, device="cuda", dtype=tdtype), "t": torch.tensor([501], device="cuda"),
             "states": torch.tensor(states, device="cuda", dtype=tdtype)}
        o_added = t_added = None
        if which == "sdxl":
            embeds = rng.standard_normal((2, 1280)).astype(np.float32)
            ids = np.array([[1024, 1024, 0, 0, 1024, 1024]] * 2, dtype=np.float32)
            o_added = {"text_embeds": tc.tensor(embeds, device="cuda").to(dtype=odtype),
                       "time_ids": tc.tensor(ids, device="cuda").to(dtype=odtype)}
            t_added = {"text_embeds": torch.tensor(embeds, device="cuda", dtype=tdtype),
                       "time_ids": torch.tensor(ids, device="cuda", dtype=tdtype)}

        def ours_with(module: Any) -> Callable[[], Any]:
            return lambda: module(o["sample"], o["t"], o["states"], added_cond_kwargs=o_added)

        theirs_call = Call(lambda m: m(t["sample"], t["t"], t["states"], added_cond_kwargs=t_added).sample, theirs)
        forward_rows(table, dtype_name, ours_with(ours), ours, theirs_call, theirs, args.iters,
                     not args.no_torch_compile, ours_with)
        del ours, theirs


def vae_table(args: argparse.Namespace) -> None:
    import tensorcore as tc
    import torch

    columns = ["dtype", "ours eager", "ours compiled", "diffusers eager", "torch graph", "torch.compile+graph",
               "speed-up vs compile", "compile build", "speed-up vs graph", "rel diff eager/compiled",
               "ours MB", "torch MB", "torch MB allocated"]
    table = bench_report.Table("SD VAE decode [1, 4, 64, 64] -> [1, 3, 512, 512], ms", columns, first=8)
    ours, theirs = vae_twins()
    z = np.random.default_rng(2).standard_normal((1, 4, 64, 64)).astype(np.float32)
    zo, zt = tc.tensor(z, device="cuda").to(dtype=tc.float16), torch.tensor(z, device="cuda", dtype=torch.float16)
    theirs_call = Call(lambda decode: decode(zt).sample, theirs.decode)  # torch.compile compiles decode itself
    forward_rows(table, "float16", lambda: ours.decode(zo), ours, theirs_call, theirs.decode, args.iters,
                 not args.no_torch_compile, lambda compiled: (lambda: ours.decode_compiled(zo)))


def txt2img_table(args: argparse.Namespace) -> None:
    """50 steps end to end: ours (compiled chain) against diffusers' pipeline eager and with its UNet and VAE
    decode compiled (torch.compile, mode="reduce-overhead": CUDA graphs)."""
    import diffusers
    import torch
    import transformers

    import tensorcore as tc
    from diffusion import CLIPTextModel, PNDMScheduler, StableDiffusionPipeline

    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from test_sd_pipelines_gpu import character_tokenizer  # noqa: E402  (a vocabulary-free CLIP tokenizer)

    ours_unet, theirs_unet = unet_twins(SD15_UNET, "float16")
    ours_vae, theirs_vae = vae_twins()
    torch.manual_seed(3)
    theirs_text = transformers.CLIPTextModel(transformers.CLIPTextConfig(**SD15_TEXT)).eval()
    folder = tempfile.mkdtemp()
    theirs_text.save_pretrained(folder)
    ours_text = CLIPTextModel.from_pretrained(folder, dtype=tc.float16, device="cuda")
    theirs_text = theirs_text.to("cuda", dtype=torch.float16)
    tokenizer = character_tokenizer()
    theirs_tokenizer = _torch_tokenizer(tokenizer)
    scheduler = PNDMScheduler(**SD15_SCHEDULER)
    ours = StableDiffusionPipeline(ours_vae, ours_text, tokenizer, ours_unet, scheduler)
    theirs = diffusers.StableDiffusionPipeline(theirs_vae, theirs_text, theirs_tokenizer, theirs_unet,
                                               diffusers.PNDMScheduler(**SD15_SCHEDULER), None, None,
                                               requires_safety_checker=False)
    theirs.set_progress_bar_config(disable=True)
    prompt, steps = "an astronaut riding a horse on the moon", args.steps
    latents = np.random.default_rng(4).standard_normal((1, 4, 64, 64)).astype(np.float32)

    def run_ours() -> Any:
        return ours(prompt, num_inference_steps=steps, latents=tc.tensor(latents, device="cuda").to(dtype=tc.float16),
                    output_type="np", progress=False).images

    def run_theirs() -> Any:
        with torch.inference_mode():
            return theirs(prompt, num_inference_steps=steps, output_type="np",
                          latents=torch.tensor(latents, device="cuda", dtype=torch.float16)).images

    table = bench_report.Table(f"SD-1.5 txt2img 512², {steps} steps, guidance 7.5, float16, ms per image",
                               ["side", "ms", "ours vs this", "max |image diff|", "MB held"], first=30)
    reset_peaks()
    ours_ms, ours_images = wall_ms(run_ours, 3)
    ours_mb = ours_held_mb()
    table.row("ours (compiled chain)", f"{ours_ms:.1f}", "1.00x", "-", f"{ours_mb:.0f}")
    eager_ms, eager_images = wall_ms(run_theirs, 3)
    table.row("diffusers eager", f"{eager_ms:.1f}", f"{eager_ms / ours_ms:.2f}x",
              f"{float(np.abs(ours_images - eager_images).max()):.1e}", f"{torch_held_mb():.0f}")
    if not args.no_torch_compile:
        torch.cuda.reset_peak_memory_stats()
        theirs.unet = torch.compile(theirs_unet, mode="reduce-overhead", dynamic=False)
        theirs.vae.decode = torch.compile(theirs_vae.decode, mode="reduce-overhead", dynamic=False)
        compiled_ms, compiled_images = wall_ms(run_theirs, 3)
        table.row("diffusers, UNet + VAE torch.compile (CUDA graphs)", f"{compiled_ms:.1f}",
                  f"{compiled_ms / ours_ms:.2f}x", f"{float(np.abs(ours_images - compiled_images).max()):.1e}",
                  f"{torch_held_mb():.0f}")


def _torch_tokenizer(ours: Any) -> Any:
    """A transformers CLIPTokenizer on the same character-level vocabulary (for diffusers' side)."""
    import json

    import transformers

    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump(ours.vocab | {"<|startoftext|>": 49406, "<|endoftext|>": 49407}, f)
    with open(os.path.join(folder, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return transformers.CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"),
                                      model_max_length=77, pad_token="<|endoftext|>")


def wall_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of whole calls (each ends in a host read of the images), after one warm-up."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), result


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TENSORCORE_BACKEND", "cupy")
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    bench_report.note(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for workload in args.only:
        if workload in ("unet", "sdxl"):
            unet_table(args, workload)
        elif workload == "vae":
            vae_table(args)
        else:
            txt2img_table(args)


if __name__ == "__main__":
    main()
