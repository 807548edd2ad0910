"""Weights of a model folder: found, opened and checked against the model before any data is read.

Only safetensors files are read, one ``diffusion_pytorch_model.safetensors`` or the shards
its ``.index.json`` names; every file must resolve to a regular file inside the folder.
Headers are read first and compared with the model's parameters (names, shapes, float
dtypes for float parameters), so a wrong or hostile file fails naming the key before a
single tensor is read.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

import numpy as np

from layers.files import inside, open_regular, read_json
from layers.serialization import FLOAT_TAGS, TensorEntry, read_header, read_tensor
from tensorcore import dtypes

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX_NAME = WEIGHTS_NAME + ".index.json"

Found = dict[str, tuple[BinaryIO, str, TensorEntry]]  # tensor name -> (open file, its path, header entry)


def weight_files(folder: Path, weights_name: str = WEIGHTS_NAME, index_name: str | None = None,
                 owner: str = "from_pretrained") -> list[str]:
    """The resolved paths of the folder's safetensors weights: ``weights_name``, or the shards
    its index (``index_name``, default ``weights_name + ".index.json"``) names; an entry
    leading outside the folder raises ValueError naming it.  Pickle ``.bin`` weights are
    never read: a folder holding only those raises ValueError."""
    index_name = index_name or weights_name + ".index.json"
    single, index = folder / weights_name, folder / index_name
    if single.exists() or single.is_symlink():
        return [inside(folder, weights_name, owner)]
    if index.exists() or index.is_symlink():
        weight_map = read_json(inside(folder, index_name, owner), owner)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{owner}: {str(index)!r} is not a safetensors index (no weight_map object)")
        return sorted({inside(folder, shard, f"{owner}: {str(index)!r} weight_map[{key!r}]")
                       for key, shard in weight_map.items()})
    others = sorted(p.name for p in folder.glob("*.bin")) if folder.is_dir() else []
    if others:
        raise ValueError(f"{owner}: {str(folder)!r} holds pickle weights {others}, which are never loaded; "
                         f"convert them to safetensors ({weights_name})")
    raise FileNotFoundError(f"{owner}: no {weights_name} in {str(folder)!r}")


@contextlib.contextmanager
def open_weights(folder: Path, weights_name: str = WEIGHTS_NAME, index_name: str | None = None,
                 owner: str = "from_pretrained") -> Iterator[Found]:
    """The folder's weight files (as ``weight_files`` finds them), open for the duration, with
    the tensors their headers declare."""
    with contextlib.ExitStack() as stack:
        found: Found = {}
        for path in weight_files(folder, weights_name, index_name, owner):
            f = stack.enter_context(open_regular(path, owner))
            for name, entry in read_header(f, path).items():
                if name in found:
                    raise ValueError(f"{owner}: {name!r} is stored twice, in {found[name][1]!r} and {path!r}")
                found[name] = (f, path, entry)
        yield found


def check_weights(owner: str, folder: Path, targets: Mapping[str, Any], found: Mapping[str, tuple[Any, str, TensorEntry]]
                  ) -> None:
    """Raise ValueError naming every missing, unexpected, mis-shaped or non-float key when the
    headers ``found`` do not cover ``targets`` (the model's state dict) exactly."""
    entries = {name: entry for name, (_, _, entry) in found.items()}
    problems = []
    missing = [k for k in targets if k not in entries]
    unexpected = [k for k in entries if k not in targets]
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    wrong = [f"{k} (expected {tuple(t.shape)}, got {entries[k].shape})" for k, t in targets.items()
             if k in entries and tuple(t.shape) != entries[k].shape]
    if wrong:
        problems.append(f"wrong shapes: {', '.join(wrong)}")
    not_float = [f"{k} ({entries[k].dtype})" for k, t in targets.items()
                 if k in entries and dtypes.is_floating(t.dtype) and entries[k].dtype not in FLOAT_TAGS]
    if not_float:
        problems.append(f"not floating point: {', '.join(not_float)}")
    if problems:
        raise ValueError(f"{owner}: the weights in {str(folder)!r} do not fit the model: " + "; ".join(problems))


def read_found(found: Mapping[str, tuple[BinaryIO, str, TensorEntry]]) -> dict[str, np.ndarray]:
    """The arrays ``found`` describes, under the keys of ``found``."""
    return {key: read_tensor(f, entry, key, path) for key, (f, path, entry) in found.items()}
