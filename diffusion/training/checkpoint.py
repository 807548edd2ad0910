"""Training checkpoints: one safetensors file per save, written atomically.

A checkpoint holds everything a run needs to continue exactly where it stopped:

* arrays: ``model.<name>`` (the trained weights), ``ema.<i>`` (the averaged weights),
  ``optimizer.<param index>.<role>`` (e.g. AdamW's ``exp_avg``), ``rng.noise`` (the
  device generator's state) and ``data.order`` (the current epoch's sample order);
* the header's metadata, JSON strings: ``step``, ``seconds`` (training time so far), ``optimizer`` (param groups and
  per-parameter step counts), ``lr_scheduler``, ``ema`` (options and update count),
  ``data`` (position in the epoch and the host generator's state) and ``config``
  (what built the model, so a sampler can rebuild it from the file alone).

The write goes to a temporary file that is flushed, synced and renamed over the
target, so a process killed while writing leaves the previous checkpoints intact.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as encode

from layers.serialization import load_file
from tensorcore.atomic import remove_stale_temporaries, write_atomic

FORMAT = "tensorcore-training-checkpoint"
_NAME = re.compile(r"^step-(\d+)\.safetensors$")
_TEMPORARY = re.compile(r"^\.(step-\d+\.safetensors)\.\d+\.[0-9a-f]+\.tmp$")  # write_atomic's temporaries


@dataclass
class Checkpoint:
    """The contents of one checkpoint file, split back into its parts."""

    step: int
    model: dict[str, np.ndarray]
    ema: list[np.ndarray]
    ema_options: dict[str, Any]
    optimizer: dict[str, Any]
    lr_scheduler: dict[str, Any]
    rng_noise: np.ndarray
    data: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # training wall time up to this step, over all resumed parts


def checkpoint_path(directory: str | os.PathLike, step: int) -> str:
    """Where the checkpoint of ``step`` goes inside ``directory``."""
    return os.path.join(os.fspath(directory), f"step-{step:07d}.safetensors")


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, str]]:
    """(step, path) of the finished checkpoints in ``directory``, oldest first
    (temporary files of an interrupted write are not listed)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, name))
             for name in os.listdir(directory) if (m := _NAME.match(name))]
    return sorted(found)


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically."""
    arrays = {f"model.{name}": np.asarray(a) for name, a in checkpoint.model.items()}
    arrays.update({f"ema.{i}": np.asarray(a) for i, a in enumerate(checkpoint.ema)})
    groups, steps = checkpoint.optimizer["param_groups"], {}
    for index, entry in checkpoint.optimizer["state"].items():
        steps[str(index)] = entry["step"]
        arrays.update({f"optimizer.{index}.{role}": np.asarray(v) for role, v in entry.items() if role != "step"})
    arrays["rng.noise"] = np.asarray(checkpoint.rng_noise, np.uint8)
    arrays["data.order"] = np.asarray(checkpoint.data["order"], np.int64)
    data = {k: v for k, v in checkpoint.data.items() if k != "order"}
    metadata = {"format": FORMAT, "step": str(checkpoint.step), "seconds": repr(float(checkpoint.seconds)),
                "optimizer": json.dumps({"param_groups": groups, "steps": steps}),
                "lr_scheduler": json.dumps(checkpoint.lr_scheduler), "ema": json.dumps(checkpoint.ema_options),
                "data": json.dumps(data), "config": json.dumps(checkpoint.config)}
    write_atomic(path, encode({k: np.ascontiguousarray(a) for k, a in arrays.items()}, metadata=metadata))


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a file written by ``save_checkpoint``; anything else raises ``ValueError``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"load_checkpoint: {path!r} is not a file")
    try:
        with safe_open(path, framework="numpy") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"load_checkpoint: {path!r} is not a safetensors file ({exc})") from exc
    if metadata.get("format") != FORMAT:
        raise ValueError(f"load_checkpoint: {path!r} is not a training checkpoint (no {FORMAT!r} header)")
    arrays = load_file(path)
    optimizer = json.loads(metadata["optimizer"])
    state: dict[int, dict[str, Any]] = {int(i): {"step": s} for i, s in optimizer["steps"].items()}
    for name, array in arrays.items():
        if name.startswith("optimizer."):
            _, index, role = name.split(".", 2)
            state[int(index)][role] = array
    count = sum(n.startswith("ema.") for n in arrays)
    missing = [f"ema.{i}" for i in range(count) if f"ema.{i}" not in arrays]
    if missing:
        raise ValueError(f"load_checkpoint: {path!r} lacks {len(missing)} of its averaged weights "
                         f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    ema = [arrays[f"ema.{i}"] for i in range(count)]
    data = json.loads(metadata["data"])
    data["order"] = arrays["data.order"]
    return Checkpoint(step=int(metadata["step"]),
                      model={n[len("model."):]: a for n, a in arrays.items() if n.startswith("model.")},
                      ema=ema, ema_options=json.loads(metadata["ema"]),
                      optimizer={"state": state, "param_groups": optimizer["param_groups"]},
                      lr_scheduler=json.loads(metadata["lr_scheduler"]), rng_noise=arrays["rng.noise"],
                      data=data, config=json.loads(metadata["config"]), seconds=float(metadata.get("seconds", 0)))


def latest_checkpoint(directory: str | os.PathLike) -> str | None:
    """The newest finished checkpoint in ``directory``, or None."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def remove_unfinished(directory: str | os.PathLike) -> None:
    """Delete the temporary files that processes killed while writing a checkpoint left behind."""
    directory = os.fspath(directory)
    if os.path.isdir(directory):
        targets = {m.group(1) for name in os.listdir(directory) if (m := _TEMPORARY.match(name))}
        for target in targets:
            remove_stale_temporaries(os.path.join(directory, target))


def prune_checkpoints(directory: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints of ``directory``."""
    for _, path in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        os.unlink(path)
