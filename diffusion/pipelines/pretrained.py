"""Pipeline folders, laid out as diffusers lays them out.

    folder/model_index.json          which class each part is, and the pipeline's options
    folder/unet/                     config.json + diffusion_pytorch_model.safetensors
    folder/scheduler/scheduler_config.json
    folder/vae/                      (latent pipelines)

``model_index.json`` names each part as ``["diffusion", class name]`` and carries the
pipeline's own option ``null_class_label``.  Reading a folder checks every entry
(library, class, folder inside the pipeline folder) before any part is loaded.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from layers.files import inside, read_json
from tensorcore.atomic import write_atomic

from ..models import AutoencoderKL, UNet2D
from ..schedulers import (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                          EulerDiscreteScheduler, LCMScheduler, PNDMScheduler, UniPCMultistepScheduler)
from .modules import unwrapped

INDEX_NAME = "model_index.json"
SCHEDULERS = {cls.__name__: cls for cls in (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler,
                                             EulerAncestralDiscreteScheduler, EulerDiscreteScheduler, LCMScheduler,
                                             PNDMScheduler, UniPCMultistepScheduler)}
# The libraries a model_index.json entry may name: ours (as save_pipeline writes) and diffusers'/transformers'.
LIBRARIES = ("diffusion", "diffusers", "transformers")
# Part name -> the class names a folder may give it (ours and diffusers') -> the class that loads it.
COMPONENTS: dict[str, dict[str, Any]] = {
    "unet": {"UNet2D": UNet2D, "UNet2DModel": UNet2D},
    "vae": {"AutoencoderKL": AutoencoderKL},
    "scheduler": SCHEDULERS,
}


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


def read_index(folder: str | os.PathLike, components: dict[str, dict[str, Any]] = COMPONENTS,
               unloaded: Iterable[str] = ()) -> dict[str, Any]:
    """The folder's ``model_index.json``, validated by ``check_index``; a clear error when it
    is missing, malformed, or names a part this code cannot load or a folder outside ``folder``."""
    path = os.path.join(os.fspath(folder), INDEX_NAME)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"from_pretrained: {os.fspath(folder)!r} is not a pipeline folder "
                                f"(no {INDEX_NAME})")
    index = read_json(inside(folder, INDEX_NAME, "from_pretrained"), "from_pretrained")
    if not isinstance(index, dict):
        raise ValueError(f"from_pretrained: {path!r} must hold a JSON object")
    check_index(index, folder, components, unloaded)
    return index


def check_index(index: dict[str, Any], folder: str | os.PathLike,
                components: dict[str, dict[str, Any]] = COMPONENTS, unloaded: Iterable[str] = ()) -> None:
    """Raise ValueError naming the first entry of ``index`` that is not a loadable part.

    A part is an entry that ``COMPONENTS`` knows or whose value is a list: it must be
    ``[library, ClassName]`` (``[null, null]`` for an absent part) with a library of
    ``LIBRARIES``, a class ``components`` lists for it (any identifier for parts this code
    does not load), and a folder of that name inside ``folder``.  Other entries (``_class_name``,
    ``null_class_label``...) are the pipeline's options; parts named in ``unloaded`` (a
    safety checker, say) are left alone.
    """
    path = os.path.join(os.fspath(folder), INDEX_NAME)
    for key, value in index.items():
        if key.startswith("_") or key in unloaded or value == [None, None] \
                or (key not in components and not isinstance(value, list)):
            continue
        where = f"from_pretrained: {path!r} entry {key!r}"
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
            raise ValueError(f"{where} must be [library, ClassName] (two strings), got {value!r}")
        library, name = value
        if library not in LIBRARIES:
            raise ValueError(f"{where} names library {library!r}; expected one of {list(LIBRARIES)}")
        known = components.get(key)
        if (known is not None and name not in known) or not name.isidentifier():
            expected = sorted(known) if known is not None else "a class name"
            raise ValueError(f"{where} names class {name!r}; expected {expected}")
        if not os.path.isdir(inside(folder, key, where)):
            raise ValueError(f"{where}: the folder {key!r} does not exist in {os.fspath(folder)!r}")


def component_class(index: dict[str, Any], key: str, default: str) -> Any:
    """The class a checked ``index`` names for part ``key`` (``default`` when it names none)."""
    entry = index.get(key)
    return COMPONENTS[key][entry[1] if isinstance(entry, list) and entry[1] is not None else default]


def load_parts(folder: str | os.PathLike, scheduler: Any = None, device: str | None = None
               ) -> dict[str, Any]:
    """The parts of the pipeline stored in ``folder``: unet, scheduler (the stored one unless
    one is given), vae (or None) and null_class_label.  Every part loads from a folder
    that resolves inside ``folder``."""
    folder = os.fspath(folder)
    index = read_index(folder)
    where = f"from_pretrained: {os.path.join(folder, INDEX_NAME)!r}"
    if scheduler is None:
        scheduler = component_class(index, "scheduler", "DDIMScheduler").from_pretrained(
            inside(folder, "scheduler", where))
    vae = None
    if isinstance(index.get("vae"), list) and index["vae"][0] is not None:
        vae = component_class(index, "vae", "AutoencoderKL").from_pretrained(inside(folder, "vae", where), device=device)
    unet = component_class(index, "unet", "UNet2D").from_pretrained(inside(folder, "unet", where), device=device)
    return {"unet": unet, "scheduler": scheduler, "vae": vae, "null_class_label": index.get("null_class_label")}
