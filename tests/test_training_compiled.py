"""Training with a compiled step (``compile=True``) equals training eagerly.

The whole step -- zero_grad, loss with its random draws, backward, clipping, AdamW and
the EMA update -- replays as one plan while the warmup + cosine LR schedule steps on
the host between calls: parameters, optimizer state, EMA, losses and the logged
learning rates must come out as the eager run's (bit for bit on the NumPy backend,
within float32 bounds on the others), a compiled run resumed from its checkpoint must
continue as the uninterrupted eager run, and a loss the tracer cannot follow must still
train (eagerly, with one warning).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import layers
import tensorcore as tc
import tensorcore.functional as F
from diffusion import DDPMScheduler
from diffusion.training import Trainer, TrainOptions, load_checkpoint, train_ddpm, train_vae
from diffusion.training.loop import compile_enabled
from diffusion.training.metrics import read_metrics_rows
from pipeline_helpers import same, tiny_unet, tiny_vae
from test_training import digits_subset

QUICK = dict(batch_size=16, lr=3e-3, warmup_steps=3, progress=False, log_every=1)


def _scheduler() -> DDPMScheduler:
    return DDPMScheduler(beta_schedule="squaredcos_cap_v2")


def _ddpm(mode: bool | str, out_dir, steps: int = 8, unet_seed: int = 0, **options):
    unet = tiny_unet(seed=unet_seed).train()
    result = train_ddpm(unet, _scheduler(), digits_subset(), steps=steps, label_dropout=0.2, out_dir=str(out_dir),
                        checkpoint_every=4, compile=mode, **{**QUICK, **options})
    return unet, result


def _equal(backend: str):
    """Bit for bit on NumPy; float32 bounds where kernels may round differently."""
    if backend == "numpy":
        return lambda a, b: same(a, b)
    return lambda a, b: np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def _state(unet, result) -> dict[str, np.ndarray]:
    """Parameters, EMA weights and optimizer state of a finished run, by name."""
    arrays = {f"param{i}": p.numpy() for i, p in enumerate(unet.parameters())}
    arrays.update({f"ema{i}": s.numpy() for i, s in enumerate(result.ema.shadow_params)})
    final = load_checkpoint(result.checkpoint)
    for key, entry in final.optimizer["state"].items():
        arrays.update({f"opt{key}.{role}": np.asarray(value) for role, value in entry.items()})
    arrays["rng"] = np.asarray(final.rng_noise)
    return arrays


def _logged(out_dir) -> list[dict[str, float]]:
    rows = read_metrics_rows(out_dir / "metrics.csv")
    return [{c: float(r[c]) for c in ("step", "loss", "lr", "grad_norm")} for r in rows]


def _noise_driven(unet, backend: str) -> set[str]:
    """State keys of the attention key biases, compared only on NumPy.  Softmax over the
    keys is invariant to a per-query constant, so a key bias's exact gradient is zero:
    its computed gradient is rounding noise, and AdamW (which divides by the gradient's
    own scale) steps it by about lr in the noise's direction.  Kernels that round
    differently (fused against unfused) then move it differently, however exact they are."""
    if backend == "numpy":
        return set()
    indices = [i for i, (name, _) in enumerate(unet.named_parameters()) if name.endswith("to_k.bias")]
    return {f"{kind}{i}" for i in indices for kind in ("param", "ema")}


def test_a_compiled_run_equals_the_eager_run_under_warmup_and_cosine(backend, tmp_path) -> None:
    eager_unet, eager = _ddpm(False, tmp_path / "eager")
    compiled_unet, compiled = _ddpm(True, tmp_path / "compiled")
    equal = _equal(backend)
    expected, actual = _state(eager_unet, eager), _state(compiled_unet, compiled)
    assert expected.keys() == actual.keys()
    skipped = _noise_driven(eager_unet, backend)
    assert [k for k in expected if k not in skipped and not equal(expected[k], actual[k])] == []
    assert equal(eager.losses, compiled.losses)
    rows_eager, rows_compiled = _logged(tmp_path / "eager"), _logged(tmp_path / "compiled")
    assert [r["lr"] for r in rows_eager] == [r["lr"] for r in rows_compiled]
    assert len({r["lr"] for r in rows_compiled}) == 8  # warmup up, cosine down: a new lr every step
    assert equal([r["grad_norm"] for r in rows_eager], [r["grad_norm"] for r in rows_compiled])
    assert eager.compile_info is None
    info = compiled.compile_info
    assert info.hits >= 6 and info.plans == 1 and info.fallbacks == 0 and info.eager_only == 0, info
    assert load_checkpoint(compiled.checkpoint).ema_options["optimization_step"] == 8


def test_resuming_a_compiled_run_continues_as_the_eager_run(tmp_path) -> None:
    with tc.use_backend("numpy"):
        whole_unet, whole = _ddpm(False, tmp_path / "whole")
        _, first = _ddpm(True, tmp_path / "part", callback=lambda step: step < 5)
        assert first.step == 5 and first.compile_info.hits >= 3
        resumed_unet, rest = _ddpm(True, tmp_path / "part", unet_seed=7, resume=True)
    assert rest.step == 8 and rest.compile_info.hits >= 1
    expected, actual = _state(whole_unet, whole), _state(resumed_unet, rest)
    assert [k for k in expected if not same(expected[k], actual[k])] == []
    assert whole.losses[5:] == rest.losses
    assert _logged(tmp_path / "whole") == _logged(tmp_path / "part")


def test_a_compiled_vae_run_without_clipping_equals_the_eager_run(tmp_path) -> None:
    images, _ = digits_subset(size=16, count=64)
    runs = []
    with tc.use_backend("numpy"):
        for mode in (False, True):
            vae = tiny_vae().train()
            result = train_vae(vae, images, steps=5, grad_clip=None, compile=mode, **QUICK)
            runs.append(([p.numpy() for p in vae.parameters()] + [s.numpy() for s in result.ema.shadow_params],
                         result))
    (eager, eager_result), (compiled, compiled_result) = runs
    assert all(same(a, b) for a, b in zip(eager, compiled))
    assert eager_result.losses == compiled_result.losses
    assert compiled_result.compile_info.hits >= 3


def _mlp_trainer(mode: bool, loss_reads_a_value: bool) -> tuple[Trainer, layers.Module]:
    tc.manual_seed(0)
    model = layers.Sequential(layers.Linear(4, 8), layers.SiLU(), layers.Linear(8, 1))
    x = tc.randn(32, 4)
    y = (x * x).sum(dim=1, keepdim=True)

    def loss_fn(batch: tuple[tc.Tensor, ...], generator: tc.Generator) -> tc.Tensor:
        inputs, targets = batch
        noisy = inputs + 0.1 * tc.randn(*inputs.shape, generator=generator)
        loss = F.mse_loss(model(noisy), targets)
        if loss_reads_a_value and float(loss.item()) > 1e6:  # a host read: not traceable
            raise FloatingPointError("diverged")
        return loss

    options = TrainOptions(steps=6, batch_size=8, warmup_steps=2, progress=False, log_every=1, compile=mode)
    return Trainer(model, loss_fn, (x, y), options, {"kind": "mlp"}), model


def test_a_loss_the_tracer_cannot_follow_trains_eagerly_with_one_warning() -> None:
    with tc.use_backend("numpy"):
        eager_trainer, eager_model = _mlp_trainer(False, loss_reads_a_value=True)
        eager = eager_trainer.run()
        trainer, model = _mlp_trainer(True, loss_reads_a_value=True)
        with pytest.warns(tc.compile.CompileWarning) as caught:
            result = trainer.run()
    assert len([w for w in caught if issubclass(w.category, tc.compile.CompileWarning)]) == 1
    assert result.compile_info.eager_only == 1 and result.compile_info.hits == 0
    assert result.losses == eager.losses
    assert all(same(a, b) for a, b in zip(eager_model.parameters(), model.parameters()))


def test_a_traceable_loss_replays_without_warnings() -> None:
    with tc.use_backend("numpy"), warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer, _ = _mlp_trainer(True, loss_reads_a_value=False)
        result = trainer.run()
    assert result.compile_info.hits >= 4 and result.compile_info.eager_only == 0


@pytest.mark.parametrize("bad", ["yes", "on", 1, None, 0.0])
def test_the_compile_option_is_checked_before_training(bad) -> None:
    unet = tiny_unet().train()
    before = [p.numpy().copy() for p in unet.parameters()]
    with pytest.raises(ValueError, match="compile must be True, False or 'auto'"):
        train_ddpm(unet, _scheduler(), digits_subset(), steps=2, progress=False, compile=bad)
    assert all(same(a, p) for a, p in zip(before, unet.parameters()))


def test_auto_compiles_except_on_the_numpy_reference_backend() -> None:
    assert compile_enabled("auto", "cuda") and compile_enabled("auto", "cuda:1")
    assert compile_enabled(True, "cpu") and not compile_enabled(False, "cuda")
    with tc.use_backend("numba"):
        assert compile_enabled("auto", "cpu")
    with tc.use_backend("numpy"):
        assert not compile_enabled("auto", "cpu")
        result = train_ddpm(tiny_unet().train(), _scheduler(), digits_subset(), steps=2, **QUICK)
    assert result.compile_info is None  # the default, "auto", keeps a NumPy run eager


@pytest.mark.gpu
def test_the_default_compiles_a_gpu_run(tmp_path) -> None:
    with tc.use_backend("cupy"):
        unet, result = _ddpm("auto", tmp_path, steps=6)
    assert next(iter(unet.parameters())).device.startswith("cuda")
    assert result.compile_info is not None and result.compile_info.hits >= 4


# ----- the command line ------------------------------------------------------------------------
def test_the_cli_trains_with_a_compiled_step_and_resumes_eagerly(tmp_path, monkeypatch, capsys) -> None:
    from diffusion.cli import build_parser, main
    from test_cli import TINY_TRAIN

    assert build_parser().parse_args(["train"]).compile == "auto"
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY_TRAIN, "--compile", "on", "--out", "run"]) == 0
    assert "compiled train step" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "step-0000004.safetensors").config["options"][
        "compile"] is True
    resume_from = str(tmp_path / "run" / "checkpoints" / "step-0000002.safetensors")
    assert main(["train", *TINY_TRAIN, "--resume", resume_from, "--compile", "off"]) == 0
    assert "eager train step" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "step-0000004.safetensors").step == 4


def test_a_trainer_stepped_by_hand_trains_as_train_ddpm_runs() -> None:
    """``ddpm_trainer`` is the Trainer ``train_ddpm`` runs: stepping it by hand leaves the
    parameters a compiled run of as many steps leaves (an eager one within float32
    bounds); ``compile_info`` is None while eager and
    before the first step, and counts what the run's own counters count once compiled."""
    from diffusion.training import ddpm_trainer

    options = dict(steps=5, label_dropout=0.2, checkpoint_every=None, compile=True, **QUICK)
    ran = tiny_unet(seed=0).train()
    result = train_ddpm(ran, _scheduler(), digits_subset(), **options)
    for mode in (False, True):
        unet = tiny_unet(seed=0).train()
        trainer = ddpm_trainer(unet, _scheduler(), digits_subset(), **{**options, "compile": mode})
        assert trainer.compile_info is None
        for _ in range(5):
            trainer.train_step()
        assert (trainer.compile_info is None) == (not mode)
        for got, want in zip(unet.parameters(), ran.parameters()):  # eager: as the module doc says
            assert same(got, want) if mode else np.allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    assert trainer.compile_info == result.compile_info and result.compile_info.hits >= 3
