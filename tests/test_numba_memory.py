"""glibc's malloc thresholds set by the Numba backend (``numba/memory.py``), each case in
a fresh subprocess: the setting is process-wide and made once."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Frees three 2 MB arrays at a time (6 MB of free heap top, over glibc's default trim
# limit once its mmap threshold has risen to 2 MB) and counts the page faults of the
# later rounds: with the thresholds set, the arrays reuse the same memory.
SCRIPT = """
import json, resource
import numpy as np
from tensorcore.backends.numba import memory
from tensorcore.backends.numba.backend import NumbaBackend

def faults_per_round():
    for _ in range(5):
        arrays = [np.ones(1 << 19, np.float32) for _ in range(3)]
        del arrays
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        arrays = [np.ones(1 << 19, np.float32) for _ in range(3)]
        del arrays
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 20

before = faults_per_round()
NumbaBackend()
print("REPORT " + json.dumps({"applied": memory.configure(), "before": before,
                              "after": faults_per_round()}))
"""


def run(env: dict[str, str]) -> dict:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    full_env.update(env, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=full_env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="sets glibc's malloc only")
def test_backend_keeps_freed_arrays_mapped():
    report = run({})
    assert report["applied"] is True
    assert report["before"] > 500  # most of the 3 x 512 pages faulted in again every round
    assert report["after"] < 50


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="sets glibc's malloc only")
def test_malloc_settings_from_the_environment_stand():
    report = run({"MALLOC_TRIM_THRESHOLD_": str(1 << 20)})
    assert report["applied"] is False
    assert report["after"] > 500  # the user's small trim limit still returns the memory
