"""``python -m diffusion train | sample | train-vae | sample-latent | generate``: diffusion on the
bundled digits, and images from a Stable Diffusion folder.

Every option has a default (``--help`` on each command lists them) except ``generate``'s
``--model`` and ``--prompt``; a bad value, an output path that cannot be written, a folder
holding another run or a checkpoint that does not fit stops the command with a one-line
message and exit status 2, before any work starts and before anything is created.  The
backend is chosen by ``TENSORCORE_BACKEND`` (numpy, numba or cupy).
"""

from __future__ import annotations

import argparse
import sys

from .args import (OneLineParser, UsageError, digit_labels, float_in, int_list, lora_option, non_negative_float,
                   non_negative_int, pixel_size, positive_float, positive_int, probability)
from .generate import DTYPES, SCHEDULERS

IMAGE_SIZES = (8, 16, 32)


def _add_sampling(parser: argparse.ArgumentParser, guidance: float) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--sample-steps", type=positive_int, default=25, help="denoising steps (default: %(default)s)")
    group.add_argument("--sampler", choices=("ddim", "ddpm", "dpm", "euler"), default="dpm",
                       help="scheduler used to sample (default: %(default)s)")
    group.add_argument("--guidance-scale", type=non_negative_float, default=guidance,
                       help="classifier-free guidance scale; 1 turns guidance off (default: %(default)s)")
    group.add_argument("--eta", type=non_negative_float, default=0.0,
                       help="DDIM noise level, 0 = deterministic (default: %(default)s)")
    group.add_argument("--per-class", type=positive_int, default=10,
                       help="images per digit, one grid row per digit (default: %(default)s)")
    group.add_argument("--digits", type=digit_labels, default=tuple(range(10)),
                       help="digits to sample, e.g. 0,3,7 or 0-9 (default: 0-9)")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="output folder (default: runs/<command>-<timestamp>)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_training(parser: argparse.ArgumentParser, steps: int, batch_size: int, lr: float, channels: str,
                  image_size: int) -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--steps", type=positive_int, default=steps, help="optimizer steps (default: %(default)s)")
    group.add_argument("--batch-size", type=positive_int, default=batch_size, help="(default: %(default)s)")
    group.add_argument("--lr", type=positive_float, default=lr, help="peak AdamW learning rate (default: %(default)s)")
    group.add_argument("--warmup-steps", type=non_negative_int, default=100,
                       help="linear warmup, then cosine decay (default: %(default)s)")
    group.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="(default: %(default)s)")
    group.add_argument("--grad-clip", type=non_negative_float, default=1.0,
                       help="max gradient norm, 0 = no clipping (default: %(default)s)")
    group.add_argument("--ema-decay", type=probability, default=0.999,
                       help="decay of the weights' moving average used to sample (default: %(default)s)")
    group.add_argument("--checkpoint-every", type=positive_int, default=500, help="(default: %(default)s)")
    group.add_argument("--log-every", type=positive_int, default=10,
                       help="steps per row of metrics.csv (default: %(default)s)")
    group.add_argument("--resume", default=None,
                       help="continue from a checkpoint file or a run folder (default: start afresh)")
    group.add_argument("--image-size", type=int, choices=IMAGE_SIZES, default=image_size,
                       help="digits resized to this side (default: %(default)s)")
    group.add_argument("--channels", type=int_list, default=channels,
                       help="channels per level, comma-separated (default: %(default)s)")
    group.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                       help="run each training step as one compiled plan (tc.compile); auto = on, except "
                            "on the NumPy reference backend (default: %(default)s)")


