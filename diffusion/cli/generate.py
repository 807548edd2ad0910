"""``generate``: images from a Stable Diffusion 1.x/2.x or SDXL folder, as diffusers saves them.

The folder's ``model_index.json`` says which pipeline runs it (``StableDiffusionXLPipeline``
for SDXL); ``--image`` runs image to image instead.  Every input -- the folder, the image,
the LoRA files, the output folder -- is checked before a model is loaded, and the images
are generated in memory before ``--out`` is created, so a refused or failed command
leaves nothing behind.  Each image is written as ``image-<k>.png`` with the parameters
that made it in the PNG's ``parameters`` text chunk, and the same JSON in
``image-<k>.json`` beside it.  All images of a call come from one generator seeded with
``--seed``, so the same command writes the same images again.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import os
import sys
import time
from typing import Any

from PIL import Image, PngImagePlugin

import tensorcore as tc
from layers.files import read_json
from tensorcore.atomic import write_atomic

from ..pipelines import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline, StableDiffusionXLPipeline
from ..pipelines.pretrained import INDEX_NAME
from ..schedulers import (DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                          EulerDiscreteScheduler, LCMScheduler, PNDMScheduler, UniPCMultistepScheduler)
from .args import LoraOption, UsageError
from .runs import check_outputs, planned_out

# --scheduler name -> the scheduler class and the options diffusers' usual swap gives it
SCHEDULERS: dict[str, tuple[type, dict[str, Any]]] = {
    "ddim": (DDIMScheduler, {}),
    "dpm++": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++"}),
    "dpm++-karras": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "use_karras_sigmas": True}),
    "euler": (EulerDiscreteScheduler, {}),
    "euler-a": (EulerAncestralDiscreteScheduler, {}),
    "unipc": (UniPCMultistepScheduler, {}),
    "pndm": (PNDMScheduler, {"skip_prk_steps": True}),
    "lcm": (LCMScheduler, {}),
}
DTYPES = ("float32", "float16", "bfloat16")  # --dtype choices (tc.dtypes.as_dtype makes each)


def generate_command(args: argparse.Namespace) -> None:
    """``generate``: check every input, load the pipeline, generate, then write the images."""
    out = planned_out(args.out, "generate")
    stems = [f"image-{k}" for k in range(args.num_images)]
    check_fresh_outputs(out, stems)
    index = read_model_index(args.model)
    pipeline_class = choose_pipeline(index, args)
    image = read_image(args.image, args.size) if args.image is not None else None
    check_loras(args.lora)
    check_device(args.device)
    check_steps_left(args.steps, image_strength(args, pipeline_class))

    pipe = load_pipeline(pipeline_class, args)
    parameters = recorded_parameters(args, pipe)
    start = time.perf_counter()
    result = pipe(**call_arguments(parameters, args.size, image), progress=not args.no_progress)
    if result.nonfinite_count:
        print(f"warning: {result.nonfinite_count} NaN/Inf values were replaced while sampling; "
              f"the images may be damaged (--dtype float32 avoids most)", file=sys.stderr)
    width, height = result.images[0].size
    parameters["size"] = f"{width}x{height}"

    os.makedirs(out, exist_ok=True)
    paths = [write_image(picture, {**parameters, "index": k}, os.path.join(out, stem))
             for k, (picture, stem) in enumerate(zip(result.images, stems))]
    print(f"generated {len(paths)} image{'s' * (len(paths) > 1)} of {width}x{height} in "
          f"{time.perf_counter() - start:.1f} s (parameters in the .json beside each PNG):")
    print("\n".join(paths))


# ----- checks before anything is loaded ---------------------------------------------------
def check_fresh_outputs(out: str, stems: list[str]) -> None:
    """Refuse an ``--out`` that cannot be a folder, or that already holds images of an earlier
    call (they are never overwritten)."""
    check_outputs(out)
    taken = [name for stem in stems for name in (f"{stem}.png", f"{stem}.json")
             if os.path.lexists(os.path.join(out, name))]
    if taken:
        raise UsageError(f"--out {out!r} already holds {taken[0]}; pick another folder")


def read_model_index(folder: str) -> dict[str, Any]:
    """The ``model_index.json`` of the ``--model`` folder (which pipeline and parts it holds)."""
    if not os.path.isdir(folder):
        raise UsageError(f"--model {folder!r} {'is not a folder' if os.path.exists(folder) else 'does not exist'}")
    path = os.path.join(folder, INDEX_NAME)
    if not os.path.isfile(path):
        raise UsageError(f"--model {folder!r} is not a diffusers folder (it has no {INDEX_NAME})")
    try:
        index = read_json(path, "--model")
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(index, dict):
        raise UsageError(f"--model {folder!r}: {INDEX_NAME} must hold a JSON object")
    return index


def choose_pipeline(index: dict[str, Any], args: argparse.Namespace) -> type[StableDiffusionPipeline]:
    """The pipeline class for the folder and the options: SDXL, image to image or text to image."""
    if args.strength is not None and args.image is None:
        raise UsageError("argument --strength: applies only with --image (how far the image is noised)")
    if str(index.get("_class_name", "")).startswith("StableDiffusionXL"):
        if args.image is not None:
            raise UsageError(f"--image: image to image runs on Stable Diffusion 1.x/2.x folders; {args.model!r} "
                             f"is an SDXL folder")
        return StableDiffusionXLPipeline
    return StableDiffusionPipeline if args.image is None else StableDiffusionImg2ImgPipeline


def read_image(path: str, size: tuple[int, int] | None) -> Image.Image:
    """The ``--image`` as RGB, resized to ``--size`` when given."""
    if not os.path.isfile(path):
        raise UsageError(f"--image {path!r} does not exist")
    try:
        with Image.open(path) as opened:
            image = opened.convert("RGB")
    except OSError as exc:  # Pillow's "cannot identify image file" is an OSError too
        raise UsageError(f"--image {path!r} cannot be read as an image ({exc})") from None
    return image.resize(size, Image.LANCZOS) if size is not None else image


def check_loras(loras: list[LoraOption]) -> None:
    """Each ``--lora`` file must exist (its keys are checked against the models once they load)."""
    for lora in loras:
        if not os.path.isfile(lora.path):
            raise UsageError(f"--lora {lora.path!r} does not exist")


def check_device(device: str | None) -> None:
    """``--device cuda`` needs a GPU, found before minutes go into loading weights."""
    if device == "cuda" and not tc.cuda.is_available():
        raise UsageError("--device cuda: no GPU found (it needs CuPy and an NVIDIA GPU)")


def pipeline_default(pipeline_class: type, argument: str) -> Any:
    """The pipeline's own default for a call argument left out on the command line (the
    guidance scale is 7.5 for Stable Diffusion and 5 for SDXL, as in diffusers)."""
    return inspect.signature(pipeline_class.__call__).parameters[argument].default


def image_strength(args: argparse.Namespace, pipeline_class: type) -> float | None:
    """How far image to image noises the ``--image`` (the pipeline's default when left out);
    None without an image."""
    if args.image is None:
        return None
    return args.strength if args.strength is not None else pipeline_default(pipeline_class, "strength")


def check_steps_left(steps: int, strength: float | None) -> None:
    """Image to image denoises ``int(steps * strength)`` steps, which must be at least one."""
    if strength is not None and int(steps * strength) < 1:
        raise UsageError(f"--strength {strength:g} with --steps {steps} leaves no denoising step "
                         f"(steps x strength must be at least 1)")


# ----- loading and generating -------------------------------------------------------------
def load_pipeline(pipeline_class: type[StableDiffusionPipeline],
                  args: argparse.Namespace) -> StableDiffusionPipeline:
    """The folder's pipeline with the chosen scheduler and LoRAs; a folder or LoRA file that
    does not load (a missing part, pickled weights, keys that fit no layer) is refused."""
    try:
        pipe = pipeline_class.from_pretrained(args.model, dtype=tc.dtypes.as_dtype(args.dtype), device=args.device)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--model {args.model!r}: {exc}") from None
    if args.scheduler is not None:
        scheduler_class, options = SCHEDULERS[args.scheduler]
        pipe.scheduler = scheduler_class.from_config(pipe.scheduler.config, **options)
    add_loras(pipe, args.lora)
    return pipe


def recorded_parameters(args: argparse.Namespace, pipe: StableDiffusionPipeline) -> dict[str, Any]:
    """What the images are made with, as written beside them: the options given, and the
    pipeline's defaults and the folder's scheduler for those left out (``size`` is filled in
    from the generated images)."""
    guidance = args.guidance_scale if args.guidance_scale is not None else \
        pipeline_default(type(pipe), "guidance_scale")
    return {"prompt": args.prompt, "negative_prompt": args.negative_prompt, "steps": args.steps,
            "guidance_scale": guidance, "seed": args.seed, "size": None,
            "scheduler": args.scheduler or type(pipe.scheduler).__name__,
            "loras": [{"file": lora.path, "scale": lora.scale} for lora in args.lora], "model": args.model,
            "image": args.image, "strength": image_strength(args, type(pipe)), "dtype": args.dtype,
            "num_images": args.num_images}


def add_loras(pipe: StableDiffusionPipeline, loras: list[LoraOption]) -> None:
    """Load each LoRA as its own adapter and make them all active at their scales."""
    names = [f"lora_{k}" for k in range(len(loras))]
    for name, lora in zip(names, loras):
        try:
            pipe.load_lora_weights(lora.path, adapter_name=name)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--lora {lora.path!r}: {exc}") from None
    if loras:
        pipe.set_adapters(names, [lora.scale for lora in loras])


def call_arguments(parameters: dict[str, Any], size: tuple[int, int] | None,
                   image: Image.Image | None) -> dict[str, Any]:
    """The pipeline call for ``parameters``: one call for all images, seeded once."""
    arguments = {"prompt": parameters["prompt"], "negative_prompt": parameters["negative_prompt"],
                 "num_inference_steps": parameters["steps"], "guidance_scale": parameters["guidance_scale"],
                 "num_images_per_prompt": parameters["num_images"], "seed": parameters["seed"], "output_type": "pil"}
    if image is not None:  # the size is the image's (resized to --size on reading)
        arguments.update(image=image, strength=parameters["strength"])
    elif size is not None:
        arguments.update(width=size[0], height=size[1])
    return arguments


# ----- writing ----------------------------------------------------------------------------
def write_image(image: Image.Image, parameters: dict[str, Any], stem: str) -> str:
    """Write ``<stem>.png`` with ``parameters`` as JSON in its ``parameters`` text chunk, and the
    same JSON as ``<stem>.json``, each atomically; returns the PNG's path."""
    text = json.dumps(parameters, indent=2, ensure_ascii=False)
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", text)  # an iTXt chunk when the text is not Latin-1
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    write_atomic(f"{stem}.png", buffer.getvalue())
    write_atomic(f"{stem}.json", (text + "\n").encode("utf-8"))
    return f"{stem}.png"
