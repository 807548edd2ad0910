"""Pipeline folders, laid out as diffusers lays them out.

    folder/model_index.json          which class each part is, and the pipeline's options
    folder/unet/                     config.json + diffusion_pytorch_model.safetensors
    folder/scheduler/scheduler_config.json
    folder/vae/                      (latent pipelines)

``model_index.json`` names each part as ``["diffusion", class name]`` and carries the
pipeline's own option ``null_class_label``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tensorcore.atomic import write_atomic

from ..models import AutoencoderKL, UNet2D
from ..schedulers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler
from .modules import unwrapped

INDEX_NAME = "model_index.json"
SCHEDULERS = {cls.__name__: cls for cls in (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler,
                                             EulerDiscreteScheduler)}


def save_pipeline(pipeline: Any, folder: str | os.PathLike) -> None:
    """Write every part, then the index last (a folder with an index is complete)."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    index: dict[str, Any] = {"_class_name": type(pipeline).__name__, "null_class_label": pipeline.null_class_label,
                             "unet": ["diffusion", "UNet2D"],
                             "scheduler": ["diffusion", type(pipeline.scheduler).__name__]}
    unwrapped(pipeline.unet).save_pretrained(os.path.join(folder, "unet"))
    pipeline.scheduler.save_config(os.path.join(folder, "scheduler"))
    if getattr(pipeline, "vae", None) is not None:
        unwrapped(pipeline.vae).save_pretrained(os.path.join(folder, "vae"))
        index["vae"] = ["diffusion", "AutoencoderKL"]
    write_atomic(os.path.join(folder, INDEX_NAME), (json.dumps(index, indent=2) + "\n").encode())


def read_index(folder: str | os.PathLike) -> dict[str, Any]:
    """The folder's ``model_index.json``; a clear error when it is missing or malformed."""
    path = os.path.join(os.fspath(folder), INDEX_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"from_pretrained: {os.fspath(folder)!r} is not a pipeline folder "
                                f"(no {INDEX_NAME})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"from_pretrained: {path!r} is not valid JSON ({exc})") from exc
    if not isinstance(index, dict):
        raise ValueError(f"from_pretrained: {path!r} must hold a JSON object")
    return index


def load_parts(folder: str | os.PathLike, scheduler: Any = None, device: str | None = None
               ) -> dict[str, Any]:
    """The parts of the pipeline stored in ``folder``: unet, scheduler (the stored one unless
    one is given), vae (or None) and null_class_label."""
    folder = os.fspath(folder)
    index = read_index(folder)
    if scheduler is None:
        name = (index.get("scheduler") or [None, "DDIMScheduler"])[1]
        if name not in SCHEDULERS:
            raise ValueError(f"from_pretrained: unknown scheduler class {name!r} in {folder!r}; "
                             f"known: {sorted(SCHEDULERS)}")
        scheduler = SCHEDULERS[name].from_pretrained(os.path.join(folder, "scheduler"))
    vae = AutoencoderKL.from_pretrained(os.path.join(folder, "vae"), device=device) if "vae" in index else None
    return {"unet": UNet2D.from_pretrained(os.path.join(folder, "unet"), device=device), "scheduler": scheduler,
            "vae": vae, "null_class_label": index.get("null_class_label")}