def _add_generate(commands: argparse._SubParsersAction) -> None:
    """``generate``: only ``--model`` and ``--prompt`` are required; options left out take the
    pipeline's defaults (diffusers'), or the folder's own scheduler."""
    generate = commands.add_parser("generate", help="images from a Stable Diffusion 1.x/2.x or SDXL folder "
                                                    "(diffusers layout), text to image or image to image")
    generate.add_argument("--model", required=True, metavar="FOLDER",
                          help="a diffusers Stable Diffusion folder (model_index.json, unet/, vae/, text_encoder/...)")
    generate.add_argument("--prompt", required=True, metavar="TEXT", help="what the images show")
    generate.add_argument("--negative-prompt", default=None, metavar="TEXT",
                          help="what to steer away from (default: none)")
    generate.add_argument("--steps", type=positive_int, default=50, help="denoising steps (default: %(default)s)")
    generate.add_argument("--guidance-scale", type=non_negative_float, default=None,
                          help="classifier-free guidance scale; 1 turns guidance off (default: 7.5, SDXL 5)")
    generate.add_argument("--size", type=pixel_size, default=None, metavar="WxH",
                          help="WIDTHxHEIGHT, multiples of 8 (default: the model's own size, or the --image's)")
    generate.add_argument("--scheduler", choices=tuple(SCHEDULERS), default=None,
                          help="sampler replacing the folder's own scheduler, on the same noise schedule "
                               "(default: the folder's)")
    generate.add_argument("--lora", type=lora_option, action="append", default=[], metavar="FILE[:SCALE]",
                          help="apply a LoRA .safetensors file with this weight (default 1); repeat for several")
    generate.add_argument("--image", default=None, metavar="FILE",
                          help="start from this image (image to image; Stable Diffusion 1.x/2.x folders)")
    generate.add_argument("--strength", type=float_in(0.0, 1.0, low_open=True), default=None,
                          help="with --image: how far the image is noised, in (0, 1]; the higher, the less of "
                               "it stays (default: 0.8)")
    generate.add_argument("--num-images", type=positive_int, default=1,
                          help="images of the prompt, made in one call from --seed (default: %(default)s)")
    generate.add_argument("--dtype", choices=DTYPES, default="float32",
                          help="the models' weights and compute type (default: %(default)s)")
    generate.add_argument("--device", choices=("cpu", "cuda"), default=None,
                          help="(default: the backend's, cuda with TENSORCORE_BACKEND=cupy)")
    _add_common(generate)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m diffusion", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")

    train = commands.add_parser("train", help="train a class-conditional diffusion model on the digits and "
                                              "write a grid of samples")
    _add_common(train)
    _add_training(train, steps=1500, batch_size=64, lr=2e-3, channels="32,64", image_size=8)
    model = train.add_argument_group("model")
    model.add_argument("--layers-per-block", type=positive_int, default=1, help="(default: %(default)s)")
    model.add_argument("--prediction-type", choices=("epsilon", "v_prediction", "sample"), default="epsilon",
                       help="(default: %(default)s)")
    model.add_argument("--beta-schedule", choices=("linear", "scaled_linear", "squaredcos_cap_v2"),
                       default="squaredcos_cap_v2", help="(default: %(default)s)")
    model.add_argument("--label-dropout", type=probability, default=0.1,
                       help="share of labels replaced by the null label, for guidance (default: %(default)s)")
    model.add_argument("--vae", default=None,
                       help="train in the latent space of this VAE folder (from train-vae; the digits at the "
                            "VAE's sample_size; default: pixels)")
    parallel = train.add_argument_group("data parallel")
    parallel.add_argument("--devices", type=positive_int, default=1,
                          help="processes training together, each on its share of every batch: GPUs with "
                               "TENSORCORE_BACKEND=cupy, else CPU processes (default: %(default)s)")
    parallel.add_argument("--backend", choices=("nccl", "mpi"), default=None,
                          help="collectives between them: nccl (GPUs) or mpi (CPU processes) "
                               "(default: nccl on GPUs, else mpi)")
    _add_sampling(train, guidance=3.0)

    vae = commands.add_parser("train-vae", help="train an AutoencoderKL on the digits (for train --vae)")
    _add_common(vae)
    _add_training(vae, steps=1000, batch_size=64, lr=1e-3, channels="32,64", image_size=16)
    vae.add_argument("--latent-channels", type=positive_int, default=4, help="(default: %(default)s)")
    vae.add_argument("--kl-weight", type=non_negative_float, default=1e-3,
                     help="weight of the KL term per pixel (default: %(default)s)")

    for name, what in (("sample", "a pixel-space"), ("sample-latent", "a latent")):
        sampler = commands.add_parser(name, help=f"write a grid of samples from {what} model trained by train")
        _add_common(sampler)
        sampler.add_argument("--checkpoint", default=None,
                             help="a run folder, its pipeline/ folder or a checkpoint file "
                                  "(default: the newest runs/train-* folder)")
        _add_sampling(sampler, guidance=3.0)
    _add_generate(commands)
    return parser


def explicit_options(argv: list[str]) -> set[str]:
    """The options ``argv`` gives (by their ``dest``), as opposed to those left at their defaults."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in commands.choices.values():
        for option in command._actions:
            option.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv))) - {"command"}


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors are one line on stderr (status 2 for arguments and anything else
    refused before work starts, 1 otherwise)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.explicit = explicit_options(argv)
    from . import commands, generate, parallel

    if args.command == "train" and parallel.starts_ranks(args):
        return parallel.launch(argv, args)

    run = {"train": commands.train, "train-vae": commands.train_vae_command,
           "sample": commands.sample, "sample-latent": lambda a: commands.sample(a, latent=True),
           "generate": generate.generate_command}[args.command]
    try:
        run(args)
    except UsageError as exc:
        print(f"python -m diffusion {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, FloatingPointError) as exc:
        print(f"python -m diffusion {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"python -m diffusion {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0
