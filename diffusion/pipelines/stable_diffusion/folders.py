"""Stable Diffusion folders, as diffusers saves them.

    folder/model_index.json     {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"], ...}
    folder/unet/ vae/ scheduler/
    folder/text_encoder/ tokenizer/               (SDXL: also text_encoder_2/ tokenizer_2/)

Parts this code does not run (``safety_checker``, ``feature_extractor``,
``image_encoder``) may be named in the index; they are not read.  A scheduler class the
folder names and this code lacks raises, naming it and the ones there are, unless the
caller passes ``scheduler=``: a scheduler object is used as it is; a scheduler class gets
the folder's scheduler config (with a warning that it stands in for the named class).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Sequence

from layers.files import inside
from tensorcore.atomic import write_atomic

from ...models import AutoencoderKL, CLIPTextModel, CLIPTextModelWithProjection, UNet2DConditionModel
from ...schedulers.base import SchedulerBase
from ...tokenizers import CLIPTokenizer
from ..modules import unwrapped
from ..pretrained import INDEX_NAME, SCHEDULERS, read_index

TEXT_ENCODERS = {"CLIPTextModel": CLIPTextModel, "CLIPTextModelWithProjection": CLIPTextModelWithProjection}
TOKENIZERS = {"CLIPTokenizer": CLIPTokenizer, "CLIPTokenizerFast": CLIPTokenizer}
SD_COMPONENTS: dict[str, dict[str, Any]] = {
    "unet": {"UNet2DConditionModel": UNet2DConditionModel},
    "vae": {"AutoencoderKL": AutoencoderKL},
    "text_encoder": TEXT_ENCODERS, "text_encoder_2": TEXT_ENCODERS,
    "tokenizer": TOKENIZERS, "tokenizer_2": TOKENIZERS,
    "scheduler": SCHEDULERS,
}
NOT_LOADED = ("safety_checker", "feature_extractor", "image_encoder")
# the library each part's class comes from, for a model_index.json diffusers reads
LIBRARY = {"unet": "diffusers", "vae": "diffusers", "scheduler": "diffusers", "text_encoder": "transformers",
           "text_encoder_2": "transformers", "tokenizer": "transformers", "tokenizer_2": "transformers"}


def load_components(folder: str | os.PathLike, owner: str, parts: Sequence[str], optional: Sequence[str] = (),
                    dtype: Any = None, device: str | None = None, variant: str | None = None,
                    scheduler: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the parts stored in ``folder`` by name, the index's pipeline options).

    ``parts`` must all be present; ``optional`` ones may be absent or ``[null, null]``
    (None then).  Every entry of the index is checked before any part is read."""
    folder = os.fspath(folder)
    components = dict(SD_COMPONENTS)
    if scheduler is not None:
        components.pop("scheduler")  # any class the folder names: the caller's scheduler stands in
    index = read_index(folder, components, NOT_LOADED)
    where = f"{owner}.from_pretrained: {os.path.join(folder, INDEX_NAME)!r}"
    missing = [p for p in parts if not _named(index, p)]
    if missing:
        raise ValueError(f"{where} has no {missing} (a {owner} needs {list(parts)})")
    loaded: dict[str, Any] = {}
    for part in list(parts) + list(optional):
        if not _named(index, part):
            loaded[part] = None
            continue
        path, name = inside(folder, part, where), index[part][1]
        if part == "scheduler":
            loaded[part] = _scheduler(path, name, scheduler, owner)
        elif part.startswith("tokenizer"):
            loaded[part] = SD_COMPONENTS[part][name].from_pretrained(path)
        else:
            loaded[part] = SD_COMPONENTS[part][name].from_pretrained(path, dtype=dtype, device=device, variant=variant)
    options = {k: v for k, v in index.items() if not k.startswith("_") and not isinstance(v, list)}
    return loaded, options


def _named(index: dict[str, Any], part: str) -> bool:
    entry = index.get(part)
    return isinstance(entry, list) and entry[0] is not None


def _scheduler(path: str, name: str, given: Any, owner: str) -> Any:
    """The folder's scheduler, or the caller's: an object as it is, a class from the folder's config."""
    if given is None:
        return SD_COMPONENTS["scheduler"][name].from_pretrained(path)
    if isinstance(given, type) and issubclass(given, SchedulerBase):
        if given.__name__ != name:
            warnings.warn(f"{owner}.from_pretrained: the folder's scheduler is {name}; its config is loaded into "
                          f"{given.__name__} as asked", UserWarning, stacklevel=4)
        return given.from_pretrained(path)
    if callable(getattr(given, "start", None)) and callable(getattr(given, "step_update", None)):
        return given
    raise TypeError(f"{owner}.from_pretrained: scheduler must be a scheduler object or class, "
                    f"got {type(given).__name__}")


def save_components(folder: str | os.PathLike, class_name: str, parts: dict[str, Any], options: dict[str, Any],
                    variant: str | None = None) -> None:
    """Write each part into its folder, then ``model_index.json`` last (a folder with an index
    is complete), naming diffusers' and transformers' classes so diffusers reads it too."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    index: dict[str, Any] = {"_class_name": class_name, "_diffusers_version": "0.42.1", **options}
    for part, component in parts.items():
        if component is None:
            index[part] = [None, None]
            continue
        module = unwrapped(component)
        path = os.path.join(folder, part)
        if part == "scheduler":
            module.save_config(path)
        elif part.startswith("tokenizer"):
            module.save_pretrained(path)
        else:
            module.save_pretrained(path, variant=variant)
        index[part] = [LIBRARY[part], type(module).__name__]
    write_atomic(os.path.join(folder, INDEX_NAME), (json.dumps(index, indent=2) + "\n").encode())
