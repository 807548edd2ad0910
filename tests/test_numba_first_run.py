"""A first run on a cold Numba kernel cache: one training step of a tiny model in a fresh
process compiles its kernels, saying so once on stderr; a second process on the same
cache loads them and prints nothing (``backends/numba/kernel_cache.announce_compiles``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorcore.backends.numba.kernel_cache import COMPILE_NOTICE

REPO = Path(__file__).resolve().parents[1]

# A Linear + GroupNorm + SiLU + Linear model, an MSE loss, AdamW: a handful of kernels
# (bias + activation, group norm, the activation gradient, the Adam update), so a cold
# cache compiles in seconds.
STEP = textwrap.dedent("""
    import numpy as np
    import tensorcore as tc
    import tensorcore.functional as F
    from layers import GroupNorm, Linear, Module
    from optim import AdamW

    class Tiny(Module):
        def __init__(self):
            super().__init__()
            self.inp, self.norm, self.out = Linear(8, 16), GroupNorm(4, 16), Linear(16, 1)

        def forward(self, x):
            return self.out(F.silu(self.norm(self.inp(x))))

    tc.manual_seed(0)
    model = Tiny()
    optimizer = AdamW(model.parameters(), lr=1e-3)
    x = tc.tensor(np.random.default_rng(0).standard_normal((32, 8), dtype=np.float32))
    loss = F.mse_loss(model(x), tc.zeros(32, 1))
    loss.backward()
    optimizer.step()
    print(f"backend {tc.get_backend().name}, loss {loss.item():.4f}")
""")


def run_step(cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUMBA_CACHE_DIR": str(cache / "numba"),
           "TENSORCORE_CACHE_DIR": str(cache / "tensorcore")}
    env.pop("TENSORCORE_BACKEND", None)  # the default: numba
    return subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_cold_cache_is_announced_once_and_a_warm_one_not_at_all(tmp_path) -> None:
    cold = run_step(tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert cold.stdout.startswith("backend numba, loss ")
    assert cold.stderr.count(COMPILE_NOTICE) == 1, cold.stderr
    assert any((tmp_path / "numba").rglob("*.nbi"))  # the kernels went to the fresh cache

    warm = run_step(tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout
    assert COMPILE_NOTICE not in warm.stderr, warm.stderr
