"""The schedulers' config surface: keys and defaults, from_config, scheduler_config.json, bad values."""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import diffusion
from diffusion import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler

ALL = [DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler]
NAMES = [cls.__name__ for cls in ALL]
OUR_EXTRA_KEYS = {"DDIMScheduler": {"prev_timestep_from_schedule"}}


def oracle():
    """diffusers (its schedulers need torch), or skip."""
    pytest.importorskip("torch")
    return pytest.importorskip("diffusers")


def public(config: dict) -> dict:
    """The config's keys that diffusers also has (no private keys, none of our additions)."""
    extra = set().union(*OUR_EXTRA_KEYS.values())
    return {k: v for k, v in config.items() if not k.startswith("_") and k not in extra}


@pytest.mark.parametrize("name", NAMES)
def test_keys_and_defaults_are_diffusers(name):
    diffusers = oracle()
    theirs = {k: p.default for k, p in inspect.signature(getattr(diffusers, name).__init__).parameters.items()
              if k != "self"}
    ours = getattr(diffusion, name).config_defaults()
    assert set(ours) - set(theirs) == OUR_EXTRA_KEYS.get(name, set())
    assert set(theirs) <= set(ours)
    for key, default in theirs.items():
        assert ours[key] == default or (math.isnan(default) if isinstance(default, float) else False), key


@pytest.mark.parametrize("name", NAMES)
def test_config_matches_diffusers_config(name):
    diffusers = oracle()
    kwargs = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012, "steps_offset": 1}
    ours, theirs = getattr(diffusion, name)(**kwargs).config, dict(getattr(diffusers, name)(**kwargs).config)
    assert isinstance(ours, dict)
    extra = OUR_EXTRA_KEYS.get(name, set())
    assert set(ours.pop("_use_default_values")) - extra == set(theirs.pop("_use_default_values"))
    assert public(ours) == theirs
    json.dumps(ours)  # plain JSON-able values


def test_config_reads_as_attributes_and_is_a_copy():
    scheduler = DDIMScheduler(beta_end=0.012)
    config = scheduler.config
    assert config.beta_end == 0.012 and config["beta_end"] == 0.012
    config["beta_end"] = 0.5
    assert scheduler.config.beta_end == 0.012
    with pytest.raises(AttributeError, match="no key 'nope'"):
        config.nope


