"""Absurd sizes are refused with a ValueError naming the op, before anything is allocated.

The bombs run in one subprocess under a 4 GiB address-space limit, so a regression fails
the test (MemoryError or a killed child) instead of exhausting the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import tensorcore as tc
import tensorcore.functional as F
from layers import Upsample

BOMBS = textwrap.dedent("""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import tensorcore as tc
    import tensorcore.functional as F
    from layers import Upsample
    from tensorcore.ops import broadcast_to
    x = tc.randn(1, 1, 4, 4)
    w = tc.randn(1, 1, 3, 3)
    huge = 2 ** 40
    cases = {
        "interpolate": [lambda: F.interpolate(x, scale_factor=1e9), lambda: F.interpolate(x, size=(huge, huge)),
                        lambda: Upsample(scale_factor=1e9)(x)],
        "zeros": [lambda: tc.zeros(huge, huge)], "ones": [lambda: tc.ones((huge, huge))],
        "empty": [lambda: tc.empty(huge, huge)], "full": [lambda: tc.full((huge, huge), 1.0)],
        "randn": [lambda: tc.randn(huge, huge)], "rand": [lambda: tc.rand(huge, huge)],
        "randint": [lambda: tc.randint(0, 9, (huge, huge))], "arange": [lambda: tc.arange(0, 10 ** 18)],
        "linspace": [lambda: tc.linspace(0, 1, huge)], "eye": [lambda: tc.eye(huge)],
        "expand": [lambda: x.expand(huge, huge, 4, 4), lambda: broadcast_to(x, (huge, huge, 4, 4))],
        "repeat": [lambda: x.repeat(huge, huge, 1, 1)], "pad": [lambda: F.pad(x, (0, huge, 0, huge))],
        "conv_transpose2d": [lambda: F.conv_transpose2d(x, w, stride=huge)],
    }
    for op, calls in cases.items():
        for call in calls:
            try:
                call()
            except ValueError as exc:
                assert str(exc).startswith(op + ":"), (op, str(exc))
            else:
                raise AssertionError(f"{op}: an absurd size was not refused")
    print("refused", sum(map(len, cases.values())))
""")


def test_absurd_sizes_are_refused_before_allocating():
    result = subprocess.run([sys.executable, "-c", BOMBS], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "NUMBA_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("refused 18"), result.stdout


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), 0, -2.0, "2", (2.0,)])
def test_bad_scale_factors_name_the_op(factor):
    x = tc.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="^interpolate: scale_factor"):
        F.interpolate(x, scale_factor=factor)
    with pytest.raises(ValueError, match="^Upsample: scale_factor"):
        Upsample(scale_factor=factor)


def test_sizes_within_memory_still_allocate():
    x = tc.randn(1, 2, 3, 3)
    assert F.interpolate(x, scale_factor=1.5).shape == (1, 2, 4, 4)
    assert tc.arange(0, 1, 0.25).shape == (4,) and tc.eye(2, 3).shape == (2, 3)
    assert x.repeat(2, 1, 1, 1).shape == (2, 2, 3, 3) and F.pad(x, (1, 1)).shape == (1, 2, 3, 5)
    with pytest.raises(ValueError, match="^arange: start, end and step must be finite"):
        tc.arange(0, float("inf"))
