"""Output folders and run options, checked before a command starts any work.

A ``train`` / ``train-vae`` folder holds one run.  Its command-line options are stored
in every checkpoint (``config["cli"]``), so ``--resume`` continues the run as it was
started: an option left out takes the run's value, not the command's default, and an
option given with another value is refused.  Only the options that change how the run
is executed (``--compile``) or how its final grid is sampled may differ.
"""

from __future__ import annotations

import argparse
import datetime
import os
from typing import Any, Iterable

from .args import UsageError

RUNS = "runs"
RUN_MARKERS = ("checkpoints", "metrics.csv")  # what the training loop writes first
NOT_RECORDED = frozenset({"command", "explicit", "out", "resume", "no_progress", "devices", "backend"})
MAY_CHANGE = frozenset({"compile", "sample_steps", "sampler", "guidance_scale", "eta", "per_class", "digits"})


def planned_out(requested: str | None, command: str) -> str:
    """``requested``, or a fresh ``runs/<command>-<timestamp>`` path (nothing is created)."""
    if requested is not None:
        return requested
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = base = os.path.join(RUNS, f"{command}-{stamp}")
    suffix = 2
    while os.path.lexists(path):
        path, suffix = f"{base}-{suffix}", suffix + 1
    return path


def check_outputs(out: str, files: Iterable[str] = (), folders: Iterable[str] = ()) -> None:
    """Refuse an ``--out`` that is not (and cannot become) a folder, or that holds one of the
    command's ``files`` as something other than a file or one of its ``folders`` as a non-folder."""
    existing = os.path.abspath(out)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == os.path.abspath(out) else f"lies under the file {existing!r}"
        raise UsageError(f"--out {out!r} {where}, not a folder")
    for names, is_kind, kind in ((files, os.path.isfile, "a file"), (folders, os.path.isdir, "a folder")):
        for name in names:
            path = os.path.join(out, name)
            if os.path.lexists(path) and not is_kind(path):
                raise UsageError(f"--out {out!r}: {path!r} exists and is not {kind}; move it or pick another folder")


def run_folder(resume: str) -> str:
    """The run folder a ``--resume`` path (a run folder, its checkpoints/ or a checkpoint) belongs to."""
    folder = resume if os.path.isdir(resume) else os.path.dirname(os.path.abspath(resume))
    return os.path.dirname(os.path.abspath(folder)) if os.path.basename(os.path.normpath(folder)) == "checkpoints" \
        else folder


def check_not_another_run(out: str, resume: str | None) -> None:
    """Refuse to write a run into a folder that holds a different run."""
    found = [name for name in RUN_MARKERS if os.path.lexists(os.path.join(out, name))]
    if not found:
        return
    if resume is not None and os.path.realpath(run_folder(resume)) == os.path.realpath(out):
        return
    raise UsageError(f"--out {out!r} holds another run ({', '.join(found)}): continue it with --resume {out} "
                     f"or pick another folder")


def recorded_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options that define the run, as JSON data for its checkpoints."""
    return {k: _json(v) for k, v in vars(args).items() if k not in NOT_RECORDED}


def restore_options(args: argparse.Namespace, recorded: dict[str, Any] | None, resume: str) -> None:
    """Give ``args`` the resumed run's options; refuse options given explicitly with other values."""
    if not isinstance(recorded, dict):
        raise UsageError(f"--resume {resume!r}: the checkpoint records no command-line options (it was not "
                         f"written by this command); continue it from Python instead")
    conflicts = []
    for key, value in recorded.items():
        if key not in vars(args):
            continue
        given = _json(getattr(args, key))
        if key in args.explicit and given != value:
            if key not in MAY_CHANGE:
                conflicts.append(f"{_flag(key)} {_shown(value)} (given: {_shown(given)})")
            continue
        setattr(args, key, tuple(value) if isinstance(value, list) else value)
    if conflicts:
        raise UsageError(f"--resume {resume!r}: the run was started with {'; '.join(conflicts)}; "
                         f"leave these options out or repeat the run's values")


def _json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)