@pytest.mark.parametrize("cls", ALL)
def test_from_config_round_trip(cls):
    scheduler = cls(beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction", steps_offset=1)
    again = cls.from_config(scheduler.config)
    assert again.config == scheduler.config
    assert cls.from_config(scheduler.config, steps_offset=0).config.steps_offset == 0


@pytest.mark.parametrize("source,target", [(DDPMScheduler, DPMSolverMultistepScheduler),
                                           (DDIMScheduler, EulerDiscreteScheduler),
                                           (DPMSolverMultistepScheduler, DDIMScheduler)])
def test_switching_scheduler_class_like_diffusers(source, target):
    diffusers = oracle()
    for kwargs in ({}, {"timestep_spacing": "leading", "beta_schedule": "scaled_linear"}):
        ours = target.from_config(source(**kwargs).config)
        theirs = getattr(diffusers, target.__name__).from_config(getattr(diffusers, source.__name__)(**kwargs).config)
        expected = {k: v for k, v in public(theirs.config).items()}
        assert {k: v for k, v in public(ours.config).items() if k in expected} == expected


def test_unknown_keys_warn_and_sibling_keys_load_quietly():
    with pytest.warns(UserWarning, match=r"\['frobnicate'\]"):
        scheduler = DDIMScheduler.from_config({"beta_end": 0.012, "frobnicate": 3})
    assert scheduler.config.beta_end == 0.012
    # Stable Diffusion 1.x ships a PNDMScheduler config; DDIM reads it without complaint
    pndm = {"_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0", "beta_end": 0.012,
            "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
            "num_train_timesteps": 1000, "set_alpha_to_one": False, "skip_prk_steps": True,
            "steps_offset": 1, "trained_betas": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler = DDIMScheduler.from_config(pndm)
        DPMSolverMultistepScheduler.from_config(scheduler.config)  # its keys are DDIM's: also quiet
    assert scheduler.config.steps_offset == 1 and scheduler.config.set_alpha_to_one is False
    with pytest.raises(TypeError):
        DDIMScheduler(frobnicate=3)


@pytest.mark.parametrize("cls", ALL)
def test_save_and_load_scheduler_config_json(cls, tmp_path):
    scheduler = cls(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
    scheduler.save_config(tmp_path / "scheduler")
    assert os.listdir(tmp_path / "scheduler") == ["scheduler_config.json"]  # no temp file left behind
    data = json.loads((tmp_path / "scheduler" / "scheduler_config.json").read_text())
    assert data["_class_name"] == cls.__name__ and data["steps_offset"] == 1
    loaded = cls.from_pretrained(tmp_path / "scheduler")
    assert public(loaded.config) == public(scheduler.config)
    assert public(cls.from_pretrained(tmp_path, subfolder="scheduler").config) == public(scheduler.config)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_scheduler_config_json_gets_the_mode_of_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        DDIMScheduler().save_config(tmp_path)
    finally:
        os.umask(previous)
    assert (tmp_path / "scheduler_config.json").stat().st_mode & 0o777 == mode


def test_a_failed_scheduler_config_save_leaves_no_temporary(tmp_path, monkeypatch):
    DDIMScheduler().save_config(tmp_path)

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr("tensorcore.atomic.os.fsync", fail)  # mid-write: the bytes are in the temporary
    with pytest.raises(OSError, match="disk full"):
        DDIMScheduler(steps_offset=1).save_config(tmp_path)
    assert os.listdir(tmp_path) == ["scheduler_config.json"]
    assert json.loads((tmp_path / "scheduler_config.json").read_text())["steps_offset"] == 0


def test_a_scheduler_config_save_removes_a_killed_save_s_temporary(tmp_path):
    dead = _finished_pid()
    (tmp_path / f".scheduler_config.json.{dead}.0a1b2c3d.tmp").write_text("{")
    DDIMScheduler().save_config(tmp_path)
    assert os.listdir(tmp_path) == ["scheduler_config.json"]


def _finished_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("name", NAMES)
def test_diffusers_reads_our_json_and_we_read_theirs(name, tmp_path):
    diffusers = oracle()
    kwargs = {"beta_schedule": "squaredcos_cap_v2", "prediction_type": "v_prediction", "timestep_spacing": "trailing"}
    getattr(diffusion, name)(**kwargs).save_config(tmp_path / "ours")
    getattr(diffusers, name)(**kwargs).save_config(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # diffusers notes keys it does not know (our additions)
        theirs_from_ours = getattr(diffusers, name).from_pretrained(tmp_path / "ours")
    ours_from_theirs = getattr(diffusion, name).from_pretrained(tmp_path / "theirs")
    expected = public(getattr(diffusers, name)(**kwargs).config)
    assert public(theirs_from_ours.config) == expected
    assert {k: v for k, v in public(ours_from_theirs.config).items() if k in expected} == expected


def test_bad_files_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="no scheduler_config.json"):
        DDIMScheduler.from_pretrained(tmp_path)
    (tmp_path / "scheduler_config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DDIMScheduler.from_pretrained(tmp_path)
    (tmp_path / "scheduler_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        DDIMScheduler.from_pretrained(tmp_path)
    (tmp_path / "scheduler_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nests deeper"):
        DDIMScheduler.from_pretrained(tmp_path)
    (tmp_path / "scheduler_config.json").write_text('{"beta_schedule": "cosine"}')
    with pytest.raises(ValueError, match="beta_schedule.*'cosine'"):
        DDIMScheduler.from_pretrained(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        DDIMScheduler().save_config(tmp_path / "file")


@pytest.mark.parametrize("cls,key,value", [
    (DDIMScheduler, "beta_schedule", "cosine"),
    (DPMSolverMultistepScheduler, "beta_schedule", "sigmoid"),
    (DDPMScheduler, "prediction_type", "x0"),
    (EulerDiscreteScheduler, "timestep_spacing", "even"),
    (DDIMScheduler, "num_train_timesteps", 0),
    (DDPMScheduler, "num_train_timesteps", 10.5),
    (DDIMScheduler, "beta_start", -0.1),
    (DDIMScheduler, "beta_end", 1.5),
    (DDIMScheduler, "steps_offset", -1),
    (DDIMScheduler, "clip_sample", "yes"),
    (DDIMScheduler, "clip_sample_range", 0.0),
    (DDPMScheduler, "dynamic_thresholding_ratio", 0.0),
    (DDPMScheduler, "variance_type", "tiny"),
    (DDIMScheduler, "trained_betas", [0.1, 1.5]),
    (DPMSolverMultistepScheduler, "solver_order", 4),
    (DPMSolverMultistepScheduler, "algorithm_type", "dpmsolver"),
    (DPMSolverMultistepScheduler, "use_beta_sigmas", True),
    (DPMSolverMultistepScheduler, "final_sigmas_type", "one"),
    (DPMSolverMultistepScheduler, "lambda_min_clipped", float("nan")),
    (EulerDiscreteScheduler, "interpolation_type", "cubic"),
    (EulerDiscreteScheduler, "sigma_min", -1.0),
])
def test_bad_values_raise_naming_the_key(cls, key, value):
    with pytest.raises(ValueError, match=f"{key} must be .*{value!r}".replace("[", r"\[").replace("(", r"\(")):
        cls(**{key: value})


def test_bad_combinations_raise():
    with pytest.raises(ValueError, match="trained_betas has 3 values but num_train_timesteps is 1000"):
        DDIMScheduler(trained_betas=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="use_karras_sigmas.*use_exponential_sigmas"):
        EulerDiscreteScheduler(use_karras_sigmas=True, use_exponential_sigmas=True)
    with pytest.raises(ValueError, match="only one of"):
        DPMSolverMultistepScheduler(use_karras_sigmas=True, use_lu_lambdas=True)


def test_aliases_of_other_solvers_map_as_in_diffusers():
    scheduler = DPMSolverMultistepScheduler(algorithm_type="deis", solver_type="bh2")
    assert scheduler.config.algorithm_type == "dpmsolver++" and scheduler.config.solver_type == "midpoint"


def test_repr_and_len():
    assert repr(DDIMScheduler(beta_end=0.012)).startswith("DDIMScheduler(num_train_timesteps=1000, ")
    assert len(DDPMScheduler(num_train_timesteps=50)) == 50
    assert np.asarray(DDIMScheduler().final_alpha_cumprod) == 1.0
