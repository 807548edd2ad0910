"""Swapping schedulers through ``from_config``, as a diffusers pipeline does, against diffusers.

Every pair of the eight schedulers, each built from the other's config (as given, and
with every key explicit, as a saved ``scheduler_config.json`` edited by hand has them;
pairs with the four later schedulers take each config in one of the two forms, in turn):
the same configs are accepted and refused, and an accepted one gives the same config
fields and the same timesteps.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import numpy as np
import pytest

import diffusion

diffusers = pytest.importorskip("diffusers")

# diffusers 0.42 hands torch tensors to np.array(..., copy=False): NumPy 2 warns about it
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

FIRST = ("DDPMScheduler", "DDIMScheduler", "DPMSolverMultistepScheduler", "EulerDiscreteScheduler")
NAMES = FIRST + ("PNDMScheduler", "EulerAncestralDiscreteScheduler", "UniPCMultistepScheduler", "LCMScheduler")
CONFIGS = (
    {},
    {"beta_schedule": "squaredcos_cap_v2", "prediction_type": "v_prediction", "clip_sample": False},
    {"variance_type": "fixed_small", "beta_schedule": "scaled_linear", "steps_offset": 1},
    {"variance_type": "fixed_large", "timestep_spacing": "trailing"},
    {"variance_type": None},
    {"variance_type": "learned_range", "timestep_spacing": "leading"},
    {"use_karras_sigmas": True, "timestep_spacing": "leading"},
    {"beta_schedule": "sigmoid"},
)


def _source_config(module: Any, name: str, config: dict[str, Any], explicit: bool) -> dict[str, Any] | None:
    """``name``'s config built from the keys of ``config`` it has (None where diffusers refuses it)."""
    cls = getattr(module, name)
    keys = getattr(diffusers, name)().config
    try:
        scheduler = cls(**{k: v for k, v in config.items() if k in keys})
    except (ValueError, NotImplementedError):
        return None
    result = dict(scheduler.config)
    return {k: v for k, v in result.items() if not k.startswith("_")} if explicit else result


def _build(module: Any, name: str, config: dict[str, Any]) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # keys of the sibling schedulers are dropped quietly
            return getattr(module, name).from_config(config)
    except (ValueError, NotImplementedError):
        return None


@pytest.mark.parametrize("source,target", list(itertools.product(NAMES, NAMES)))
def test_from_config_swaps_as_diffusers(source, target):
    if source in FIRST and target in FIRST:
        cases = list(itertools.product(CONFIGS, (False, True)))
    else:  # each config once, as given and explicit in turn, to keep the 64 pairs quick
        cases = [(config, bool(i % 2)) for i, config in enumerate(CONFIGS)]
    for config, explicit in cases:
        theirs_config = _source_config(diffusers, source, config, explicit)
        if theirs_config is None:
            assert _source_config(diffusion, source, config, explicit) is None, (source, config)
            continue
        ours = _build(diffusion, target, _source_config(diffusion, source, config, explicit))
        theirs = _build(diffusers, target, theirs_config)
        case = (source, target, config, explicit)
        assert (ours is None) == (theirs is None), case
        if ours is None:
            continue
        shared = [k for k in ours.config if not k.startswith("_") and k in theirs.config]
        assert shared, case
        for key in shared:
            expected = theirs.config[key]
            assert ours.config[key] == (pytest.approx(expected) if isinstance(expected, float) else expected), \
                (case, key)
        ours.set_timesteps(10)
        theirs.set_timesteps(10)
        np.testing.assert_allclose(ours.timesteps.numpy(), theirs.timesteps.numpy(), rtol=1e-5, err_msg=str(case))


def test_saved_ddpm_config_loads_as_dpm_solver(tmp_path):
    """The README's DDPM scheduler, saved (every key written) and loaded as DPM-Solver."""
    diffusion.DDPMScheduler(clip_sample=True).save_config(tmp_path)
    ours = diffusion.DPMSolverMultistepScheduler.from_pretrained(tmp_path)
    theirs = diffusers.DPMSolverMultistepScheduler.from_pretrained(tmp_path)
    assert ours.config["variance_type"] == theirs.config["variance_type"] == "fixed_small"
